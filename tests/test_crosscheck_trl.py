"""minigrpo's loss, advantages and gradients equal TRL's own code on one fixed rollout batch (skips without trl),
and the shared-prompt fast path equals the plain path."""

import importlib.util

import pytest
import torch

from minigrpo import GRPOConfig
from minigrpo.logprobs import batched_per_token_logps, per_token_logps
from minigrpo.measuring.crosscheck import crosscheck, trl_config
from minigrpo.rollout import completion_logps, generate_completions, sample_group_rollout, tokenize_prompts


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (the bench extra)")
@pytest.mark.parametrize("use_bias_correction_kl", [False, True], ids=["paper_kl", "bias_corrected_kl"])
def test_loss_advantages_and_gradients_match_trl_for_each_loss_type(use_bias_correction_kl):
    diffs = crosscheck(
        "tiny", prompts=2, generations=4, max_completion_length=24, beta=0.04, verbose=True,
        use_bias_correction_kl=use_bias_correction_kl,
    )  # fmt: skip
    assert diffs["kl"] > 1e-5  # the policy really differs from the reference: the KL term is tested
    assert diffs["advantages"] <= 1e-5
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for regime in ("on_policy", "off_policy"):
            assert diffs[f"{loss_type}/{regime}"] <= 1e-5, (loss_type, regime, diffs)
            assert diffs[f"grad/{loss_type}/{regime}"] <= 1e-4, (loss_type, regime, diffs)


def test_shared_prompt_logps_and_gradients_equal_the_plain_path(tiny, train_dataset, small_config):
    model, tokenizer = tiny
    config = small_config.replace(beta=0.0)
    torch.manual_seed(0)
    rollout = sample_group_rollout(model, tokenizer, train_dataset["prompt"][:4], config)
    T = rollout.completion_ids.shape[1]

    def logps_and_grads(compute):
        model.zero_grad(set_to_none=True)
        logps, entropy = compute()
        (logps * rollout.completion_mask).sum().backward()
        return logps.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    plain = logps_and_grads(lambda: per_token_logps(model, rollout.input_ids, rollout.attention_mask, T))
    G = config.num_generations  # whole groups: each prompt runs once
    shared = logps_and_grads(
        lambda: per_token_logps(model, rollout.input_ids, rollout.attention_mask, T, num_generations=G)
    )
    mask = rollout.completion_mask.bool()
    assert torch.allclose(plain[0][mask], shared[0][mask], atol=1e-4)
    assert torch.allclose(plain[1][mask], shared[1][mask], atol=1e-4)
    for g_plain, g_shared in zip(plain[2], shared[2], strict=True):
        assert torch.allclose(g_plain, g_shared, atol=1e-4, rtol=1e-3)
    # the switch: completion_logps takes the shared path only for whole groups, else the plain one
    on = completion_logps(model, rollout, config.replace(share_prompt_prefix=True))[0]
    off = completion_logps(model, rollout, config.replace(share_prompt_prefix=False))[0]
    assert torch.allclose(on[mask], off[mask], atol=1e-4)
    # the no-grad batched version (old / reference log-probs): whole groups shared, a ragged last batch plain
    for batch_size in (2 * G, 3):
        batched = batched_per_token_logps(
            model, rollout.input_ids, rollout.attention_mask, T, batch_size, num_generations=G
        )
        assert torch.allclose(batched[mask], plain[0][mask], atol=1e-4)


def test_generation_from_a_shared_prompt_cache_equals_plain_generation(tiny, train_dataset, small_config):
    model, tokenizer = tiny
    G = 4
    prompts = [p for p in train_dataset["prompt"][:3] for _ in range(G)]
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, small_config.max_prompt_length, "cpu")
    plain = generate_completions(model, tokenizer, prompt_ids, prompt_mask, small_config, greedy=True)
    shared = generate_completions(
        model, tokenizer, prompt_ids, prompt_mask, small_config, greedy=True, num_generations=G
    )
    assert torch.equal(plain, shared)


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (the bench extra)")
@pytest.mark.parametrize(
    ("schedule", "warmup", "theirs"),
    [("constant", 0, "constant"), ("constant", 3, "constant_with_warmup"), ("linear", 0, "linear"),
     ("linear", 3, "linear"), ("cosine", 0.25, "cosine")],
)  # fmt: skip
def test_trl_config_maps_the_schedule(schedule, warmup, theirs, tmp_path):
    # transformers' "constant" ignores warm-up; minigrpo's warms up from 0 in both schedules
    config = GRPOConfig.tiny_cpu(lr_scheduler_type=schedule, warmup_steps=warmup, max_steps=10)
    mapped = trl_config(config, "cpu", str(tmp_path))
    assert (str(mapped.lr_scheduler_type).split(".")[-1].lower(), mapped.warmup_steps) == (theirs, warmup)
    assert mapped.bf16 is False

"""Stage 1: group sampling, padding, EOS masks, old and reference log-probs."""

import torch

from minigrpo.config import GRPOConfig
from minigrpo.models import make_reference_model
from minigrpo.rollout import (
    completion_mask_from_eos,
    generation_config_for,
    repeat_for_group,
    sample_group_rollout,
    tokenize_prompts,
)


def test_repeat_is_group_major():
    assert repeat_for_group(["a", "b"], 3) == ["a", "a", "a", "b", "b", "b"]


def test_mask_stops_at_first_eos_and_keeps_it():
    ids = torch.tensor([[5, 6, 2, 0, 0], [2, 0, 0, 0, 0], [5, 6, 7, 8, 9], [5, 2, 6, 2, 0]])
    mask, truncated = completion_mask_from_eos(ids, eos_ids=[2, 0])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert truncated.tolist() == [False, False, True, False]  # only the one without EOS


def test_prompts_are_left_padded(tiny):
    model, tokenizer = tiny
    ids, mask = tokenize_prompts(tokenizer, ["12", "12345"], 32, "cpu")
    assert mask.tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 1, 1]]
    assert ids[0, :3].tolist() == [tokenizer.pad_token_id] * 3


def test_too_long_prompt_is_a_clear_error(tiny):
    _, tokenizer = tiny
    try:
        tokenize_prompts(tokenizer, ["x" * 40], 10, "cpu")
    except ValueError as error:
        assert "max_prompt_length=10" in str(error) and "at least 40" in str(error)
    else:
        raise AssertionError("expected a ValueError")


def test_sampling_ignores_the_models_own_top_k_and_penalties(tiny):
    model, tokenizer = tiny
    model.generation_config.top_k = 20  # as Qwen2.5-Instruct ships
    model.generation_config.repetition_penalty = 1.05
    generation = generation_config_for(GRPOConfig(), model, tokenizer)
    assert generation.do_sample and generation.top_k == 0 and generation.repetition_penalty == 1.0


def test_rollout_shapes_masks_and_logps(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(prompts_per_step=3, num_generations=4, per_device_train_batch_size=4, num_iterations=2)
    torch.manual_seed(0)
    rollout = sample_group_rollout(model, tokenizer, train_dataset["prompt"][:3], config, make_reference_model(model))
    N, T = 12, rollout.completion_ids.shape[1]
    assert rollout.prompt_ids.shape[0] == N and T <= config.max_completion_length
    assert len(rollout.completions) == N
    # group-major: rows 0-3 share prompt 0
    assert (rollout.prompt_ids[0] == rollout.prompt_ids[3]).all()
    assert not (rollout.prompt_ids[3] == rollout.prompt_ids[4]).all()
    # with no update yet, old == reference == current policy
    assert rollout.old_per_token_logps.shape == rollout.ref_per_token_logps.shape == (N, T)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.old_per_token_logps[mask], rollout.ref_per_token_logps[mask], atol=1e-5, rtol=0)
    # decoded text is the masked tokens only
    ids = rollout.completion_id_lists()
    assert [len(i) for i in ids] == rollout.completion_mask.sum(1).tolist()


def test_no_extra_forward_passes_when_on_policy_and_beta_zero(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(prompts_per_step=2, num_generations=2, per_device_train_batch_size=4, beta=0.0)
    rollout = sample_group_rollout(model, tokenizer, train_dataset["prompt"][:2], config)
    assert rollout.old_per_token_logps is None and rollout.ref_per_token_logps is None


def test_completions_that_hit_max_length_are_truncated(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(
        prompts_per_step=2, num_generations=2, per_device_train_batch_size=4, max_completion_length=3, beta=0.0
    )
    rollout = sample_group_rollout(model, tokenizer, train_dataset["prompt"][:2], config)
    assert rollout.completion_ids.shape[1] == 3
    assert rollout.is_truncated.all()  # "<answer>..." cannot end in 3 characters
    assert (rollout.completion_mask == 1).all()

"""minigrpo.course.variants: the variants as config fields, loss weights off autograd, DAPO's filter."""

import pytest
import torch

from minigrpo import GRPOConfig, correctness_reward, group_relative_advantages, grpo_loss
from minigrpo.course.variants import (
    VARIANTS,
    DynamicSamplingGRPOTrainer,
    config_diff,
    dynamic_sampling_mask,
    per_token_gradient_weights,
    select_completions,
    variant_config,
)
from minigrpo.rollout import Rollout
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_REWARDS

# four groups of G = 8: the worked example, all correct, all wrong, one lucky success
FOUR_GROUPS = torch.tensor([list(WORKED_EXAMPLE_REWARDS), [2.0] * 8, [0.0] * 8, [1.0] * 7 + [2.0]])


def test_variant_configs_change_only_their_fields():
    base = GRPOConfig.tiny_cpu()
    assert config_diff(variant_config("GRPO", base), base) == {}
    assert config_diff(variant_config("Dr. GRPO", base), base) == {"scale_rewards": "none", "loss_type": "dr_grpo"}
    dapo = variant_config("DAPO", base)
    assert (dapo.loss_type, dapo.clip_epsilon_high, dapo.mask_truncated_completions, dapo.beta) == (
        "dapo",
        0.28,
        True,
        0.0,
    )
    assert variant_config("GSPO", base).importance_sampling_level == "sequence"
    assert variant_config("RLOO", base).baseline == "rloo"
    assert [name for name, v in VARIANTS.items() if v.dynamic_sampling] == ["DAPO"]
    assert dapo.dynamic_sampling and dapo.max_num_gen_batches == 10
    with pytest.raises(ValueError, match="unknown variant"):
        variant_config("PPO", base)


def test_per_token_gradient_weights_hand_computed():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])  # lengths 2 and 4, T_max = 4, N = 2
    expected = {
        "grpo": [[1 / 4, 1 / 4, 0, 0], [1 / 8] * 4],  # 1 / (N |o_i|)
        "bnpo": [[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4],  # 1 / (2 + 4 tokens)
        "dapo": [[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4],
        "dr_grpo": [[1 / 8, 1 / 8, 0, 0], [1 / 8] * 4],  # 1 / (N T_max)
    }
    for loss_type, weights in expected.items():
        got = per_token_gradient_weights(mask, loss_type, max_completion_length=4)
        torch.testing.assert_close(got, torch.tensor(weights), atol=1e-7, rtol=0)


def test_dynamic_sampling_mask_keeps_groups_with_signal():
    assert dynamic_sampling_mask(FOUR_GROUPS).tolist() == [True, False, False, True]
    with pytest.raises(AssertionError):
        dynamic_sampling_mask(FOUR_GROUPS.flatten())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_filtering_zero_std_groups_only_rescales_the_gradient(loss_type):
    """beta = 0: dropped groups have A = 0, so the kept rows' gradient is the full one times
    N / n_kept (grpo: mean over completions) or tokens / kept tokens (dapo: mean over tokens)."""
    torch.manual_seed(0)
    B, G, T = FOUR_GROUPS.shape[0], FOUR_GROUPS.shape[1], 5
    config = GRPOConfig(num_generations=G, prompts_per_step=B, per_device_train_batch_size=B * G)
    config = config.replace(beta=0.0, loss_type=loss_type)
    advantages = group_relative_advantages(FOUR_GROUPS).flatten()  # (N,)
    lengths = torch.randint(1, T + 1, (B * G,))
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()  # (N, T)
    rows = dynamic_sampling_mask(FOUR_GROUPS).repeat_interleave(G)  # (N,)

    def gradient(logps, adv, m):
        logps = logps.clone().requires_grad_(True)
        loss, _ = grpo_loss(logps, None, None, adv, m, config)
        loss.backward()
        return logps.grad

    logps = torch.randn(B * G, T)
    full = gradient(logps, advantages, mask)
    kept = gradient(logps[rows], advantages[rows], mask[rows])
    assert full[~rows].abs().max() == 0  # zero-advantage groups contribute nothing
    scale = rows.numel() / rows.sum() if loss_type == "grpo" else mask.sum() / mask[rows].sum()
    torch.testing.assert_close(kept, full[rows] * scale, atol=1e-6, rtol=1e-5)


def _rollout(N=4, P=3, T=2, with_logps=True):
    logps = torch.arange(N * T, dtype=torch.float32).view(N, T) if with_logps else None
    return Rollout(
        prompt_ids=torch.arange(N * P).view(N, P),
        prompt_mask=torch.ones(N, P, dtype=torch.long),
        completion_ids=torch.arange(N * T).view(N, T),
        completion_mask=torch.ones(N, T, dtype=torch.long),
        is_truncated=torch.tensor([False, True, False, True])[:N],
        completions=[f"c{i}" for i in range(N)],
        old_per_token_logps=logps,
        ref_per_token_logps=None,
    )


def test_select_completions_keeps_the_chosen_rows_in_order():
    rows = torch.tensor([False, True, False, True])
    picked = select_completions(_rollout(), rows)
    assert picked.completions == ["c1", "c3"]
    assert picked.prompt_ids.tolist() == [[3, 4, 5], [9, 10, 11]]
    assert picked.completion_ids.tolist() == [[2, 3], [6, 7]]
    assert picked.old_per_token_logps.tolist() == [[2.0, 3.0], [6.0, 7.0]]
    assert picked.ref_per_token_logps is None
    assert picked.is_truncated.tolist() == [True, True]
    with pytest.raises(AssertionError):
        select_completions(_rollout(), torch.tensor([0, 1, 0, 1]))


def test_dynamic_sampling_trainer_needs_equal_micro_batches(tiny, train_dataset, small_config):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="divisor of num_generations=4, or to N = 16"):
        DynamicSamplingGRPOTrainer(
            model, [correctness_reward], args=small_config, train_dataset=train_dataset, processing_class=tokenizer
        )


def test_dynamic_sampling_trainer_skips_steps_without_signal(tiny, train_dataset, small_config):
    """A constant reward: every group of every round is dropped, nothing is learned, no NaN."""
    model, tokenizer = tiny
    config = small_config.replace(
        per_device_train_batch_size=16,
        beta=0.0,
        max_steps=2,
        save_steps=0,
        max_num_gen_batches=2,
        max_completion_length=8,
    )
    before = [p.detach().clone() for p in model.parameters()]
    constant = lambda prompts, completions, **kw: [1.0] * len(completions)
    history = DynamicSamplingGRPOTrainer(
        model, [constant], args=config, train_dataset=train_dataset, processing_class=tokenizer
    ).train()
    assert [m["dynamic_sampling/kept_fraction"] for m in history] == [0.0, 0.0]
    assert [m["dynamic_sampling/rounds"] for m in history] == [config.max_num_gen_batches] * 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

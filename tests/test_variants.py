"""minigrpo.course.variants: the variants as config fields, loss weights off autograd; DAPO's refill in the trainer."""

import pytest
import torch

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.course.variants import (
    VARIANTS,
    config_diff,
    per_token_gradient_weights,
    soft_punish_cache,
    variant_config,
    variant_reward_funcs,
)
from minigrpo.tasks.arithmetic import correctness_reward, format_reward


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


def test_dapo_adds_its_soft_overlong_punishment_and_no_other_variant_does():
    config = GRPOConfig.tiny_cpu(reward_weights=[1.0, 0.1])  # max_completion_length 24
    assert soft_punish_cache("DAPO", config) == 3  # an eighth of 24: the ramp covers lengths 22, 23, 24
    funcs, weights = variant_reward_funcs("DAPO", config)
    assert funcs[:2] == [correctness_reward, format_reward] and weights == [1.0, 0.1, 1.0]
    ids = [[0] * n for n in (20, 21, 22, 23, 24)]  # completion_ids of 20..24 tokens, EOS included
    assert funcs[2](completion_ids=ids) == pytest.approx([0.0, 0.0, -1 / 3, -2 / 3, -1.0])
    for name in ("GRPO", "Dr. GRPO", "GSPO", "RLOO"):
        assert variant_reward_funcs(name, config) == ([correctness_reward, format_reward], [1.0, 0.1])
    assert variant_reward_funcs("DAPO", config.replace(reward_weights=None), [correctness_reward])[1] == [1.0, 1.0]
    with pytest.raises(ValueError, match="2 entries for 1 reward functions"):
        variant_reward_funcs("DAPO", config, [correctness_reward])
    with pytest.raises(ValueError, match="unknown variant"):
        variant_reward_funcs("PPO", config)


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


def test_dynamic_sampling_needs_equal_micro_batches(small_config):
    with pytest.raises(ValueError, match="divisor of num_generations=4, or to N = 16"):
        small_config.replace(dynamic_sampling=True)


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
    trained = GRPOTrainer(
        model,
        [constant],
        args=config.replace(dynamic_sampling=True),
        train_dataset=train_dataset,
        processing_class=tokenizer,
    )
    trained.train()
    history = trained.state.log_history
    assert [m["dynamic_sampling/kept_fraction"] for m in history] == [0.0, 0.0]
    assert [m["dynamic_sampling/rounds"] for m in history] == [config.max_num_gen_batches] * 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

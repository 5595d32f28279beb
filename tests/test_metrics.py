"""minigrpo.run.metrics: the zero-std split, advantages/std and distinct completions, on hand-computed groups."""

import math

import pytest
import torch

from minigrpo.advantages import group_relative_advantages
from minigrpo.rewards import compute_rewards
from minigrpo.rollout import Rollout
from minigrpo.run.metrics import (
    advantage_metrics,
    average_metrics,
    completion_metrics,
    distinct_per_group,
    reward_metrics,
    zero_std_kinds,
)
from minigrpo.tasks.arithmetic import REWARD_WEIGHTS, WORKED_EXAMPLE_REWARDS, correctness_reward, format_reward

REWARD_FUNCS = [correctness_reward, format_reward]


def scored(completions, answers, weights=REWARD_WEIGHTS):
    """(rewards_per_func (N, 2), rewards (N,)) of the arithmetic task's two reward functions."""
    return compute_rewards(REWARD_FUNCS, [None] * len(completions), completions, [[]] * len(completions),
                           {"answer": answers}, weights)  # fmt: skip


# --- frac_reward_zero_std and its two parts -------------------------------------------------
def test_zero_std_kinds_on_hand_made_groups():
    # weights 1 / 0.1: right and formatted 1.1, right 1.0, formatted 0.1, neither 0
    rewards = torch.tensor(
        [
            [1.1, 1.1, 1.1, 1.1],  # all right: all_correct
            [0.1, 0.1, 0.1, 0.1],  # all wrong but formatted: all_wrong (a total above 0 is not "correct")
            [0.0, 0.0, 0.0, 0.0],  # all wrong: all_wrong
            [1.0, 1.0, 1.0, 1.0],  # all right, none formatted: all_correct
            [1.1, 0.1, 1.0, 0.0],  # a signal: neither
        ]
    )  # (B, G) = (5, 4)
    accuracy = (rewards >= 1.0).float()  # (5, 4)
    all_correct, all_wrong = zero_std_kinds(rewards, accuracy)
    assert all_correct.tolist() == [True, False, False, True, False]
    assert all_wrong.tolist() == [False, True, True, False, False]


def test_a_tie_with_different_components_is_zero_std_and_counts_as_all_correct():
    # weights 1 / 1: a right unformatted answer (1 + 0) ties a wrong formatted one (0 + 1)
    per_func, rewards = scored(["19", "<answer>18</answer>"], ["19", "19"], weights=(1.0, 1.0))
    assert rewards.tolist() == [1.0, 1.0] and per_func[:, 0].tolist() == [1.0, 0.0]
    metrics = reward_metrics(per_func, rewards, REWARD_FUNCS, num_generations=2)
    assert metrics["frac_reward_zero_std"] == 1.0
    assert metrics["frac_reward_zero_std/all_correct"] == 1.0 and metrics["frac_reward_zero_std/all_wrong"] == 0.0
    # at the task's weights 1 / 0.1 the same two answers differ (1.0 vs 0.1): not zero-std at all
    per_func, rewards = scored(["19", "<answer>18</answer>"], ["19", "19"])
    metrics = reward_metrics(per_func, rewards, REWARD_FUNCS, num_generations=2)
    assert metrics["frac_reward_zero_std"] == metrics["frac_reward_zero_std/all_correct"] == 0.0


def test_reward_metrics_split_adds_up_with_g_2():
    completions = [
        "<answer>19</answer>", "<answer>19</answer>",  # 1.1, 1.1: all correct
        "<answer>18</answer>", "18",  # 0.1, 0.0: a signal
        "nope", "<answer>nineteen</answer>",  # 0.0, 0.0: all wrong
        "<answer>7</answer>", "<answer>8</answer>",  # 0.1, 0.1: all wrong (formatted)
    ]  # fmt: skip
    answers = ["19"] * 6 + ["9", "9"]
    per_func, rewards = scored(completions, answers)
    assert rewards.tolist() == pytest.approx([1.1, 1.1, 0.1, 0.0, 0.0, 0.0, 0.1, 0.1])
    metrics = reward_metrics(per_func, rewards, REWARD_FUNCS, num_generations=2)
    assert metrics["frac_reward_zero_std"] == 0.75
    assert metrics["frac_reward_zero_std/all_correct"] == 0.25
    assert metrics["frac_reward_zero_std/all_wrong"] == 0.5


def test_an_accuracy_reward_of_none_is_not_correct():
    def accuracy_or_none(prompts, completions, completion_ids=None, **columns):
        return [None] * len(completions)

    per_func, rewards = compute_rewards([accuracy_or_none, format_reward], [None] * 2, ["<answer>1</answer>"] * 2,
                                        [[]] * 2, {}, (1.0, 0.1))  # fmt: skip
    assert per_func[:, 0].isnan().all() and rewards.tolist() == pytest.approx([0.1, 0.1])
    metrics = reward_metrics(per_func, rewards, [accuracy_or_none, format_reward], num_generations=2)
    assert metrics["frac_reward_zero_std/all_wrong"] == 1.0 and metrics["frac_reward_zero_std/all_correct"] == 0.0


def test_zero_std_kinds_refuses_mismatched_shapes():
    with pytest.raises(AssertionError, match=r"must both be \(B, G\)"):
        zero_std_kinds(torch.zeros(2, 4), torch.zeros(8))


# --- advantages/std -------------------------------------------------------------------------
WORKED_STD = math.sqrt(4.875 / 7)  # Bessel std of 2/1/0/2/0/1/0/1: squared deviations from 0.875 sum to 4.875


def test_advantage_std_is_one_per_informative_group_and_zero_for_a_constant_one():
    grouped = torch.tensor([list(WORKED_EXAMPLE_REWARDS), [1.0] * 8])  # (2, 8)
    advantages = group_relative_advantages(grouped).flatten()  # (16,)
    metrics = advantage_metrics(advantages, num_generations=8)
    one = WORKED_STD / (WORKED_STD + 1e-4)  # std((r - mean) / (std + eps)) = std / (std + eps)
    assert metrics["advantages/std"] == pytest.approx((one + 0.0) / 2, abs=1e-6)
    assert metrics["advantages/abs_mean"] == pytest.approx(5.25 / (WORKED_STD + 1e-4) / 16, abs=1e-6)


def test_advantage_std_without_scaling_is_the_reward_std_and_rloo_scales_it():
    grouped = torch.tensor([list(WORKED_EXAMPLE_REWARDS)])  # (1, 8)
    dr_grpo = group_relative_advantages(grouped, scale_rewards="none").flatten()
    assert advantage_metrics(dr_grpo, 8)["advantages/std"] == pytest.approx(WORKED_STD, abs=1e-6)
    rloo = group_relative_advantages(grouped, scale_rewards="none", baseline="rloo").flatten()
    assert advantage_metrics(rloo, 8)["advantages/std"] == pytest.approx(8 / 7 * WORKED_STD, abs=1e-6)


def test_advantage_std_uses_the_scaling_ddof_and_works_with_g_2():
    grouped = torch.tensor([list(WORKED_EXAMPLE_REWARDS)])  # (1, 8)
    population = group_relative_advantages(grouped, ddof=0).flatten()
    assert advantage_metrics(population, 8, ddof=0)["advantages/std"] == pytest.approx(1.0, abs=2e-4)
    assert advantage_metrics(population, 8, ddof=1)["advantages/std"] == pytest.approx(math.sqrt(8 / 7), abs=2e-4)
    pair = group_relative_advantages(torch.tensor([[1.0, 0.0], [0.0, 0.0]])).flatten()  # (4,): +-0.7070, then 0, 0
    assert advantage_metrics(pair, 2)["advantages/std"] == pytest.approx(0.5, abs=1e-3)


# --- distinct completions per group -------------------------------------------------------------
def test_distinct_per_group_counts_token_sequences():
    ids = [[1, 2, 3], [1, 2, 3], [1, 2], [4], [5], [5], [5], [5]]
    assert distinct_per_group(ids, 2).tolist() == [1, 2, 1, 1]
    assert distinct_per_group(ids, 4).tolist() == [3, 1]
    assert distinct_per_group(ids, 8).tolist() == [4]
    with pytest.raises(ValueError, match="multiple of num_generations"):
        distinct_per_group(ids, 3)


def rollout_of(completion_ids, completion_mask, is_truncated):
    n = len(completion_ids)
    return Rollout(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.tensor(completion_ids),
        completion_mask=torch.tensor(completion_mask),
        is_truncated=torch.tensor(is_truncated),
        completions=[""] * n,
    )


def test_completion_metrics_ignore_padding_but_not_eos():
    EOS = 9
    rollout = rollout_of(
        [
            [5, 7, EOS, 0, 0],  # group 0: the same answer twice, different garbage after the mask
            [5, 7, EOS, 3, 3],
            [5, 7, EOS, 0, 0],  # group 1: ended, and cut off before its EOS: different completions
            [5, 7, 8, 8, 8],
        ],
        [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]],
        [False, False, False, True],
    )
    metrics = completion_metrics(rollout, num_generations=2)
    assert metrics["completions/distinct_per_group"] == 1.5  # (1 + 2) / 2
    assert metrics["completions/mean_length"] == 3.5 and metrics["completions/clipped_ratio"] == 0.25


def test_averaging_over_logged_generations_keeps_the_split_summing_to_the_total():
    rows = [
        {"frac_reward_zero_std": 0.5, "frac_reward_zero_std/all_correct": 0.0, "frac_reward_zero_std/all_wrong": 0.5},
        {"frac_reward_zero_std": 1.0, "frac_reward_zero_std/all_correct": 0.75, "frac_reward_zero_std/all_wrong": 0.25},
    ]
    mean = average_metrics(rows)
    assert mean["frac_reward_zero_std/all_correct"] + mean["frac_reward_zero_std/all_wrong"] == 0.75

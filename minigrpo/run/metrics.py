"""The numbers a training step logs, under TRL's names: rewards, group statistics, completion lengths.

Four of them are minigrpo's own, beside TRL's, to tell why a step had little signal:

metric                               | what it is
-------------------------------------|----------------------------------------------------------------------
frac_reward_zero_std                 | (TRL's) groups whose G total rewards are all equal: zero advantage
frac_reward_zero_std/all_correct     | those in which some completion is correct (for a 0/1 accuracy: all)
frac_reward_zero_std/all_wrong       | those in which no completion is correct; the two add up to the total
advantages/std                       | the std of the advantages within each group, averaged over groups
completions/distinct_per_group       | how many different completions (token sequences) a group holds, 1..G

"Correct" is read from the accuracy reward, the one eval_accuracy reports (rewards.accuracy_reward_index: the
function marked is_accuracy_reward, else the one named correctness_reward or accuracy_reward, else the first,
whatever the order of reward_funcs), and a completion is correct when that function scored it above 0.
PPO logs them too, except advantages/std: its advantages are per token (GAE), not per group.
"""

from __future__ import annotations

import torch

from minigrpo.advantages import group_rewards, zero_std_groups
from minigrpo.rewards import accuracy_reward_index, reward_func_name
from minigrpo.rollout import Rollout


# --- metrics (TRL's names) ----------------------------------------------------------
def reward_metrics(rewards_per_func: torch.Tensor, rewards: torch.Tensor, reward_funcs, num_generations: int) -> dict:
    """reward, reward_std (mean of the group stds), rewards/<fn>/mean|std, frac_reward_zero_std and its two parts.

    rewards_per_func: (N, F), NaN where a function returned None; the accuracy reward's column is
    accuracy_reward_index(reward_funcs). rewards: (N,) the weighted sum the advantages are computed from.
    """
    accuracy = rewards_per_func[:, accuracy_reward_index(reward_funcs)].float()  # (N,)
    grouped = group_rewards(rewards.float(), num_generations)  # (B, G)
    grouped_accuracy = group_rewards(accuracy, num_generations)  # (B, G)
    all_correct, all_wrong = zero_std_kinds(grouped, grouped_accuracy)  # (B,), (B,)
    metrics = {
        "reward": rewards.mean().item(),
        "reward_std": grouped.std(dim=1).mean().item(),
        "frac_reward_zero_std": zero_std_groups(grouped).float().mean().item(),
        "frac_reward_zero_std/all_correct": all_correct.float().mean().item(),
        "frac_reward_zero_std/all_wrong": all_wrong.float().mean().item(),
    }
    for f, func in enumerate(reward_funcs):
        name = reward_func_name(func)
        metrics[f"rewards/{name}/mean"] = rewards_per_func[:, f].nanmean().item()
        metrics[f"rewards/{name}/std"] = _nanstd(rewards_per_func[:, f])
    return metrics


def zero_std_kinds(grouped_rewards: torch.Tensor, grouped_accuracy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the zero-std groups into all-correct (the prompt is too easy) and all-wrong (too hard).

    Symbol            | Shape  | Description
    ------------------|--------|------------------------------------------------------------
    grouped_rewards   | (B, G) | total (weighted) rewards; a group is zero-std when they are all equal
    grouped_accuracy  | (B, G) | the accuracy reward of each completion (NaN: not scored, not correct)
    returns           | (B,)   | all_correct, (B,) all_wrong: disjoint, together exactly the zero-std groups

    all_wrong: no completion of the group is correct (accuracy reward > 0): no answer to reinforce.
    all_correct: the other zero-std groups. With a 0/1 accuracy worth more than the other rewards together
    (the arithmetic task: 1.0 for the right number, 0.1 for the format) equal totals mean equal correctness,
    so these are exactly the groups where every completion is right. With other weights a group can tie with
    different components (right but unformatted = wrong but formatted, at weights 1 and 1); it counts as
    all_correct: the prompt is within reach, the reward just cannot tell its answers apart.
    """
    assert grouped_rewards.shape == grouped_accuracy.shape and grouped_rewards.dim() == 2, (
        f"grouped_rewards {tuple(grouped_rewards.shape)} and grouped_accuracy {tuple(grouped_accuracy.shape)} "
        "must both be (B, G)"
    )
    zero_std = zero_std_groups(grouped_rewards)  # (B,)
    none_correct = ~(grouped_accuracy > 0).any(dim=1)  # (B,): NaN > 0 is False
    return zero_std & ~none_correct, zero_std & none_correct


def advantage_metrics(advantages: torch.Tensor, num_generations: int, ddof: int = 1) -> dict:
    """advantages/abs_mean (over completions) and advantages/std (within each group, averaged over groups).

    advantages: (N,) one per completion, group-major. ddof: as the scaling's (config.std_ddof).
    advantages/std is a mean of group stds, like reward_std, so the two read side by side: reward_std is the
    spread before scaling, advantages/std after. With scale_rewards="group" every group with a signal has
    std exactly 1 (up to eps) and a zero-std group 0, so it reads 1 - frac_reward_zero_std; with "none"
    (Dr. GRPO) or "batch" it is the size of the signal; RLOO multiplies it by G / (G - 1).
    """
    assert advantages.dim() == 1, f"advantages must be (N,), got {tuple(advantages.shape)}"
    grouped = group_rewards(advantages.detach().float(), num_generations)  # (B, G)
    return {
        "advantages/abs_mean": advantages.abs().mean().item(),
        "advantages/std": grouped.std(dim=1, correction=ddof).mean().item(),
    }


def completion_metrics(rollout: Rollout, num_generations: int) -> dict:
    """completions/mean_length, min/max_length, clipped_ratio (truncated), mean_terminated_length,
    distinct_per_group; with tools, the lengths count the model's tokens only (as TRL's), and tools/* are added."""
    lengths = rollout.trained_mask.sum(1).float()  # (N,)
    terminated = lengths[~rollout.is_truncated]
    distinct = distinct_per_group(rollout.completion_id_lists(), num_generations)  # (B,)
    metrics = {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": rollout.is_truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item() if terminated.numel() else 0.0,
        "completions/distinct_per_group": distinct.float().mean().item(),
    }
    if rollout.tool_calls is not None:
        calls, failures = int(rollout.tool_calls.sum()), int(rollout.tool_failures.sum())
        metrics |= tool_call_metrics(calls, failures, len(rollout.tool_calls))
    return metrics


def tool_call_metrics(calls: int, failures: int, num_completions: int, prefix: str = "") -> dict:
    """TRL's tool metrics: tools/call_frequency, the calls per completion (an episode may make several), and
    tools/failure_frequency, the share of calls whose result was an error (0 when none was made)."""
    return {
        f"{prefix}tools/call_frequency": calls / max(num_completions, 1),
        f"{prefix}tools/failure_frequency": failures / calls if calls else 0.0,
    }


def distinct_per_group(completion_ids: list[list[int]], num_generations: int) -> torch.Tensor:
    """The number of different completions in each group, 1..G. N lists of token ids (no padding) -> (B,).

    Token sequences, not texts: two completions differ when any token does, EOS included (a truncated
    answer is not the same as one that ended). A group that falls to 1 samples the same answer G times:
    it has zero std whatever the reward, and the policy has stopped exploring that prompt.
    """
    if len(completion_ids) % num_generations != 0:
        raise ValueError(
            f"{len(completion_ids)} completions cannot be split into groups of G={num_generations}: "
            "N must be a multiple of num_generations."
        )
    groups = [
        completion_ids[start : start + num_generations] for start in range(0, len(completion_ids), num_generations)
    ]
    return torch.tensor([len({tuple(ids) for ids in group}) for group in groups])  # (B,)


def _nanstd(values: torch.Tensor) -> float:
    values = values[~values.isnan()]
    return values.std().item() if values.numel() > 1 else 0.0


def average_metrics(rows: list[dict]) -> dict:
    """The mean of each metric over `rows` (a metric missing from some rows: over the rows that have it)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}

"""The numbers a training step logs, under TRL's names: rewards, group statistics, completion lengths."""

from __future__ import annotations

import torch

from minigrpo.advantages import group_rewards, zero_std_groups
from minigrpo.rewards import reward_func_name
from minigrpo.rollout import Rollout


# --- metrics (TRL's names) ----------------------------------------------------------
def reward_metrics(rewards_per_func: torch.Tensor, rewards: torch.Tensor, reward_funcs, num_generations: int) -> dict:
    """reward, reward_std (mean of the group stds), rewards/<fn>/mean|std, frac_reward_zero_std."""
    grouped = group_rewards(rewards.float(), num_generations)  # (B, G)
    metrics = {
        "reward": rewards.mean().item(),
        "reward_std": grouped.std(dim=1).mean().item(),
        "frac_reward_zero_std": zero_std_groups(grouped).float().mean().item(),
    }
    for f, func in enumerate(reward_funcs):
        name = reward_func_name(func)
        metrics[f"rewards/{name}/mean"] = rewards_per_func[:, f].nanmean().item()
        metrics[f"rewards/{name}/std"] = _nanstd(rewards_per_func[:, f])
    return metrics


def completion_metrics(rollout: Rollout) -> dict:
    """completions/mean_length, min/max_length, clipped_ratio (truncated), mean_terminated_length."""
    lengths = rollout.completion_mask.sum(1).float()  # (N,)
    terminated = lengths[~rollout.is_truncated]
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": rollout.is_truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item() if terminated.numel() else 0.0,
    }


def _nanstd(values: torch.Tensor) -> float:
    values = values[~values.isnan()]
    return values.std().item() if values.numel() > 1 else 0.0


def average_metrics(rows: list[dict]) -> dict:
    """The mean of each metric over `rows` (a metric missing from some rows: over the rows that have it)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}

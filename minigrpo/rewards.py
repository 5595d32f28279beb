"""Stage 2: score every completion with every reward function, weight and sum.

Reward functions have TRL's signature, so the same function works here and in
TRL's GRPOTrainer:

    def my_reward(prompts, completions, completion_ids, **columns) -> list[float]

``prompts`` and ``completions`` have one entry per completion (N of them, the
prompt repeated G times); ``columns`` are the dataset's other columns, also
repeated (``answer=[...]``). A function may return None for a completion it
does not apply to; that entry is ignored in the weighted sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

RewardFunc = Callable[..., list]


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something unusable."""


def reward_func_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", type(func).__name__)


def call_reward_func(
    func: RewardFunc, prompts: list, completions: list[str], completion_ids: list[list[int]], columns: dict
) -> list[float]:
    """Call one reward function and check what it returned: N numbers (or None)."""
    name, n = reward_func_name(func), len(completions)
    try:
        values = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    except Exception as error:
        raise RewardFunctionError(
            f"reward function {name!r} raised {type(error).__name__}: {error}. It was called with "
            f"{n} completions and the dataset columns {sorted(columns)}; fix the function "
            "(it must accept prompts, completions, completion_ids and **kwargs)."
        ) from error
    try:
        values = list(values)
    except TypeError:
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}, not a list: return one float per completion."
        ) from None
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {n} completions: "
            "return exactly one float (or None) per completion."
        )
    return [_as_float(name, i, value) for i, value in enumerate(values)]


def _as_float(name: str, index: int, value) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for completion {index}: return a float or None."
        ) from None


def compute_rewards(
    reward_funcs: Sequence[RewardFunc],
    prompts: list,
    completions: list[str],
    completion_ids: list[list[int]],
    columns: dict,
    reward_weights: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score N completions with F reward functions.

    returns rewards_per_func (N, F) (NaN where a function returned None) and
    rewards (N,) = sum_f w_f * r_f, ignoring NaN entries.
    """
    weights = [1.0] * len(reward_funcs) if reward_weights is None else list(reward_weights)
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"reward_weights has {len(weights)} entries for {len(reward_funcs)} reward functions: "
            "give one per function."
        )
    columns_per_func = [call_reward_func(f, prompts, completions, completion_ids, columns) for f in reward_funcs]
    rewards_per_func = torch.tensor(columns_per_func, dtype=torch.float32).T  # (N, F)
    weighted = rewards_per_func * torch.tensor(weights, dtype=torch.float32)  # (N, F)
    return rewards_per_func, torch.nansum(weighted, dim=1)  # (N, F), (N,)

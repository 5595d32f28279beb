"""Stage 2: score every completion with every reward function, weight and sum.

Reward functions have TRL's signature, so the same function works here and in
TRL's GRPOTrainer:

    def my_reward(prompts, completions, completion_ids, **columns) -> list[float]

``prompts`` and ``completions`` have one entry per completion (N of them, the
prompt repeated G times); ``columns`` are the dataset's other columns, also
repeated (``answer=[...]``). A function may return None for a completion it
does not apply to; that entry is ignored in the weighted sum. Any other value
must be a finite float: NaN or inf would turn every advantage of the group into
NaN, so it is an error that names the function and the completion.

``reward_timeout`` (seconds) bounds each call. The function runs in a worker
thread and the trainer waits ``join(timeout)``; this works on any OS, in
Jupyter and off the main thread, where ``signal.alarm`` would not. Its limits:
Python cannot kill a thread, so a function that timed out keeps running in the
background (a daemon thread, dropped at exit) while the error stops training;
and one long C call that holds the GIL (a catastrophic regex, say) delays the
timeout until it returns. To contain untrusted code, run it in a subprocess.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

import torch

RewardFunc = Callable[..., list]


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something unusable."""


def reward_func_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", type(func).__name__)


def call_with_timeout(func: Callable, kwargs: dict, timeout: float | None):
    """func(**kwargs), or TimeoutError after `timeout` seconds (None: wait forever). Exceptions pass through.

    A worker thread + join(timeout): see the module docstring for why, and what it cannot stop.
    """
    if timeout is None:
        return func(**kwargs)
    outcome = {}

    def work():
        try:
            outcome["value"] = func(**kwargs)
        except BaseException as error:  # handed to the caller, which re-raises it
            outcome["error"] = error

    worker = threading.Thread(target=work, name=f"reward-{reward_func_name(func)}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"still running after {timeout:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def call_reward_func(
    func: RewardFunc,
    prompts: list,
    completions: list[str],
    completion_ids: list[list[int]],
    columns: dict,
    timeout: float | None = None,
) -> list[float]:
    """Call one reward function (within `timeout` seconds) and check what it returned: N finite floats or None."""
    name, n = reward_func_name(func), len(completions)
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **columns}
    try:
        values = call_with_timeout(func, kwargs, timeout)
    except TimeoutError as error:
        raise RewardFunctionError(
            f"reward function {name!r} did not return within reward_timeout={timeout:g}s for {n} completions "
            f"({error}): make it faster, or raise reward_timeout (None waits forever)."
        ) from None
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
        number = float(value)
    except (TypeError, ValueError):
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for completion {index}: return a float or None."
        ) from None
    if not math.isfinite(number):  # NaN internally means "not applicable"; a real NaN or inf is a bug
        raise RewardFunctionError(
            f"reward function {name!r} returned {number} for completion {index}: return a finite float, "
            "or None when the function does not apply to that completion."
        )
    return number


def compute_rewards(
    reward_funcs: Sequence[RewardFunc],
    prompts: list,
    completions: list[str],
    completion_ids: list[list[int]],
    columns: dict,
    reward_weights: Sequence[float] | None = None,
    reward_timeout: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score N completions with F reward functions.

    reward_timeout: seconds each function may take for the N completions (None: no limit).
    returns rewards_per_func (N, F) (NaN where a function returned None) and
    rewards (N,) = sum_f w_f * r_f, ignoring NaN entries.
    """
    weights = [1.0] * len(reward_funcs) if reward_weights is None else list(reward_weights)
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"reward_weights has {len(weights)} entries for {len(reward_funcs)} reward functions: "
            "give one per function."
        )
    if reward_timeout is not None and not reward_timeout > 0:
        raise ValueError(f"reward_timeout={reward_timeout}: give a positive number of seconds, or None for no limit.")
    columns_per_func = [
        call_reward_func(f, prompts, completions, completion_ids, columns, reward_timeout) for f in reward_funcs
    ]
    rewards_per_func = torch.tensor(columns_per_func, dtype=torch.float32).T  # (N, F)
    weighted = rewards_per_func * torch.tensor(weights, dtype=torch.float32)  # (N, F)
    return rewards_per_func, torch.nansum(weighted, dim=1)  # (N, F), (N,)


# --- DAPO's soft overlong punishment -------------------------------------------------
def soft_overlong_penalty(length: int, max_completion_len: int, soft_punish_cache: int) -> float:
    """DAPO's length reward (Yu et al., 2025, arXiv 2503.14476, eq. 13) for one completion of `length` tokens:

        0                                  if length <= L_max - L_cache
        (L_max - L_cache - length) / L_cache   if L_max - L_cache < length <= L_max   (from 0 down to -1)
        -1                                 if length > L_max

    with L_max = max_completion_len and L_cache = soft_punish_cache. A completion
    cut off by the length limit has no final answer; a hard -1 for it would punish
    a good but long line of reasoning as much as a wrong one, so the penalty ramps
    in over the last L_cache tokens instead. With L_cache = 0 it is the hard step.
    """
    threshold = max_completion_len - soft_punish_cache
    if length <= threshold:
        return 0.0
    if length <= max_completion_len:
        return (threshold - length) / soft_punish_cache
    return -1.0


class SoftOverlongPunishment:
    """The reward function `get_soft_overlong_punishment` returns: soft_overlong_penalty of each completion's
    length in tokens (its completion_ids, EOS included, as TRL passes them). A class, not a closure, so that it
    pickles; its __name__ is TRL's, so the logged metric is rewards/soft_overlong_punishment_reward/mean there too."""

    __name__ = "soft_overlong_punishment_reward"

    def __init__(self, max_completion_len: int, soft_punish_cache: int):
        self.max_completion_len, self.soft_punish_cache = max_completion_len, soft_punish_cache

    def __call__(self, completion_ids: list[list[int]], **kwargs) -> list[float]:
        return [
            soft_overlong_penalty(len(ids), self.max_completion_len, self.soft_punish_cache) for ids in completion_ids
        ]


def get_soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> RewardFunc:
    """DAPO's soft overlong punishment as a reward function (TRL's `trl.rewards.get_soft_overlong_punishment`,
    same name, arguments and values). Add it to the task's reward with its own weight, for example
    ``reward_funcs=[correctness_reward, get_soft_overlong_punishment(config.max_completion_length, 8)]``.

    max_completion_len: L_max in tokens, usually GRPOConfig.max_completion_length (minigrpo never samples
    longer, so the -1 beyond it only applies when L_max is set lower). soft_punish_cache: L_cache, the
    last tokens before L_max over which the penalty ramps from 0 to -1 (DAPO: 4096 of 20480).
    """
    if max_completion_len < 1 or not 0 <= soft_punish_cache <= max_completion_len:
        raise ValueError(
            f"max_completion_len={max_completion_len}, soft_punish_cache={soft_punish_cache}: give "
            "max_completion_len >= 1 and 0 <= soft_punish_cache <= max_completion_len (the ramp is the last "
            "soft_punish_cache tokens before max_completion_len)."
        )
    return SoftOverlongPunishment(max_completion_len, soft_punish_cache)

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

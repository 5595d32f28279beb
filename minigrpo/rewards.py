"""Stage 2: score every completion with every reward function, weight and sum.

Reward functions have TRL's signature, so the same function works here and in
TRL's GRPOTrainer:

    def my_reward(prompts, completions, completion_ids, **kwargs) -> list[float]

``prompts`` and ``completions`` have one entry per completion (N of them, the
prompt repeated G times), in TRL's form: for a conversational dataset (prompts
are lists of chat messages) each completion is a one-message list
``[{"role": "assistant", "content": text}]``; for a standard dataset it is the
text. ``kwargs`` holds the dataset's other columns, also repeated
(``answer=[...]``), and what TRL adds (``RewardExtras``): ``trainer_state``,
``log_extra(column, values)`` and ``log_metric(name, value)``. An
``async def`` reward function is awaited; several run concurrently, as in TRL.

A function may return None for a completion it does not apply to; that entry is
ignored in the weighted sum. Any other value must be a finite float: NaN or inf
would turn every advantage of the group into NaN, so it is an error that names
the function and the completion.

An entry of ``reward_funcs`` may also be a reward model (``ModelReward``): a
sequence-classification model scoring prompt + completion, as TRL scores it.

``reward_timeout`` (seconds) bounds each call. The function runs in a worker
thread and the trainer waits ``join(timeout)``; this works on any OS, in
Jupyter and off the main thread, where ``signal.alarm`` would not. Its limits:
Python cannot kill a thread, so a function that timed out keeps running in the
background (a daemon thread, dropped at exit) while the error stops training;
and one long C call that holds the GIL (a catastrophic regex, say) delays the
timeout until it returns. To contain untrusted code, run it in a subprocess.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

RewardFunc = Callable[..., list]


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something unusable."""


def reward_func_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", type(func).__name__)


ACCURACY_REWARD_NAMES = ("correctness_reward", "accuracy_reward")
"""Names of an accuracy reward: the course's (tasks.arithmetic.correctness_reward) and TRL's
(trl.rewards.accuracy_reward)."""


def accuracy_reward_index(reward_funcs: Sequence[RewardFunc]) -> int:
    """Which of `reward_funcs` is the accuracy reward (eval_accuracy, frac_reward_zero_std/all_correct): the first
    one marked ``func.is_accuracy_reward = True``, else the first named as in ACCURACY_REWARD_NAMES, else the
    first function (then the trainer warns which one it reads: accuracy_reward_note). Whatever the order of
    reward_funcs: TRL scripts often list the format reward first."""
    for f, func in enumerate(reward_funcs):
        if getattr(func, "is_accuracy_reward", False):
            return f
    names = [reward_func_name(func) for func in reward_funcs]
    return next((f for f, name in enumerate(names) if name in ACCURACY_REWARD_NAMES), 0)


def accuracy_reward_note(reward_funcs: Sequence[RewardFunc]) -> str | None:
    """A warning when eval_accuracy falls back to the first of several reward functions, naming it; else None."""
    f = accuracy_reward_index(reward_funcs)
    func = reward_funcs[f] if reward_funcs else None
    recognised = func is not None and (
        getattr(func, "is_accuracy_reward", False) or reward_func_name(func) in ACCURACY_REWARD_NAMES
    )
    if len(reward_funcs) < 2 or recognised:
        return None
    return (
        f"eval_accuracy (and frac_reward_zero_std/all_correct) will read {reward_func_name(func)!r}, the first "
        "reward function, as the accuracy reward: no function is named correctness_reward or accuracy_reward. "
        "Mark yours with `my_reward.is_accuracy_reward = True`."
    )


# --- what a reward function receives -------------------------------------------------
def is_conversational(prompt) -> bool:
    """A prompt given as chat messages ([{"role": ..., "content": ...}, ...]) rather than as text."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def as_trl_completions(prompts: list, texts: list[str]) -> list:
    """The completions as TRL hands them to reward functions: for chat prompts, each text as a one-message
    list [{"role": "assistant", "content": text}]; for text prompts, the texts themselves."""
    if prompts and is_conversational(prompts[0]):
        return [[{"role": "assistant", "content": text}] for text in texts]
    return list(texts)


def completion_text(completion) -> str:
    """A completion as text, in either form TRL passes: a string, or [{'role': 'assistant', 'content': ...}]."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


@dataclass
class RewardExtras:
    """The keywords TRL 1.16 passes to every reward function besides the dataset's columns.

    trainer_state: the trainer's ``state`` (global_step, max_steps, epoch, ...), for rewards that change with
    training (a curriculum). log_extra(column, values): a column of N values shown beside the completions
    (here: kept in ``extra_columns`` for the step, readable as ``trainer.completion_extras``).
    log_metric(name, value): a scalar averaged over the logging step and logged beside the built-in metrics.
    """

    KEYWORDS = ("trainer_state", "log_extra", "log_metric")  # what as_kwargs passes, shared by every function

    trainer_state: object = None
    extra_columns: dict[str, list] = field(default_factory=dict)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def log_extra(self, column: str, values: list) -> None:
        self.extra_columns.setdefault(column, []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(name, []).append(float(value))

    def as_kwargs(self) -> dict:
        return {name: getattr(self, name) for name in self.KEYWORDS}

    def metric_means(self) -> dict[str, float]:
        """Each logged metric's mean over the calls of this step."""
        return {name: sum(values) / len(values) for name, values in self.metrics.items() if values}


EXTRA_KEYWORDS = {"completion_ids", *RewardExtras.KEYWORDS}
RESERVED_COLUMNS = ("prompts", "completions", "completion_ids", *RewardExtras.KEYWORDS)
"""The keywords every reward function gets from the trainer. A dataset column of one of these names would replace
it (the dataset's columns are passed as keywords too), so it is refused (run.datasets.check_columns and
compute_rewards); TRL fails on prompts and completions and drops the others."""


def is_async_reward(func: RewardFunc) -> bool:
    """An ``async def`` function, or an object whose __call__ is one (TRL awaits both)."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def call_with_timeout(func: Callable, kwargs: dict, timeout: float | None, on_thread: bool = False):
    """func(**kwargs), or TimeoutError after `timeout` seconds (None: wait forever). Exceptions pass through.

    A worker thread + join(timeout): see the module docstring for why, and what it cannot stop. Without a
    timeout func runs in the caller's thread, unless on_thread (an event loop of its own needs a thread
    where no loop runs: Jupyter's main thread has one).
    """
    if timeout is None and not on_thread:
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
    completions: list,
    completion_ids: list[list[int]],
    columns: dict,
    timeout: float | None = None,
) -> list[float]:
    """Call one reward function (within `timeout` seconds) and check what it returned: N finite floats or None.
    `columns`: every keyword besides prompts, completions and completion_ids (dataset columns, RewardExtras)."""
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **columns}
    if is_async_reward(func):
        return call_async_reward_funcs([func], kwargs, timeout)[0]
    kwargs = own_copy(kwargs)
    values = _guarded_call(func, lambda: call_with_timeout(func, kwargs, timeout), len(completions), columns, timeout)
    return check_reward_values(func, values, len(completions))


def call_async_reward_funcs(funcs: list[RewardFunc], kwargs: dict, timeout: float | None) -> list[list[float]]:
    """Await every ``async def`` reward function concurrently (asyncio.gather, as TRL does), in an event loop of
    their own on a worker thread, so this works inside Jupyter's running loop too. One list per function."""

    async def gather():
        return await asyncio.gather(*(func(**own_copy(kwargs)) for func in funcs), return_exceptions=True)

    n, columns = len(kwargs["completions"]), {k: v for k, v in kwargs.items() if k not in ("prompts", "completions")}
    names = ", ".join(repr(reward_func_name(f)) for f in funcs)
    outcomes = _guarded_call(
        names, lambda: call_with_timeout(asyncio.run, {"main": gather()}, timeout, on_thread=True), n, columns, timeout
    )
    results = []
    for func, outcome in zip(funcs, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            raise reward_failure(func, outcome, n, columns, timeout) from outcome
        results.append(check_reward_values(func, outcome, n))
    return results


def own_copy(kwargs: dict) -> dict:
    """A reward function's own copy of its inputs: one that edits `completions` in place (or pops from it) cannot
    change what the next function and the rollout see. trainer_state, log_extra and log_metric are shared."""
    return {key: value if key in RewardExtras.KEYWORDS else copy.deepcopy(value) for key, value in kwargs.items()}


def _guarded_call(func, call: Callable, n: int, columns: dict, timeout: float | None):
    """call(), with its failure turned into a RewardFunctionError that names the function (or functions)."""
    try:
        return call()
    except Exception as error:
        raise reward_failure(func, error, n, columns, timeout) from None if isinstance(error, TimeoutError) else error


def reward_failure(func, error: BaseException, n: int, columns: dict, timeout: float | None) -> RewardFunctionError:
    """The error that says which reward function failed, how it was called and what to fix."""
    name = func if isinstance(func, str) else repr(reward_func_name(func))
    if isinstance(error, TimeoutError):
        return RewardFunctionError(
            f"reward function {name} did not return within reward_timeout={timeout:g}s for {n} completions "
            f"({error}): make it faster, or raise reward_timeout (None waits forever)."
        )
    return RewardFunctionError(
        f"reward function {name} raised {type(error).__name__}: {error}. It was called with {n} completions, "
        f"the dataset columns {sorted(set(columns) - EXTRA_KEYWORDS)} and {', '.join(sorted(EXTRA_KEYWORDS))}; "
        "fix the function (it must accept prompts, completions, "
        "completion_ids and **kwargs; for chat prompts each completion is [{'role': 'assistant', 'content': "
        "text}], as in TRL)."
    )


def check_reward_values(func: RewardFunc, values, n: int) -> list[float]:
    """What a reward function returned, as N floats (NaN for None); a clear error for anything else."""
    name = reward_func_name(func)
    if inspect.iscoroutine(values):
        values.close()
        raise RewardFunctionError(
            f"reward function {name!r} returned a coroutine: declare it `async def` itself (minigrpo awaits "
            "those), or return the list of floats directly."
        )
    if isinstance(values, str | bytes | dict | set | frozenset) or not hasattr(values, "__len__"):
        # a dict would be scored by its keys, a string by its characters, a set in no fixed order
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}, not a list: return one float (or None) "
            "per completion, in the order of `completions`."
        )
    values = list(values)
    if len(values) != n:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} values for {n} completions: "
            "return exactly one float (or None) per completion."
        )
    return [_as_float(name, i, value) for i, value in enumerate(values)]


def _as_float(name: str, index: int, value) -> float:
    if value is None:
        return math.nan
    if isinstance(value, str | bytes):  # float("1.0") would parse it: a reward is a number, not text
        raise RewardFunctionError(
            f"reward function {name!r} returned {value!r} for completion {index}, a string: return a float or None."
        )
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
    completions: list,
    completion_ids: list[list[int]],
    columns: dict,
    reward_weights: Sequence[float] | None = None,
    reward_timeout: float | None = None,
    extras: RewardExtras | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score N completions with F reward functions.

    completions: as reward functions receive them (as_trl_completions). columns: the dataset's other columns,
    one value per completion. extras: trainer_state, log_extra and log_metric (a fresh RewardExtras if None).
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
    shadowing = [name for name in columns if name in RESERVED_COLUMNS]
    if shadowing:
        raise ValueError(
            f"a dataset column is named {shadowing[0]!r}, a keyword every reward function gets from the trainer "
            f"({', '.join(RESERVED_COLUMNS)}): it would replace what they receive. Rename the column."
        )
    keywords = {**columns, **(extras or RewardExtras()).as_kwargs()}
    async_funcs = [f for f, func in enumerate(reward_funcs) if is_async_reward(func)]
    scores: dict[int, list[float]] = {
        f: call_reward_func(func, prompts, completions, completion_ids, keywords, reward_timeout)
        for f, func in enumerate(reward_funcs)
        if f not in async_funcs
    }
    if async_funcs:
        kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **keywords}
        awaited = call_async_reward_funcs([reward_funcs[f] for f in async_funcs], kwargs, reward_timeout)
        scores.update(zip(async_funcs, awaited, strict=True))
    columns_per_func = [scores[f] for f in range(len(reward_funcs))]
    # summed in float64, then checked where they are used (float32): 1e39 is finite in one and inf in the other
    rewards_per_func = torch.tensor(columns_per_func, dtype=torch.float64).T  # (N, F)
    rewards = torch.nansum(rewards_per_func * torch.tensor(weights, dtype=torch.float64), dim=1)  # (N,)
    check_float32_range(reward_funcs, weights, rewards_per_func, rewards)
    return rewards_per_func.float(), rewards.float()  # (N, F), (N,)


def check_float32_range(reward_funcs, weights, rewards_per_func: torch.Tensor, rewards: torch.Tensor) -> None:
    """A reward or weighted sum beyond float32's range (about 3.4e38) would become inf in training: name it."""
    limit = torch.finfo(torch.float32).max
    for f, func in enumerate(reward_funcs):
        too_large = rewards_per_func[:, f].abs() > limit  # NaN (None) compares False
        if too_large.any():
            raise RewardFunctionError(
                f"reward function {reward_func_name(func)!r} returned {rewards_per_func[:, f][too_large][0].item():g}, "
                "beyond float32's range (3.4e38) in which rewards are trained: return rewards of a sensible size "
                "(typically 0-1)."
            )
    if not torch.isfinite(rewards).all() or (rewards.abs() > limit).any():
        raise RewardFunctionError(
            f"the weighted sum of the rewards (reward_weights={weights}) goes beyond float32's range (3.4e38): "
            "use smaller reward_weights."
        )


# --- reward models --------------------------------------------------------------------
class ModelReward:
    """A learned reward model as a reward function, scored as TRL scores one: the text of prompt + completion
    (through the reward tokenizer's chat template for chat prompts), tokenized with right padding, and the
    model's first logit at the last real token, ``logits[:, 0]`` (N,).

    DeepSeekMath's GRPO trained on a learned reward model's scores; rule-based rewards (R1-Zero) need none.
    model: an ``AutoModelForSequenceClassification`` (num_labels=1); tokenizer: its own tokenizer (TRL's
    ``reward_processing_classes``). Its __name__ is the model's folder or Hub name, as in TRL's logs.
    """

    def __init__(self, model, tokenizer):
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        # the model reads its score at the last token that is not padding: it must know the pad id
        model.config.pad_token_id = tokenizer.pad_token_id
        self.model, self.tokenizer = model.eval(), tokenizer
        self.__name__ = (
            str(getattr(model.config, "_name_or_path", "") or type(model).__name__).rstrip("/").split("/")[-1]
        )

    def texts(self, prompts: list, completions: list) -> list[str]:
        if prompts and is_conversational(prompts[0]):
            return [
                self.tokenizer.apply_chat_template(p + c, tokenize=False)
                for p, c in zip(prompts, completions, strict=True)
            ]
        return [p + completion_text(c) for p, c in zip(prompts, completions, strict=True)]

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        device = next(self.model.parameters()).device
        inputs = self.tokenizer(
            self.texts(prompts, completions), return_tensors="pt", padding=True, padding_side="right",
            add_special_tokens=False,
        ).to(device)  # fmt: skip
        with torch.inference_mode():
            return self.model(**inputs).logits[:, 0].float().tolist()  # (N,)


def load_reward_model(name: str, tokenizer=None) -> ModelReward:
    """A reward model from a Hub id or a local folder (AutoModelForSequenceClassification, num_labels=1, its own
    tokenizer unless one is given). Never runs code from the folder (trust_remote_code=False)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, trust_remote_code=False)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    return ModelReward(model, tokenizer)


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


def resolve_reward_funcs(reward_funcs, reward_processing_classes=None, device=None) -> list[RewardFunc]:
    """TRL's ``reward_funcs``: one entry or a list, each a function, a reward model's Hub id or folder (str), or
    a loaded sequence-classification model; models become ModelReward, on `device`. reward_processing_classes:
    one tokenizer per entry (None: the model's own), as in TRL."""
    single = isinstance(reward_funcs, str | os.PathLike) or callable(reward_funcs)
    funcs = [reward_funcs] if single else list(reward_funcs or [])
    tokenizers = reward_processing_classes
    if not isinstance(tokenizers, list | tuple):
        tokenizers = [tokenizers] * len(funcs) if tokenizers is None or len(funcs) == 1 else None
    if tokenizers is None or len(tokenizers) != len(funcs):
        raise ValueError(
            f"reward_processing_classes: give one tokenizer (or None) per entry of reward_funcs ({len(funcs)})."
        )
    resolved = []
    for func, tokenizer in zip(funcs, tokenizers, strict=True):
        if isinstance(func, str | os.PathLike):
            func = load_reward_model(str(func), tokenizer)
        elif isinstance(func, torch.nn.Module) and hasattr(func, "config"):  # a loaded reward model
            func = ModelReward(func, tokenizer if tokenizer is not None else _model_tokenizer(func))
        elif not callable(func):
            raise ValueError(
                f"reward_funcs: {func!r} is neither a function f(prompts, completions, completion_ids, **kwargs), "
                "a reward model's Hub id or folder, nor a loaded sequence-classification model."
            )
        if isinstance(func, ModelReward) and device is not None:
            func.model.to(device)
        resolved.append(func)
    return resolved


def _model_tokenizer(model):
    from transformers import AutoTokenizer

    name = getattr(model.config, "_name_or_path", "")
    if not name:
        raise ValueError(
            "a reward model was given without its tokenizer, and its config names no folder to load one from: "
            "pass reward_processing_classes=[tokenizer] (one per entry of reward_funcs, None for functions)."
        )
    return AutoTokenizer.from_pretrained(name, trust_remote_code=False)

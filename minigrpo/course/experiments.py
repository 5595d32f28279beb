"""The lab bench of lessons 06 and 07: short runs, their summaries, and an interruption you can reproduce.

Nothing here is part of GRPO itself:

- ``train_short_run``: train a fresh tiny Qwen with one config, so that runs
  differ only by their config.
- ``summarize_run`` / ``completion_table``: a run's last steps as one number
  per metric, and completions before / after training side by side (a pandas
  DataFrame, which a notebook renders as a table).
- ``simulate_disconnect``: a reward function that raises KeyboardInterrupt on
  a chosen call, to interrupt a run for real and resume it.
- ``torchrun_failure``: what a failed torchrun printed, the first rank's own
  error first (lesson 07's scale-out).

The rest of what lessons 06-07 use lives with its concern:
``minigrpo.course.variants`` (VARIANTS, variant_config, config_diff,
per_token_gradient_weights), ``minigrpo.dynamic_sampling`` (DAPO's filter and
refill), ``minigrpo.tasks.reward_hacking`` (rewards that can be gamed) and
``minigrpo.course.plots.plot_variant_comparison`` (the figure).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from minigrpo.config import GRPOConfig
from minigrpo.trainer import GRPOTrainer


# --- short runs ---------------------------------------------------------------------
def train_short_run(
    config: GRPOConfig,
    reward_funcs: Callable | Sequence[Callable] | None = None,
    model_name: str = "tiny",
    train_dataset=None,
    eval_dataset=None,
    dynamic_sampling: bool = False,
    eval_size: int = 200,
) -> GRPOTrainer:
    """Train a fresh copy of `model_name` with `config`; returns the trainer (its .history holds the metrics).

    Defaults: 2000 training sums, `eval_size` held-out sums (0: no evaluation),
    rewards [correctness, format] (weight them with config.reward_weights, for
    example tasks.arithmetic.REWARD_WEIGHTS). `dynamic_sampling` switches on
    DAPO's refill (config.dynamic_sampling). Every call starts from the same
    weights, so runs differ only by their config, and replaces an earlier
    run in config.output_dir (overwrite_output_dir=True).
    """
    from minigrpo.models import load_model_and_tokenizer
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset

    model, tokenizer = load_model_and_tokenizer(model_name)
    reward_funcs = [correctness_reward, format_reward] if reward_funcs is None else reward_funcs
    train_dataset = train_dataset if train_dataset is not None else make_arithmetic_dataset(2000, "train")
    if eval_dataset is None and eval_size > 0:
        eval_dataset = make_arithmetic_dataset(eval_size, "test")
    # A short run is an experiment to repeat (a notebook re-run): it replaces an earlier run in its output_dir.
    config = config.replace(overwrite_output_dir=True, dynamic_sampling=dynamic_sampling or config.dynamic_sampling)
    trainer = GRPOTrainer(model, reward_funcs, config, train_dataset, eval_dataset, processing_class=tokenizer)
    trainer.train()
    return trainer


def summarize_run(history: Sequence[dict], last: int = 5) -> dict:
    """Mean of each metric over the last `last` steps that logged it (eval_* : the last value)."""
    if not history:
        raise ValueError("the history is empty: train for at least one step.")
    keys = {key for metrics in history for key in metrics if key != "step"}
    summary = {}
    for key in sorted(keys):
        values = [m[key] for m in history if key in m]
        window = values[-1:] if key.startswith("eval_") else values[-last:]
        summary[key] = sum(window) / len(window)
    return summary


def completion_table(questions: Sequence[str], answers: Sequence, before: Sequence[str], after: Sequence[str]):
    """A pandas DataFrame: question, answer, completion before / after training, and whether each is right."""
    import pandas as pd

    from minigrpo.tasks.arithmetic import correctness_reward

    right_before = correctness_reward(None, list(before), answer=list(answers))
    right_after = correctness_reward(None, list(after), answer=list(answers))
    return pd.DataFrame(
        {
            "question": list(questions),
            "answer": list(answers),
            "before": list(before),
            "ok before": [bool(r) for r in right_before],
            "after": list(after),
            "ok after": [bool(r) for r in right_after],
        }
    )


# --- an interruption you can reproduce ---------------------------------------------
def simulate_disconnect(reward_func: Callable, on_call: int) -> Callable:
    """`reward_func`, except that its `on_call`-th call raises KeyboardInterrupt (a "Colab disconnect").

    The trainer calls the reward functions once per training step (and once per
    evaluation), so with no eval_dataset the interruption lands in step `on_call`.
    """
    if on_call < 1:
        raise ValueError(f"on_call={on_call}: count calls from 1.")
    calls = 0

    @functools.wraps(reward_func)
    def wrapped(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == on_call:
            raise KeyboardInterrupt(f"simulated disconnect in call {on_call} of {reward_func.__name__}")
        return reward_func(*args, **kwargs)

    return wrapped


# --- a failed torchrun ---------------------------------------------------------------
def torchrun_failure(output: str, tail: int = 1500) -> str:
    """What to show when `torchrun` exits with an error: the first traceback a rank printed, then torchrun's last lines.

    torchrun prints each rank's traceback (every line prefixed "[rankN]: "), then its own long one (ChildFailedError,
    a summary with the exit codes), which is all the output's tail holds: the error itself comes first only here.
    Output with no rank traceback (a killed rank, torchrun's own failure) is returned as its last `tail` characters."""
    lines = output.splitlines()
    first = next((i for i, line in enumerate(lines) if _after_rank(line)[1].startswith("Traceback")), None)
    if first is None:
        return output[-tail:]
    prefix = _after_rank(lines[first])[0]
    rank_lines = [_after_rank(line)[1] for line in lines[first:] if _after_rank(line)[0] == prefix]
    header = f"{prefix.strip('[]: ').replace('rank', 'rank ') or 'the program'} raised:"  # "rank 0 raised:"
    return "\n".join([header, *_first_traceback(rank_lines), "", "torchrun's last lines:", output[-tail:]])


def _after_rank(line: str) -> tuple[str, str]:
    """("[rank0]: ", the rest) for a rank's line, ("", line) for any other."""
    if line.startswith("[rank") and "]: " in line:
        prefix, _, rest = line.partition("]: ")
        return prefix + "]: ", rest
    return "", line


def _first_traceback(lines: list[str]) -> list[str]:
    """lines[0] is "Traceback ...": up to its last exception line (past chained ones: "During handling ...")."""
    chained = ("Traceback", "During handling", "The above exception")
    for end, line in enumerate(lines):
        if line and not line[0].isspace() and not line.startswith(chained):
            following = next((other for other in lines[end + 1 :] if other.strip()), "")
            if not following.startswith(chained[1:]):
                return lines[: end + 1]
    return lines

"""What a run shows while it trains, and the summary it ends with.

The bar counts optimizer steps and, after each generation, shows what the run is doing on the scale the lessons use:
the reward (the weighted sum the advantages come from), each reward function's mean (TRL's rewards/<fn>/mean) and
the last held-out accuracy with the step it was measured at. The sampled reward is noisy from step to step; the
held-out accuracy, measured every eval_steps, is the number that says whether the model is learning.

transformers draws bars of its own when a checkpoint is written or read ("Writing model shards", "Loading
weights"); they would break into this one, so a run switches them off (library_bars_off).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm.auto import tqdm

REWARD_MEAN = re.compile(r"rewards/(.+)/mean")


def bar_fields(metrics: dict, history: Sequence[dict]) -> dict[str, str]:
    """The bar's fields after a generation: reward, each reward function's mean (by its name), and eval_accuracy
    "0.610 (step 75)" from the last row of `history` that has one. metrics: the generation's; history: the logged
    rows so far (trainer.state.log_history)."""
    fields = {}
    if "reward" in metrics:
        fields["reward"] = f"{metrics['reward']:.3f}"
    for key, value in metrics.items():
        match = REWARD_MEAN.fullmatch(key)
        if match:
            fields[match.group(1)] = f"{value:.3f}"
    evaluated = last_evaluation(history)
    if evaluated is not None:
        fields["eval_accuracy"] = f"{evaluated['eval_accuracy']:.3f} (step {evaluated['step']})"
    return fields


def last_evaluation(history: Sequence[dict]) -> dict | None:
    """The last logged row with an eval_accuracy, or None."""
    return next((row for row in reversed(history) if "eval_accuracy" in row), None)


class RunProgress:
    """The run's progress bar: optimizer steps done of max_steps, with bar_fields after each generation."""

    def __init__(self, total: int, initial: int, desc: str, disable: bool = False, file=None):
        self.bar = tqdm(
            total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True, disable=disable, file=file
        )

    def advance(self, steps: int, metrics: dict, history: Sequence[dict]) -> None:
        """`steps` more optimizer steps done; show the generation's metrics and the last evaluation."""
        self.bar.update(steps)
        self.bar.set_postfix(bar_fields(metrics, history))

    def close(self) -> None:
        self.bar.close()


@contextlib.contextmanager
def library_bars_off() -> Iterator[None]:
    """transformers' own progress bars off inside the block (checkpoint writes and reads), as they were after."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


def run_summary(history: Sequence[dict], accuracy_before: float, accuracy_after: float, measured: str,
                output_dir: str | Path, final_dir: str | Path, metrics_path: str | Path,
                eval_flags: str = "") -> str:  # fmt: skip
    """The lines a run ends with: held-out accuracy before and after (`measured`: how), the best evaluation and its
    step, where the files are (with the eval command, plus `eval_flags` such as " --task calculator"), and the
    command that plots the curves."""
    evaluations = [row for row in history if "eval_accuracy" in row]
    lines = [f"accuracy before: {accuracy_before:.3f} after: {accuracy_after:.3f} ({measured})"]
    if evaluations:
        best = max(evaluations, key=lambda row: row["eval_accuracy"])  # the first of equal bests
        count = f"{len(evaluations)} evaluation{'s' if len(evaluations) > 1 else ''}"
        lines.append(
            f"best evaluation: {best['eval_accuracy']:.3f} at step {best['step']} "
            f"(of {count}; the saved model is the last step's)"
        )
    lines += [
        f"model: {final_dir}   (python -m minigrpo eval --model {final_dir}{eval_flags})",
        f"metrics: {metrics_path}   checkpoints: {Path(output_dir) / 'checkpoint-<step>'}",
        'plot the curves: python -c "from minigrpo.course.plots import plot_training_curves; '
        f"plot_training_curves('{metrics_path}').savefig('curves.png')\"",
    ]
    return "\n".join(lines)

"""Where a run's signal went: the diagnostics figure of lessons 06 and 07 (minigrpo.metrics' numbers, per step)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from minigrpo.plots import NEGATIVE, NEUTRAL, POSITIVE, load_history, metric_series, step_axis


def plot_diagnostics(history: Sequence[dict] | str | Path, title: str | None = None) -> Figure:
    """Where the signal went, per step: three panels that read together. Returns the figure.

    history: trainer.train()'s list of metric dicts, or a path to <output_dir>/metrics.jsonl (PPO's too).

    1. groups with zero reward std, stacked: all wrong (red, no answer to reinforce: too hard) under all
       correct (green: already solved); the black line is TRL's frac_reward_zero_std, their sum.
    2. advantages/std, the mean over groups of the advantages' std, beside 1 - frac_reward_zero_std (dashed):
       with scale_rewards="group" they coincide, every group with a signal scaled to std 1.
    3. completions/distinct_per_group, how many of the G completions differ; 1 (dotted) is a group that
       sampled one answer G times.

    A metric the history does not hold (an older run, TRL's logs) leaves its panel with a note.
    """
    history = load_history(history)
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 3.4))
    _plot_zero_std_split(axes[0], history)
    _plot_advantage_std(axes[1], history)
    _plot_distinct_completions(axes[2], history)
    for ax in axes:
        step_axis(ax)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _logged(ax, history: list[dict], key: str) -> tuple[list[float], list[float]] | None:
    """(steps, values) of `key`; None, with a note on `ax`, when the history does not hold it."""
    steps, values = metric_series(history, key)
    if steps:
        return steps, values
    ax.text(0.5, 0.5, f"{key}\nnot logged", ha="center", va="center", transform=ax.transAxes, color=NEUTRAL)
    return None


def _plot_zero_std_split(ax, history: list[dict]) -> None:
    ax.set_title("groups with zero reward std", fontsize=10)
    ax.set_ylim(0.0, 1.05)
    ax.set_ylabel("fraction of groups")
    logged = _logged(ax, history, "frac_reward_zero_std")
    if logged is None:
        return
    steps, total = logged
    wrong_steps, wrong = metric_series(history, "frac_reward_zero_std/all_wrong")
    correct_steps, correct = metric_series(history, "frac_reward_zero_std/all_correct")
    if wrong_steps == correct_steps == steps:  # the split was logged at every step (not by TRL or older runs)
        ax.stackplot(steps, wrong, correct, colors=[NEGATIVE, POSITIVE], alpha=0.6, labels=["all wrong", "all correct"])
    ax.plot(steps, total, color="black", linewidth=1, label="frac_reward_zero_std")
    ax.legend(fontsize=8, loc="upper left")


def _plot_advantage_std(ax, history: list[dict]) -> None:
    ax.set_title("advantages/std (mean over groups)", fontsize=10)
    logged = _logged(ax, history, "advantages/std")
    if logged is None:
        return
    steps, values = logged
    ax.plot(steps, values, color="tab:blue", label="advantages/std")
    steps, zero_std = metric_series(history, "frac_reward_zero_std")
    if steps:
        informative = [1.0 - z for z in zero_std]
        ax.plot(steps, informative, "--", color="black", linewidth=1, label="1 - frac_reward_zero_std")
    ax.set_ylim(bottom=0.0, top=max([1.1, *(1.1 * v for v in values)]))
    ax.legend(fontsize=8, loc="best")


def _plot_distinct_completions(ax, history: list[dict]) -> None:
    ax.set_title("completions/distinct_per_group", fontsize=10)
    logged = _logged(ax, history, "completions/distinct_per_group")
    if logged is None:
        return
    steps, values = logged
    ax.plot(steps, values, color="tab:purple", label="distinct completions per group")
    ax.axhline(1.0, color=NEGATIVE, linestyle=":", linewidth=1.5, label="1: the same answer G times")
    ax.set_ylim(bottom=0.0, top=1.15 * max(values))
    ax.set_ylabel("distinct, of G")
    ax.legend(fontsize=8, loc="best")

"""Figures for the course: plain matplotlib, readable in a static render (GitHub, nbval) as well as live.

Each ``plot_*`` function returns a ``matplotlib.figure.Figure`` and never calls
``plt.show()``: a notebook displays the figure it gets back. The numbers a
figure shows come from the package's own functions (advantages, clipped
surrogate, KL estimators), so a picture can never disagree with the code
that trains the model. The ``*_curves`` / ``kl_*`` helpers return those
numbers as plain tensors; the widgets and the tests use them too.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from minigrpo.advantages import group_relative_advantages
from minigrpo.course.kl_gradients import (
    KL_LOSSES,
    exact_kl_gradients,
    expected_kl_loss_gradient,
    kl_gradient_comparison,
)
from minigrpo.losses import clipped_surrogate, kl_penalty

DEFAULT_CURVE_KEYS = (
    "reward",
    "eval_accuracy",
    "kl",
    "entropy",
    "clip_ratio/region_mean",
    "completions/mean_length",
    "frac_reward_zero_std",
)
POSITIVE, NEGATIVE, NEUTRAL = "tab:green", "tab:red", "tab:gray"
ALGORITHM_COLORS = {"grpo": "tab:blue", "ppo": "tab:orange"}


# --- training curves ----------------------------------------------------------------
def load_history(history: Sequence[dict] | str | Path) -> list[dict]:
    """A metric history: a list of dicts (trainer.state.log_history) or the path of a metrics.jsonl.

    A run killed while writing leaves its last line cut short: that line is skipped, with a warning that says
    so. A bad line anywhere else is not a killed run's: ValueError naming the file and the line."""
    if not isinstance(history, str | Path):
        return list(history)
    lines = [(number, line) for number, line in enumerate(Path(history).read_text().splitlines(), 1) if line.strip()]
    rows = []
    for number, line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number != lines[-1][0]:
                raise ValueError(
                    f"{history}, line {number}, is not JSON ({error.msg}): the file is damaged."
                ) from error
            warnings.warn(
                f"{history}: skipped line {number}, cut short (a run killed while writing it); "
                f"the {len(rows)} lines before it are read.",
                stacklevel=2,
            )
    return rows


def metric_series(history: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric, only at the steps that logged it (eval_accuracy is sparse)."""
    steps, values = [], []
    for index, record in enumerate(history):
        value = record.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        steps.append(record.get("step", index + 1))
        values.append(float(value))
    return steps, values


def step_axis(ax, label: str = "step") -> None:
    """Label the x axis as training steps, with integer ticks only (a 4-step run must not show step 2.5)."""
    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_training_curves(
    history: Sequence[dict] | str | Path, keys: Sequence[str] | None = None, title: str | None = None
) -> Figure:
    """One small panel per metric against the training step; metrics absent from the history are skipped.

    history: trainer.state.log_history (a list of metric dicts), or a path to <output_dir>/metrics.jsonl.
    keys: metric names (TRL's); default DEFAULT_CURVE_KEYS.
    """
    history = load_history(history)
    series = {key: metric_series(history, key) for key in (keys or DEFAULT_CURVE_KEYS)}
    series = {key: xy for key, xy in series.items() if xy[0]}
    ncols = min(3, max(1, len(series)))
    nrows = max(1, math.ceil(len(series) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 2.8 * nrows), squeeze=False)
    for ax, (key, (steps, values)) in zip(axes.flat, series.items(), strict=False):
        sparse = len(steps) < max(2, len(history) // 2)  # eval_accuracy: a few points, show them
        ax.plot(steps, values, marker="o" if sparse or len(steps) < 20 else None, markersize=4)
        ax.set_title(key, fontsize=10)
        step_axis(ax)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    if not series:
        axes[0, 0].set_visible(True)
        axes[0, 0].text(0.5, 0.5, "no metrics to plot", ha="center", va="center")
        axes[0, 0].set_axis_off()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_variant_comparison(
    histories: dict[str, Sequence[dict]], keys: Sequence[str], title: str | None = None
) -> Figure:
    """One panel per metric in `keys`, one line per run in `histories` ({name: history}). Returns the figure.

    A metric no run logged gives an empty panel, not an error (lesson 07: only
    DAPO logs dynamic_sampling/kept_fraction).
    """
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for name, history in histories.items():
            points = [(m["step"], m[key]) for m in history if key in m]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if len(points) < 8 else None, ms=3, label=name)
        ax.set_title(key)
        step_axis(ax)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# --- advantages ---------------------------------------------------------------------
def plot_group_advantages(
    rewards,
    advantages=None,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Bars of the advantage of each completion, one panel per group; each bar is labelled with its
    advantage A (the bar's height) and its reward r.

    rewards: (G,) one group or (B, G) several (list or tensor).
    advantages: same shape; default group_relative_advantages(rewards) with the paper's settings.
    labels: G names for the completions (default o_1 .. o_G).
    """
    grouped = torch.as_tensor(rewards, dtype=torch.float32)
    grouped = grouped.unsqueeze(0) if grouped.dim() == 1 else grouped  # (B, G)
    assert grouped.dim() == 2, f"rewards must be (G,) or (B, G), got {tuple(grouped.shape)}"
    if advantages is None:
        advantages = group_relative_advantages(grouped)
    advantages = torch.as_tensor(advantages, dtype=torch.float32).reshape(grouped.shape)  # (B, G)
    B, G = grouped.shape
    labels = list(labels) if labels is not None else [f"o{g + 1}" for g in range(G)]
    assert len(labels) == G, f"{len(labels)} labels for groups of G={G}"
    fig, axes = plt.subplots(B, 1, figsize=(max(5.0, 0.75 * G + 1.5), 2.6 * B), squeeze=False)
    limit = max(1.0, advantages.abs().max().item() * 1.5)  # room for the two-line labels
    for b, ax in enumerate(axes[:, 0]):
        values = advantages[b].tolist()
        colors = [POSITIVE if a > 0 else NEGATIVE if a < 0 else NEUTRAL for a in values]
        bars = ax.bar(range(G), values, color=colors)
        for bar, reward in zip(bars, grouped[b].tolist(), strict=True):
            y = bar.get_height()
            ax.annotate(
                f"A={_signed(y)}\nr={reward:g}" if y >= 0 else f"r={reward:g}\nA={_signed(y)}",  # A by the bar
                (bar.get_x() + bar.get_width() / 2, y),
                xytext=(0, 3 if y >= 0 else -3),
                textcoords="offset points",
                ha="center",
                va="bottom" if y >= 0 else "top",
                fontsize=8,
            )
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(G), labels, fontsize=8)
        ax.set_ylim(-limit, limit)
        ax.set_ylabel("advantage A")
        ax.set_title(f"group {b}: mean reward {grouped[b].mean().item():.3f}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _signed(value: float) -> str:
    """+1.35, -1.05, and 0 for an exact zero (a constant group), to two decimals."""
    return "0" if value == 0 else f"{value:+.2f}"


# --- the clipped objective ----------------------------------------------------------
def clipped_objective_curves(
    ratio: torch.Tensor, advantage: float, epsilon: float = 0.2, epsilon_high: float | None = None
) -> dict[str, torch.Tensor]:
    """rho * A and the clipped surrogate along a grid of ratios, for one advantage value.

    ratio: (R,) -> each value (R,). "no_gradient" is True where the clip makes the
    surrogate flat in rho (the gradient is switched off).
    """
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    ratio = ratio.detach().clone().requires_grad_(True)  # (R,)
    advantages = torch.full(ratio.shape, float(advantage), dtype=ratio.dtype)  # (R,): one "completion" per ratio
    surrogate = clipped_surrogate(ratio.unsqueeze(1), advantages, epsilon, epsilon_high).squeeze(1)  # (R,)
    (gradient,) = torch.autograd.grad(surrogate.sum(), ratio)
    return {
        "ratio": ratio.detach(),
        "unclipped": ratio.detach() * advantage,
        "clipped": surrogate.detach(),
        "no_gradient": gradient == 0,
    }


def plot_clipped_objective(
    epsilon: float = 0.2, epsilon_high: float | None = None, advantages: Sequence[float] = (1.0, -1.0)
) -> Figure:
    """min(rho A, clip(rho, 1 - eps, 1 + eps_high) A) against rho, one panel per advantage sign.

    The shaded band is the clip range [1 - eps, 1 + eps_high]; red marks where the clip
    makes the objective flat, i.e. where the token gets no gradient.
    """
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.linspace(0.0, 2.0, 401)
    fig, axes = plt.subplots(1, len(advantages), figsize=(5.0 * len(advantages), 3.6), squeeze=False)
    for ax, advantage in zip(axes[0], advantages, strict=True):
        curves = clipped_objective_curves(ratio, advantage, epsilon, epsilon_high)
        ax.axvspan(1 - epsilon, 1 + epsilon_high, color="tab:blue", alpha=0.12, label="clip range")
        ax.plot(ratio, curves["unclipped"], "--", color=NEUTRAL, label=r"$\rho A$ (unclipped)")
        ax.plot(ratio, curves["clipped"], color="tab:blue", linewidth=2, label="clipped surrogate")
        flat = curves["clipped"].masked_fill(~curves["no_gradient"], float("nan"))
        ax.plot(ratio, flat, color=NEGATIVE, linewidth=3, label="flat: no gradient")
        ax.axvline(1.0, color="black", linewidth=0.6)
        ax.set_xlabel(r"ratio $\rho = \pi_\theta / \pi_{old}$")
        ax.set_ylabel("objective (maximised)")
        sign = "> 0" if advantage > 0 else "< 0"
        ax.set_title(f"A = {advantage:g} (A {sign}), eps = {epsilon:g}, eps_high = {epsilon_high:g}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left" if advantage > 0 else "lower left")
    fig.tight_layout()
    return fig


# --- KL estimators ------------------------------------------------------------------
KL_STYLES = {
    "k1": ("tab:gray", "--"),
    "k2": ("tab:orange", "-."),
    "k3": ("tab:blue", "-"),
    "rho_k3": ("tab:green", ":"),
}


def kl_estimator_curves(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """k1, k2, k3 per token as functions of log r = log(pi_ref / pi_theta). (R,) -> each (R,)."""
    log_ratio = log_ratio.reshape(1, -1)  # (1, R): one "completion" of R tokens
    zeros = torch.zeros_like(log_ratio)  # log pi_theta; then log pi_ref = log r
    return {name: kl_penalty(zeros, log_ratio, name).squeeze(0) for name in ("k1", "k2", "k3")}


def kl_estimates(probs, ref_probs, num_samples: int = 0, seed: int = 0) -> dict[str, float]:
    """Exact KL(pi_theta || pi_ref) of two small distributions, and what each estimator's *value* gives.

    probs, ref_probs: (V,) probabilities. "exact" = sum_v p log(p / q). "<k>_expected"
    is E_{x ~ pi_theta}[k(x)] and "<k>_variance" is Var_{x ~ pi_theta}[k(x)] (one token's
    spread), both computed exactly: k1 and k3 are unbiased estimates of the value ("exact");
    k2 is not. (As losses their *gradients* differ again: minigrpo.course.kl_gradients.) With num_samples > 0,
    "<k>_mean" / "<k>_std" are the mean and std of the per-token values over that many samples
    from pi_theta.
    """
    p = torch.as_tensor(probs, dtype=torch.float64)
    q = torch.as_tensor(ref_probs, dtype=torch.float64)
    assert p.shape == q.shape and p.dim() == 1, "probs and ref_probs must both be (V,)"
    logp, logq = p.log().unsqueeze(0), q.log().unsqueeze(0)  # (1, V)
    result = {"exact": float((p * (p.log() - q.log())).sum())}
    for name in ("k1", "k2", "k3"):
        per_token = kl_penalty(logp, logq, name).squeeze(0)  # (V,): the estimator's value at each outcome
        expected = (p * per_token).sum()
        result[f"{name}_expected"] = float(expected)
        result[f"{name}_variance"] = float((p * (per_token - expected) ** 2).sum())
        if num_samples > 0:
            generator = torch.Generator().manual_seed(seed)
            samples = torch.multinomial(p, num_samples, replacement=True, generator=generator)  # (S,)
            values = per_token[samples]
            result[f"{name}_mean"] = float(values.mean())
            result[f"{name}_std"] = float(values.std())
    return result


def shifted_distributions(shift: float, V: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference pi_ref (fixed) and a policy pi_theta whose logits moved by `shift` toward the last outcome.

    Returns (probs, ref_probs), each (V,). shift = 0 gives pi_theta == pi_ref (KL 0).
    """
    ref_logits = torch.linspace(1.0, -1.0, V, dtype=torch.float64)  # (V,)
    logits = ref_logits + shift * torch.linspace(-1.0, 1.0, V, dtype=torch.float64)  # (V,)
    return logits.softmax(0), ref_logits.softmax(0)


def plot_kl_estimators(
    log_ratio_max: float = 2.0, shifts: Sequence[float] | None = None, num_samples: int = 0
) -> Figure:
    """Three panels, for a policy drifting away from a fixed reference (shifted_distributions).

    Left: k1, k2, k3 of one token against log(pi_ref / pi_theta). Middle: their expectations under
    pi_theta against the exact KL: k1 (circles) and k3 (line) lie on the exact KL (the wide grey
    band), k2 does not. Right: the per-token variance of each, log scale (shifts with KL 0 have
    variance 0 and are left out): k3's is the lowest near pi_ref (up to KL ~0.8 on this family) and
    the highest far away (past KL ~1.05).
    """
    shifts = list(shifts) if shifts is not None else torch.linspace(0.0, 3.0, 31).tolist()
    log_ratio = torch.linspace(-log_ratio_max, log_ratio_max, 201)
    curves = kl_estimator_curves(log_ratio)
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(9.2, 3.6))  # a notebook column: 920 px at 100 dpi
    for name, values in curves.items():
        color, line = KL_STYLES[name]
        left.plot(log_ratio, values, line, color=color, label=name)
    left.axhline(0.0, color="black", linewidth=0.6)
    left.set_xlabel(r"$\log r = \log \pi_{ref} / \pi_\theta$ (one token)")
    left.set_ylabel("per-token KL estimate")
    left.set_title("k1 can be negative;\nk2 and k3 never are", fontsize=9)
    table = [kl_estimates(*shifted_distributions(s), num_samples=num_samples) for s in shifts]
    exact = [row["exact"] for row in table]
    middle.plot(exact, exact, color="black", linewidth=6, alpha=0.2, label="exact KL")
    for name, marker in (("k1", "o"), ("k2", ""), ("k3", "")):
        color, line = KL_STYLES[name]
        values = [row[f"{name}_expected"] for row in table]
        style = dict(linestyle="none", marker="o", fillstyle="none") if marker else dict(linestyle=line)
        middle.plot(exact, values, color=color, label=f"E[{name}]", **style)
    middle.set_xlabel(r"exact KL($\pi_\theta \| \pi_{ref}$)")
    middle.set_ylabel("expected estimate")
    middle.set_title("values: E[k1] = E[k3] = KL, E[k2] is\nbiased (as losses their gradients differ)", fontsize=9)
    positive = [i for i, value in enumerate(exact) if value > 0]
    for name in ("k1", "k2", "k3"):
        color, line = KL_STYLES[name]
        variances = [table[i][f"{name}_variance"] for i in positive]
        right.plot([exact[i] for i in positive], variances, line, color=color, label=f"Var[{name}]")
    right.set_yscale("log")
    right.set_xlabel(r"exact KL($\pi_\theta \| \pi_{ref}$)")
    right.set_ylabel("per-token variance")
    right.set_title("variance: k3's lowest near $\\pi_{ref}$,\nhighest far away", fontsize=9)
    for ax in (left, middle, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_kl_gradients(shift: float = 1.0, shifts: Sequence[float] | None = None) -> Figure:
    """Which KL each estimator follows when it is used as a loss (course.kl_gradients), on shifted_distributions.

    Left, at one `shift`: each logit's component of the exact gradients of the reverse KL (black) and the
    forward KL (grey dashed), as horizontal bars, and of each loss's expected gradient, as markers.
    Right, across `shifts` (> 0): the distance of each loss's expected gradient from the reverse-KL
    gradient, relative to its norm: 0 for k2 and rho * k3, 1 for k1 (no gradient), and for k3 the
    distance between the two KLs' gradients, which grows from 0 as pi_theta leaves pi_ref.
    """
    shifts = list(shifts) if shifts is not None else torch.linspace(0.1, 3.0, 16).tolist()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    probs, ref_probs = shifted_distributions(shift)
    logits, ref_logits = probs.log(), ref_probs.log()
    exact = exact_kl_gradients(logits, ref_logits)
    outcomes = torch.arange(len(probs), dtype=torch.float64)
    left.hlines(exact["reverse"], outcomes - 0.35, outcomes + 0.35, color="black", linewidth=2, label="reverse KL")
    left.hlines(exact["forward"], outcomes - 0.35, outcomes + 0.35, color="gray", linestyles="--", label="forward KL")
    markers = {"k1": "x", "k2": "o", "k3": "s", "rho_k3": "^"}
    for offset, name in zip((-0.24, -0.08, 0.08, 0.24), KL_LOSSES, strict=True):
        gradient = expected_kl_loss_gradient(name, logits, ref_logits)
        label = "E[grad rho k3]" if name == "rho_k3" else f"E[grad {name}]"
        left.plot(outcomes + offset, gradient, markers[name], color=KL_STYLES[name][0], label=label)
    left.axhline(0.0, color="black", linewidth=0.6)
    left.set_xticks(outcomes.tolist())
    left.set_xlabel("outcome x (the logit the gradient component belongs to)")
    left.set_ylabel("d / d logit")
    left.set_title(f"expected gradient of each KL loss, shift = {shift:g}", fontsize=10)
    table = [kl_gradient_comparison(*(p.log() for p in shifted_distributions(s))) for s in shifts]
    exact_kl = [kl_estimates(*shifted_distributions(s))["exact"] for s in shifts]
    for name in KL_LOSSES:
        color, line = KL_STYLES[name]
        distances = [row[name]["reverse"] for row in table]
        style = dict(linestyle="none", marker="^") if name == "rho_k3" else dict(linestyle=line)
        right.plot(exact_kl, distances, color=color, label="rho k3" if name == "rho_k3" else name, **style)
    right.set_xlabel(r"exact KL($\pi_\theta \| \pi_{ref}$)")
    right.set_ylabel(r"$\|E[\nabla k] - \nabla KL_{rev}\| / \|\nabla KL_{rev}\|$")
    right.set_title("distance from the reverse-KL gradient (k3: the forward KL's)", fontsize=10)
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# --- PPO vs GRPO --------------------------------------------------------------------
def plot_parameter_counts(params: dict[str, dict[str, dict[str, int]]], ax=None) -> Figure:
    """Stacked bars trainable / frozen, one bar per model of each algorithm.

    params: {"grpo": {"policy": {"trainable": int, "frozen": int}, "reference": {...}}, "ppo": {...}}.
    """
    fig = ax.figure if ax is not None else plt.figure(figsize=(6.0, 3.6))
    ax = ax if ax is not None else fig.add_subplot()
    names, trainable, frozen, colors = [], [], [], []
    for algorithm, models in params.items():
        for model, counts in models.items():
            names.append(f"{algorithm}\n{model}")
            trainable.append(counts.get("trainable", 0) / 1e6)
            frozen.append(counts.get("frozen", 0) / 1e6)
            colors.append(ALGORITHM_COLORS.get(algorithm, NEUTRAL))
    x = range(len(names))
    ax.bar(x, trainable, color=colors, label="trainable")
    ax.bar(x, frozen, bottom=trainable, color=colors, alpha=0.35, hatch="//", label="frozen")
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_ylim(0, 1.3 * max([t + f for t, f in zip(trainable, frozen, strict=True)] + [1e-6]))  # room for the legend
    ax.set_ylabel("parameters (millions)")
    ax.set_title("parameters held, per model", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def plot_curves_with_bands(study: dict) -> Figure:
    """Several seeds per algorithm: mean (line) and 95% t-interval (band) of the held-out accuracy against
    completions generated and against training seconds, and of the critic's explained variance.

    study: minigrpo.measuring.measure.compare_with_seeds's result; reads study["bands"] = {name: {"completions",
    "seconds", and for PPO "explained_variance"}: {"x", "mean", "low", "high"}}, "equal_time_seconds": tau}.
    The dotted line on the time panel is tau, where the equal-time accuracy is read.
    """
    bands = study["bands"]
    names = [name for name in bands if isinstance(bands[name], dict)]
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.0))
    panels = (
        ("completions", "completions generated", "held-out accuracy at equal completions"),
        ("seconds", "training seconds (evaluation excluded)", "held-out accuracy at equal wall-clock"),
        ("explained_variance", "completions generated", "critic's explained variance (before each update)"),
    )
    for ax, (key, xlabel, title) in zip(axes, panels, strict=True):
        for name in names:
            if key not in bands[name]:
                continue
            curve, color = bands[name][key], ALGORITHM_COLORS.get(name, NEUTRAL)
            step = None if key == "explained_variance" else "post"  # accuracy at x: the last evaluation before x
            ax.plot(curve["x"], curve["mean"], color=color, label=name, drawstyle="steps-post" if step else "default")
            low = [math.nan if v is None else v for v in curve["low"]]
            high = [math.nan if v is None else v for v in curve["high"]]
            ax.fill_between(curve["x"], low, high, color=color, alpha=0.2, step=step, linewidth=0)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].axvline(bands["equal_time_seconds"], color="black", linestyle=":", linewidth=1)
    axes[2].axhline(0.0, color="black", linewidth=0.8)
    seeds = len(study.get("seeds", []))
    fig.suptitle(f"PPO vs GRPO: mean and 95% interval over {seeds} seeds (model {study.get('model', '?')})")
    fig.tight_layout()
    return fig


# --- where a run's signal went: the diagnostics figure of lessons 06 and 07 -------------
def plot_diagnostics(history: Sequence[dict] | str | Path, title: str | None = None) -> Figure:
    """Where the signal went, per step: three panels that read together. Returns the figure.

    history: trainer.state.log_history (a list of metric dicts), or a path to <output_dir>/metrics.jsonl (PPO's too).

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

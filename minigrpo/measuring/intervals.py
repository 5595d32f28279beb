"""Means over seeds and their 95% intervals, and curves read at the same x across runs (bands).

One training run of an RL algorithm is one draw: its final accuracy moves by several points with the seed alone.
Ranking two algorithms needs several seeds per algorithm and an interval around each mean. The interval here is
Student's t over seeds,

    mean +- t_{0.975, n - 1} * s / sqrt(n)        s: the Bessel-corrected std of the n per-seed values

(with n = 5, t = 2.776: wider than the normal 1.96, as it must be with so few draws). Used by
``minigrpo.measuring.measure`` (bench/ppo_vs_grpo.py, lesson 05). Plain Python: no tensors, no scipy.

Where each run is scored problem by problem (bench/rft_vs_grpo.py, lesson 06b), ``bootstrap_interval`` resamples
both the seeds and the held-out problems.
"""

from __future__ import annotations

import math

import numpy as np


def t_critical_value(confidence: float, df: int) -> float:
    """t such that P(|T| <= t) = confidence for Student's T with df (integer >= 1) degrees of freedom.

    t_critical_value(0.95, 4) = 2.776: the 95% interval of a mean of 5 seeds is mean +- 2.776 s / sqrt(5).
    Found by bisection on the exact central probability (_t_central_probability); no scipy needed.
    """
    if not 0 < confidence < 1 or df < 1:
        raise ValueError(f"confidence={confidence}, df={df}: need 0 < confidence < 1 and df >= 1 (n - 1 seeds).")
    low, high = 0.0, 1.0
    while _t_central_probability(high, df) < confidence:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if _t_central_probability(middle, df) < confidence else (low, middle)
    return (low + high) / 2


def _t_central_probability(t: float, df: int) -> float:
    """P(|T| <= t) for Student's T with an integer df, in closed form (Abramowitz & Stegun 26.7.3-4).

    With theta = atan(t / sqrt(df)), c = cos^2 theta: odd df gives (2/pi) (theta + sin theta cos theta
    (1 + 2/3 c + 2*4/(3*5) c^2 + ...)), even df gives sin theta (1 + 1/2 c + 1*3/(2*4) c^2 + ...).
    """
    theta = math.atan(t / math.sqrt(df))
    c = math.cos(theta) ** 2
    term, total = 1.0, 1.0
    if df % 2 == 1:
        for k in range(1, (df - 1) // 2):  # terms up to c^((df - 3) / 2)
            term *= c * (2 * k) / (2 * k + 1)
            total += term
        series = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2 / math.pi * (theta + series)
    for k in range(1, df // 2):  # terms up to c^((df - 2) / 2)
        term *= c * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def mean_interval(values: list[float], confidence: float = 0.95) -> dict:
    """Mean and its t-interval over seeds: {"mean", "low", "high", "half_width", "n"}.

    half_width = t_{df = n - 1} * s / sqrt(n), with s the Bessel-corrected std of the n values. With one
    value there is no interval (low, high and half_width are NaN): run at least 2 seeds, 5 to rank anything.
    """
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval of no values: run at least one seed.")
    mean = sum(values) / n
    if n == 1:
        return {"mean": mean, "low": math.nan, "high": math.nan, "half_width": math.nan, "n": 1}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half_width = t_critical_value(confidence, n - 1) * std / math.sqrt(n)
    return {"mean": mean, "low": mean - half_width, "high": mean + half_width, "half_width": half_width, "n": n}


def value_at(xs: list[float], ys: list, x: float, start: float):
    """The last y (not None) whose xs <= x: what a run had reached at x; `start` if none yet. (Step function.)"""
    reached = start
    for xi, yi in zip(xs, ys, strict=True):
        if xi > x:
            break
        if yi is not None:
            reached = yi
    return reached


def band(runs: list[dict], x_key: str, y_key: str, grid: list[float], start_key: str | None = None) -> dict:
    """Mean and 95% t-interval over seeds of each run's curve, read at the same x (value_at) on `grid`.

    runs: run_algorithm results; x_key "completions" or "seconds"; y_key "eval_accuracy" or
    "values/explained_variance"; start_key: the run's value at x = 0 ("accuracy_before"), else NaN.
    Returns {"x": grid, "mean", "low", "high"}: lists as long as grid.
    """
    rows = [
        [value_at(r["curve"][x_key], r["curve"][y_key], x, r[start_key] if start_key else math.nan) for r in runs]
        for x in grid
    ]
    intervals = [mean_interval(row) for row in rows]
    return {"x": list(grid), **{k: [i[k] for i in intervals] for k in ("mean", "low", "high")}}


def bootstrap_interval(
    values: list[list[float]], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> dict:
    """Mean of a seeds x problems table and its bootstrap interval over both: {"mean", "low", "high", "n_seeds",
    "n_problems"}.

    values[s][p]: one run's (seed s) figure on held-out problem p (say, 1.0 if its greedy answer is right, or its
    pass@k). Each resample draws the seeds with replacement and, independently, the problems with replacement (the
    same problems for every seed drawn: the design is crossed), and takes the mean of the chosen cells; the interval
    is the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of the resampled means (percentile bootstrap).
    Both sources of spread count: which seed trained the model, and which problems the test happened to hold.
    Pass a table of differences (run A minus run B, seed by seed) for the interval of a difference."""
    table = np.asarray(values, dtype=float)  # (S, P)
    if table.ndim != 2 or table.size == 0:
        raise ValueError(f"values has shape {table.shape}: give one list per seed, one value per problem.")
    S, P = table.shape
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, S, size=(resamples, S))  # (R, S)
    problems = rng.integers(0, P, size=(resamples, P))  # (R, P)
    means = np.array([table[np.ix_(s, p)].mean() for s, p in zip(seeds, problems, strict=True)])  # (R,)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"mean": float(table.mean()), "low": float(low), "high": float(high), "n_seeds": S, "n_problems": P}

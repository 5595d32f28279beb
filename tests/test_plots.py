"""minigrpo.course.plots: each figure shows the package's numbers (read back from the artists), hand-checked."""

import json
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minigrpo.advantages import group_relative_advantages  # noqa: E402
from minigrpo.course.kl_gradients import exact_kl_gradients, expected_kl_loss_gradient  # noqa: E402
from minigrpo.course.plots import (  # noqa: E402
    DEFAULT_CURVE_KEYS,
    clipped_objective_curves,
    kl_estimates,
    kl_estimator_curves,
    load_history,
    metric_series,
    plot_clipped_objective,
    plot_diagnostics,  # noqa: E402
    plot_group_advantages,
    plot_kl_estimators,
    plot_kl_gradients,
    plot_parameter_counts,
    plot_training_curves,
    plot_variant_comparison,
    shifted_distributions,
)
from minigrpo.losses import clipped_surrogate  # noqa: E402
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_REWARDS  # noqa: E402

WORKED = list(WORKED_EXAMPLE_REWARDS)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def visible_axes(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


# --- training curves ----------------------------------------------------------------------
HISTORY = [
    {"step": 1, "reward": 0.5, "kl": 0.0, "entropy": 1.5, "loss": 0.0},
    {"step": 2, "reward": 0.6, "kl": 0.01, "entropy": 1.4, "loss": 0.1, "eval_accuracy": 0.4},
    {"step": 3, "reward": 0.8, "kl": 0.02, "entropy": 1.2, "loss": 0.2},
    {"step": 4, "reward": 0.9, "kl": 0.03, "entropy": 1.1, "loss": 0.3, "eval_accuracy": 0.7},
]


def test_training_curves_plot_the_logged_values_and_skip_absent_keys():
    fig = plot_training_curves(HISTORY, title="run")
    axes = {ax.get_title(): ax for ax in visible_axes(fig)}
    assert set(axes) == {"reward", "eval_accuracy", "kl", "entropy"}  # clip ratio, lengths... are absent
    x, y = axes["reward"].lines[0].get_data()
    assert list(x) == [1, 2, 3, 4] and list(y) == pytest.approx([0.5, 0.6, 0.8, 0.9], abs=1e-12)
    x, y = axes["eval_accuracy"].lines[0].get_data()
    assert list(x) == [2, 4] and list(y) == pytest.approx([0.4, 0.7], abs=1e-12)  # only where it was logged
    assert fig._suptitle.get_text() == "run"


def test_training_curves_read_metrics_jsonl_and_custom_keys(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in HISTORY))
    assert load_history(path) == HISTORY
    fig = plot_training_curves(str(path), keys=["loss", "not_logged"])
    (ax,) = visible_axes(fig)
    assert ax.get_title() == "loss"
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.0, 0.1, 0.2, 0.3], abs=1e-12)


def test_metric_series_uses_the_index_when_there_is_no_step_and_skips_nan():
    steps, values = metric_series([{"kl": 1.0}, {"kl": math.nan}, {"kl": 3.0}], "kl")
    assert steps == [1, 3] and values == [1.0, 3.0]
    assert "frac_reward_zero_std" in DEFAULT_CURVE_KEYS and DEFAULT_CURVE_KEYS[0] == "reward"


def integer_ticks(ax) -> bool:
    return all(float(tick).is_integer() for tick in ax.get_xticks())


def test_step_axes_have_integer_ticks_only():
    # 4 steps: matplotlib's default locator would put ticks at 1.0, 1.5, 2.0, ...
    assert all(integer_ticks(ax) for ax in visible_axes(plot_training_curves(HISTORY)))
    assert all(integer_ticks(ax) for ax in plot_variant_comparison({"a": HISTORY}, ["reward"]).axes)
    assert all(integer_ticks(ax) for ax in plot_diagnostics(DIAGNOSTICS).axes)
    default = plt.figure().add_subplot()
    default.plot([1, 2, 3, 4], [0, 1, 0, 1])
    assert not integer_ticks(default)  # so the checks above can fail


def test_training_curves_with_no_known_metric_still_make_a_figure():
    fig = plot_training_curves([{"step": 1}])
    assert fig.axes[0].texts[0].get_text() == "no metrics to plot"


# --- diagnostics --------------------------------------------------------------------------
DIAGNOSTICS = [
    {"step": 1, "frac_reward_zero_std": 0.5, "frac_reward_zero_std/all_correct": 0.0,
     "frac_reward_zero_std/all_wrong": 0.5, "advantages/std": 0.5, "completions/distinct_per_group": 6.0},
    {"step": 2, "frac_reward_zero_std": 0.25, "frac_reward_zero_std/all_correct": 0.125,
     "frac_reward_zero_std/all_wrong": 0.125, "advantages/std": 0.75, "completions/distinct_per_group": 4.5},
    {"step": 3, "frac_reward_zero_std": 0.75, "frac_reward_zero_std/all_correct": 0.625,
     "frac_reward_zero_std/all_wrong": 0.125, "advantages/std": 0.25, "completions/distinct_per_group": 1.5},
]  # fmt: skip


def test_plot_diagnostics_stacks_the_split_under_the_total_and_draws_the_logged_values():
    zero_std, advantage, distinct = plot_diagnostics(DIAGNOSTICS, title="run").axes
    wrong, correct = zero_std.collections  # the stack: all wrong at the bottom, all correct on top of it
    top = lambda band: {(x, y) for x, y in band.get_paths()[0].vertices.tolist()}  # noqa: E731
    assert {(1.0, 0.5), (2.0, 0.125), (3.0, 0.125)} <= top(wrong)
    assert {(1.0, 0.5), (2.0, 0.25), (3.0, 0.75)} <= top(correct)  # the stack's top is the total
    (total,) = zero_std.lines
    assert list(total.get_ydata()) == [0.5, 0.25, 0.75]
    assert [t.get_text() for t in zero_std.get_legend().get_texts()] == [
        "all wrong", "all correct", "frac_reward_zero_std"
    ]  # fmt: skip
    measured, reference = advantage.lines
    assert list(measured.get_ydata()) == [0.5, 0.75, 0.25]
    assert list(reference.get_ydata()) == [0.5, 0.75, 0.25]  # 1 - frac_reward_zero_std: group scaling's value
    line, collapse = distinct.lines
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [6.0, 4.5, 1.5]
    assert list(collapse.get_ydata()) == [1.0, 1.0]  # the line at 1: one answer G times


def test_plot_diagnostics_reads_a_file_and_notes_what_was_not_logged(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "frac_reward_zero_std": 0.5}) + "\n")  # a TRL-style log: no split
    zero_std, advantage, distinct = plot_diagnostics(path).axes
    assert not zero_std.collections and list(zero_std.lines[0].get_ydata()) == [0.5]
    assert advantage.texts[0].get_text() == "advantages/std\nnot logged"
    assert distinct.texts[0].get_text() == "completions/distinct_per_group\nnot logged"


# --- advantages ---------------------------------------------------------------------------
def test_group_advantages_bars_are_the_package_advantages_of_the_worked_example():
    fig = plot_group_advantages(WORKED)
    (ax,) = fig.axes
    heights = [bar.get_height() for bar in ax.patches]
    assert heights[0] == pytest.approx(1.347914, abs=1e-5)
    assert heights[1] == pytest.approx(0.149768, abs=1e-5)
    assert heights[2] == pytest.approx(-1.048378, abs=1e-5)
    labels = [t.get_text() for t in ax.texts]
    assert labels[:3] == ["A=+1.35\nr=2", "A=+0.15\nr=1", "r=0\nA=-1.05"]  # A by the bar's end, then r
    assert labels == [
        f"A={a:+.2f}\nr={r:g}" if a > 0 else f"r={r:g}\nA={a:+.2f}" for a, r in zip(heights, WORKED, strict=True)
    ]
    assert "0.875" in ax.get_title()


def test_group_advantages_several_groups_given_advantages_and_labels():
    rewards = torch.tensor([WORKED, [1.0] * 8])  # (2, 8)
    expected = group_relative_advantages(rewards, scale_rewards="none")
    fig = plot_group_advantages(rewards, expected, labels=list("abcdefgh"), title="two groups")
    assert len(fig.axes) == 2
    for ax, row in zip(fig.axes, expected, strict=True):
        assert [bar.get_height() for bar in ax.patches] == pytest.approx(row.tolist(), abs=1e-6)
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == list("abcdefgh")
    assert all(bar.get_height() == 0.0 for bar in fig.axes[1].patches)  # a constant group: zero, not NaN
    assert {t.get_text() for t in fig.axes[1].texts} == {"A=0\nr=1"}


# --- clipping -----------------------------------------------------------------------------
def test_clipped_objective_curves_match_clipped_surrogate_and_flag_the_flat_part():
    ratio = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5])
    up = clipped_objective_curves(ratio, 1.0, epsilon=0.2)
    assert up["clipped"].tolist() == pytest.approx([0.5, 0.9, 1.0, 1.1, 1.2], abs=1e-6)
    assert up["no_gradient"].tolist() == [False, False, False, False, True]
    down = clipped_objective_curves(ratio, -1.0, epsilon=0.2, epsilon_high=0.28)
    assert down["clipped"].tolist() == pytest.approx([-0.8, -0.9, -1.0, -1.1, -1.5], abs=1e-6)
    assert down["no_gradient"].tolist() == [True, False, False, False, False]


def test_plot_clipped_objective_lines_are_the_package_surrogate():
    fig = plot_clipped_objective(epsilon=0.2, epsilon_high=0.28)
    assert len(fig.axes) == 2
    positive, negative = fig.axes
    ratio, clipped = positive.lines[1].get_data()
    expected = clipped_surrogate(torch.as_tensor(ratio).unsqueeze(1), torch.ones(len(ratio)), 0.2, 0.28).squeeze(1)
    assert list(clipped) == pytest.approx(expected.tolist(), abs=1e-6)
    assert max(clipped) == pytest.approx(1.28, abs=1e-6)  # clip-higher: the A > 0 side stops at 1 + eps_high
    assert min(negative.lines[1].get_ydata()) == pytest.approx(-2.0, abs=1e-6)  # A < 0 is not clipped above
    band = positive.patches[0]  # the shaded clip range: a Rectangle (matplotlib 3.9+) or a Polygon (3.8)
    band_x = band.get_patch_transform().transform(band.get_path().vertices)[:, 0]
    assert (band_x.min(), band_x.max()) == pytest.approx((0.8, 1.28))


# --- KL -------------------------------------------------------------------------------------
def test_kl_estimator_curves_hand_values():
    curves = kl_estimator_curves(torch.tensor([0.5, 0.0, -0.5]))
    assert curves["k1"].tolist() == pytest.approx([-0.5, 0.0, 0.5], abs=1e-6)
    assert curves["k2"].tolist() == pytest.approx([0.125, 0.0, 0.125], abs=1e-6)
    assert curves["k3"].tolist() == pytest.approx([math.exp(0.5) - 1.5, 0.0, math.exp(-0.5) - 0.5], abs=1e-6)


def test_kl_estimates_k1_and_k3_are_unbiased_on_a_small_distribution():
    p, q = [0.5, 0.3, 0.2], [0.4, 0.4, 0.2]
    exact = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)  # 0.025267
    result = kl_estimates(p, q, num_samples=20000, seed=0)
    assert result["exact"] == pytest.approx(exact, abs=1e-12)
    assert result["k1_expected"] == pytest.approx(exact, abs=1e-12)
    assert result["k3_expected"] == pytest.approx(exact, abs=1e-12)
    k2 = 0.5 * (0.5 * math.log(0.8) ** 2 + 0.3 * math.log(4 / 3) ** 2)
    assert result["k2_expected"] == pytest.approx(k2, abs=1e-12) and abs(k2 - exact) > 1e-4
    assert result["k3_mean"] == pytest.approx(exact, abs=0.003)  # 20000 samples
    assert result["k3_std"] < result["k1_std"]  # the point of k3: lower variance (near pi_ref)


def test_kl_estimates_variances_by_hand():
    p, q = [0.5, 0.3, 0.2], [0.4, 0.4, 0.2]
    k1 = [math.log(0.5 / 0.4), math.log(0.3 / 0.4), 0.0]  # log(p / q) per outcome
    mean = sum(pi * k for pi, k in zip(p, k1, strict=True))
    variance = sum(pi * (k - mean) ** 2 for pi, k in zip(p, k1, strict=True))  # 0.049086
    result = kl_estimates(p, q, num_samples=20000, seed=0)
    assert result["k1_variance"] == pytest.approx(variance, abs=1e-12)
    assert result["k1_variance"] == pytest.approx(0.049086, abs=1e-6)
    assert result["k3_variance"] == pytest.approx(0.000255, abs=1e-6)  # ~190x less than k1 this close to pi_ref
    assert result["k1_std"] ** 2 == pytest.approx(result["k1_variance"], rel=0.05)  # the sampled spread agrees
    assert kl_estimates(p, p)["k3_variance"] == 0.0


def test_kl_estimates_k3_variance_overtakes_k1_far_from_the_reference():
    near, far = kl_estimates(*shifted_distributions(0.5)), kl_estimates(*shifted_distributions(3.0))
    assert near["k3_variance"] < near["k2_variance"] < near["k1_variance"]
    assert far["k3_variance"] > far["k1_variance"] > far["k2_variance"]


def test_plot_kl_estimators_panels_use_the_expectations_and_variances():
    fig = plot_kl_estimators(shifts=[0.0, 1.0, 2.0])
    left, middle, right = fig.axes
    assert [line.get_label() for line in left.lines[:3]] == ["k1", "k2", "k3"]
    assert [line.get_label() for line in middle.lines] == ["exact KL", "E[k1]", "E[k2]", "E[k3]"]
    exact_x, exact_y = middle.lines[0].get_data()
    k3_x, k3_y = middle.lines[3].get_data()
    assert list(k3_y) == pytest.approx(list(exact_y), abs=1e-12)
    expected = [kl_estimates(*shifted_distributions(s))["exact"] for s in (0.0, 1.0, 2.0)]
    assert list(exact_x) == pytest.approx(expected, abs=1e-12) and expected[0] == pytest.approx(0.0, abs=1e-12)
    assert "biased" in middle.get_title() and "unbiased; k2 is not" not in middle.get_title()
    assert right.get_yscale() == "log" and [line.get_label() for line in right.lines] == [
        "Var[k1]",
        "Var[k2]",
        "Var[k3]",
    ]
    var_x, var_k1 = right.lines[0].get_data()
    assert list(var_x) == pytest.approx(expected[1:], abs=1e-12)  # shift 0 (variance 0) is left out of the log axis
    assert list(var_k1) == pytest.approx(
        [kl_estimates(*shifted_distributions(s))["k1_variance"] for s in (1.0, 2.0)], abs=1e-12
    )


def test_plot_kl_gradients_show_the_expected_gradients_of_the_package():
    fig = plot_kl_gradients(shift=1.0, shifts=[0.5, 1.0])
    left, right = fig.axes
    probs, ref_probs = shifted_distributions(1.0)
    k3 = expected_kl_loss_gradient("k3", probs.log(), ref_probs.log())
    markers = {line.get_label(): line for line in left.lines}
    assert list(markers["E[grad k3]"].get_ydata()) == pytest.approx(k3.tolist(), abs=1e-12)
    assert list(markers["E[grad k1]"].get_ydata()) == pytest.approx([0.0] * 5, abs=1e-12)
    forward = exact_kl_gradients(probs.log(), ref_probs.log())["forward"]
    assert [segment[0][1] for segment in left.collections[1].get_segments()] == pytest.approx(forward.tolist())
    distances = {line.get_label(): list(line.get_ydata()) for line in right.lines}
    assert distances["k1"] == pytest.approx([1.0, 1.0]) and distances["rho k3"] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert distances["k3"][1] == pytest.approx(0.2756, abs=1e-4)  # k3 follows the forward KL, 28% away at shift 1


# --- PPO vs GRPO --------------------------------------------------------------------------
PARAMS = {
    "grpo": {"policy": {"trainable": 250_000, "frozen": 0}, "reference": {"trainable": 0, "frozen": 250_000}},
    "ppo": {
        "policy": {"trainable": 250_000, "frozen": 0},
        "reference": {"trainable": 0, "frozen": 250_000},
        "critic": {"trainable": 240_000, "frozen": 0},
    },
}


def test_plot_parameter_counts_shows_each_model_of_each_algorithm():
    ax = plot_parameter_counts(PARAMS).axes[0]
    assert ax.get_title() == "parameters held, per model"
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "grpo\npolicy",
        "grpo\nreference",
        "ppo\npolicy",
        "ppo\nreference",
        "ppo\ncritic",
    ]
    heights = [bar.get_height() for bar in ax.patches]  # 5 trainable bars, then 5 frozen bars (millions)
    assert heights == pytest.approx([0.25, 0.0, 0.25, 0.0, 0.24, 0.0, 0.25, 0.0, 0.25, 0.0], abs=1e-12)


def test_plot_variant_comparison_draws_one_line_per_run():
    histories = {"a": [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}], "b": [{"step": 1, "reward": 0.3}]}
    fig = plot_variant_comparison(histories, ["reward", "kl"], title="t")
    reward_ax, kl_ax = fig.axes
    assert [line.get_label() for line in reward_ax.lines] == ["a", "b"]
    assert reward_ax.lines[0].get_ydata().tolist() == [0.1, 0.2]
    assert len(kl_ax.lines) == 0  # no run logged kl: an empty panel, not an error

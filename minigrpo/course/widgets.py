"""Interactive explorers for the notebooks (ipywidgets): group advantages, clipping, KL estimators.

The numbers behind each explorer come from plain functions here
(``advantage_table``, ``clipping_table``, ``kl_table``) that are unit-tested
and print as plain text; an explorer only wires sliders and toggles to them
and redraws a figure from ``minigrpo.course.plots``. ipywidgets is imported only when
an explorer is built, so ``import minigrpo`` (and these functions) never need it.

    explorer = group_advantage_explorer()   # last line of a cell: displays itself
    explorer.controls["scale_rewards"].value = "none"   # the same as clicking
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from minigrpo.advantages import group_relative_advantages, reward_scale
from minigrpo.course.plots import (
    clipped_objective_curves,
    kl_estimates,
    plot_clipped_objective,
    plot_group_advantages,
    plot_kl_estimators,
    shifted_distributions,
)
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_COMPLETIONS, WORKED_EXAMPLE_REWARDS


# --- the computations (plain functions) -------------------------------------------------
def advantage_table(
    rewards: Sequence[float],
    scale_rewards: str = "group",
    baseline: str = "mean",
    ddof: int = 1,
    eps: float = 1e-4,
) -> dict:
    """One group's advantages under the chosen options, with the pieces that make them.

    rewards: G numbers (one group). Returns {"rewards": [G], "mean": float,
    "scale": float (the denominator std + eps, or 1 for "none"), "advantages": [G],
    "sum": float (0 for the mean baseline)}. Computed by group_relative_advantages.
    """
    grouped = torch.tensor([list(rewards)], dtype=torch.float64)  # (1, G)
    advantages = group_relative_advantages(grouped, scale_rewards, baseline, ddof, eps)[0]  # (G,)
    return {
        "rewards": grouped[0].tolist(),
        "mean": grouped.mean().item(),
        "scale": reward_scale(grouped, scale_rewards, ddof, eps).item(),
        "advantages": advantages.tolist(),
        "sum": advantages.sum().item(),
    }


def format_advantage_table(table: dict, labels: Sequence[str] | None = None, digits: int = 4) -> str:
    """advantage_table's result as aligned plain text (deterministic: fixed decimals)."""
    G = len(table["rewards"])
    labels = list(labels) if labels is not None else [f"o{g + 1}" for g in range(G)]
    width = max(len(label) for label in labels)
    lines = [f"mean reward {table['mean']:.{digits}f} | scale {table['scale']:.{digits}f}"]
    lines += [
        f"{label:<{width}}  r = {r:g}  A = {_rounded(a, digits):+.{digits}f}"
        for label, r, a in zip(labels, table["rewards"], table["advantages"], strict=True)
    ]
    lines.append(f"sum of advantages {_rounded(table['sum'], digits):.{digits}f}")
    return "\n".join(lines)


def _rounded(value: float, digits: int) -> float:
    """value rounded to `digits`, with -0.0 turned into 0.0 (so a printed table is the same on every machine)."""
    return round(value, digits) + 0.0


def clipping_table(
    ratios: Sequence[float], advantage: float, epsilon: float = 0.2, epsilon_high: float | None = None
) -> list[dict]:
    """The clipped surrogate at a few ratios, and whether each still gets a gradient.

    Returns one dict per ratio: {"ratio", "unclipped" (rho A), "clipped" (the surrogate),
    "gradient" (d surrogate / d rho: A, or 0 where the clip switches it off)}.
    """
    ratio = torch.tensor(list(ratios), dtype=torch.float64)  # (R,)
    curves = clipped_objective_curves(ratio, advantage, epsilon, epsilon_high)
    rows = []
    for r, u, c, flat in zip(
        ratio.tolist(),
        curves["unclipped"].tolist(),
        curves["clipped"].tolist(),
        curves["no_gradient"].tolist(),
        strict=True,
    ):
        rows.append({"ratio": r, "unclipped": u, "clipped": c, "gradient": 0.0 if flat else float(advantage)})
    return rows


def format_clipping_table(rows: list[dict], digits: int = 3) -> str:
    lines = ["ratio  rho*A    surrogate  gradient"]
    lines += [
        f"{row['ratio']:<5.2f}  {row['unclipped']:+.{digits}f}  {row['clipped']:+.{digits}f}     "
        f"{row['gradient']:+.{digits}f}"
        for row in rows
    ]
    return "\n".join(lines)


def kl_table(shift: float, num_samples: int = 1000, seed: int = 0) -> dict[str, float]:
    """kl_estimates for the pair shifted_distributions(shift): exact KL, each estimator's
    expectation, and its sample mean / std over num_samples tokens from pi_theta."""
    probs, ref_probs = shifted_distributions(shift)
    return kl_estimates(probs, ref_probs, num_samples=num_samples, seed=seed)


def format_kl_table(table: dict[str, float], digits: int = 4) -> str:
    lines = [f"exact KL {table['exact']:.{digits}f}", "estimator  expected   sample mean  sample std"]
    for name in ("k1", "k2", "k3"):
        mean = table.get(f"{name}_mean", float("nan"))
        std = table.get(f"{name}_std", float("nan"))
        lines.append(f"{name:<9}  {table[f'{name}_expected']:.{digits}f}     {mean:.{digits}f}       {std:.{digits}f}")
    return "\n".join(lines)


# --- the explorers (ipywidgets) ---------------------------------------------------------
# Readable at any notebook width, in ipywidgets 7 (Colab) and 8 (JupyterLab 4, Notebook 7): every label as wide as
# its text, never cut short; toggle buttons as wide as their text, in one row beside their label; a row of controls
# that does not fit wraps whole controls onto the next line instead of squeezing a slider's track to nothing.
LABEL_STYLE = {"description_width": "initial"}
ROW = {"flex_flow": "row wrap", "align_items": "center"}


def slider(kind: str, description: str, width: str = "300px", **options):
    """An ipywidgets FloatSlider or IntSlider (kind) whose label is never cut and which never shrinks.

    It reports its value when the mouse is released (continuous_update=False): a redraw on every pixel of a drag
    queues dozens of figures on a slow kernel, each shown for a moment after the table has moved on.
    """
    import ipywidgets as widgets

    layout = widgets.Layout(width=width, flex="0 0 auto")
    style = dict(LABEL_STYLE)
    return getattr(widgets, kind)(
        description=description, style=style, layout=layout, continuous_update=False, **options
    )


def toggle_buttons(description: str, options: list, **kwargs):
    """An ipywidgets ToggleButtons whose buttons fit their text and stay in one row beside the label."""
    import ipywidgets as widgets

    style = {**LABEL_STYLE, "button_width": "auto"}
    # display flex: ipywidgets 8 lays a ToggleButtons out as a block, its label above the buttons; 7 as a flex row.
    layout = widgets.Layout(
        display="flex", align_items="baseline", width="auto", flex="0 0 auto", margin="2px 16px 2px 0"
    )
    return widgets.ToggleButtons(description=description, options=options, style=style, layout=layout, **kwargs)


class Explorer:
    """Controls + a text panel (plain text, <pre>) + a figure, redrawn on every change.

    controls: name -> ipywidgets control; text: the HTML widget showing the table;
    widget: the whole box (displayed when the Explorer is the last value of a cell): the sliders, then the toggle
    buttons, each in a row that wraps, then the table, then the figure.
    """

    def __init__(self, controls: dict, compute_text: Callable[..., str], draw: Callable[..., object] | None):
        import ipywidgets as widgets

        self.controls = controls
        self._compute_text, self._draw = compute_text, draw
        self.text = widgets.HTML()
        self.figure = widgets.Output()
        for control in controls.values():
            control.observe(lambda change: self.update(), names="value")
        toggles = [control for control in controls.values() if isinstance(control, widgets.ToggleButtons)]
        sliders = [control for control in controls.values() if control not in toggles]
        rows = [widgets.HBox(group, layout=widgets.Layout(**ROW)) for group in (sliders, toggles) if group]
        self.widget = widgets.VBox([*rows, self.text, self.figure])
        self.update()

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def update(self) -> None:
        values = self.values()
        self.text.value = f"<pre>{self._compute_text(**values)}</pre>"
        if self._draw is not None:
            import matplotlib.pyplot as plt
            from IPython.display import display

            with self.figure:
                self.figure.clear_output(wait=True)
                fig = self._draw(**values)
                display(fig)
                plt.close(fig)

    def _ipython_display_(self):
        # Display the box itself: works with ipywidgets 7 (Colab's, which has no _repr_mimebundle_) and 8.
        from IPython.display import display

        display(self.widget)


def group_advantage_explorer(
    rewards: Sequence[float] = WORKED_EXAMPLE_REWARDS,
    labels: Sequence[str] | None = None,
    max_reward: float = 2.0,
    draw: bool = True,
) -> Explorer:
    """G reward sliders and the advantage options; the table and bar chart follow every change."""

    rewards = list(rewards)
    if labels is None and len(rewards) == len(WORKED_EXAMPLE_COMPLETIONS):
        labels = [f"o{g + 1}" for g in range(len(rewards))]
    controls = {
        f"r{g}": slider("FloatSlider", f"r{g + 1}", "220px", value=r, min=0.0, max=max_reward, step=0.5)
        for g, r in enumerate(rewards)
    }
    controls["scale_rewards"] = toggle_buttons("scale", ["group", "batch", "none"])
    controls["baseline"] = toggle_buttons("baseline", ["mean", "rloo"])
    controls["ddof"] = toggle_buttons("std", [("Bessel (ddof=1)", 1), ("population (ddof=0)", 0)], value=1)
    G = len(rewards)

    def split(values: dict) -> tuple[list[float], dict]:
        group = [values.pop(f"r{g}") for g in range(G)]
        return group, values

    def text(**values) -> str:
        group, options = split(values)
        return format_advantage_table(advantage_table(group, **options), labels)

    def figure(**values):
        group, options = split(values)
        table = advantage_table(group, **options)
        return plot_group_advantages(group, table["advantages"], labels)

    return Explorer(controls, text, figure if draw else None)


def clipping_explorer(ratios: Sequence[float] = (0.6, 0.8, 1.0, 1.2, 1.4), draw: bool = True) -> Explorer:
    """epsilon, epsilon_high and the advantage's sign; the surrogate table and curve follow."""

    controls = {
        "epsilon": slider("FloatSlider", "epsilon", value=0.2, min=0.0, max=0.5, step=0.02),
        "epsilon_high": slider("FloatSlider", "epsilon_high", value=0.2, min=0.0, max=0.5, step=0.02),
        "advantage": toggle_buttons("sign", [("A > 0", 1.0), ("A < 0", -1.0)], value=1.0),
    }

    def text(epsilon, epsilon_high, advantage) -> str:
        return format_clipping_table(clipping_table(ratios, advantage, epsilon, epsilon_high))

    def figure(epsilon, epsilon_high, advantage):
        return plot_clipped_objective(epsilon, epsilon_high, advantages=(advantage,))

    return Explorer(controls, text, figure if draw else None)


def kl_explorer(draw: bool = True) -> Explorer:
    """How far pi_theta has drifted from pi_ref (shift) and the sample size; exact KL vs k1 / k2 / k3."""

    controls = {
        "shift": slider("FloatSlider", "shift", value=1.0, min=0.0, max=3.0, step=0.1),
        "num_samples": slider("IntSlider", "samples", value=100, min=10, max=5000, step=10),
    }

    def text(shift, num_samples) -> str:
        return format_kl_table(kl_table(shift, num_samples))

    def figure(shift, num_samples):
        return plot_kl_estimators(log_ratio_max=max(0.5, 1.5 * shift), shifts=[s * shift / 20 for s in range(21)])

    return Explorer(controls, text, figure if draw else None)

"""minigrpo.course.widgets: the plain functions behind each explorer (hand values) and the wiring of the controls."""

import ast
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from minigrpo.course.widgets import (  # noqa: E402
    advantage_table,
    clipping_explorer,
    clipping_table,
    format_advantage_table,
    format_clipping_table,
    format_kl_table,
    group_advantage_explorer,
    kl_explorer,
    kl_table,
)
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_REWARDS  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


# --- the plain functions ------------------------------------------------------------------
def test_advantage_table_worked_example_bessel():
    table = advantage_table(WORKED_EXAMPLE_REWARDS)
    assert table["mean"] == pytest.approx(0.875, abs=1e-12)
    assert table["scale"] == pytest.approx((4.875 / 7) ** 0.5 + 1e-4, abs=1e-9)  # sum of squares 4.875, ddof=1
    assert table["advantages"][:3] == pytest.approx([1.347914, 0.149768, -1.048378], abs=1e-6)
    assert table["sum"] == pytest.approx(0.0, abs=1e-9)


def test_advantage_table_options_population_none_rloo():
    population = advantage_table(WORKED_EXAMPLE_REWARDS, ddof=0)
    assert population["scale"] == pytest.approx((4.875 / 8) ** 0.5 + 1e-4, abs=1e-9)
    assert population["advantages"][0] == pytest.approx(1.125 / ((4.875 / 8) ** 0.5 + 1e-4), abs=1e-9)
    none = advantage_table(WORKED_EXAMPLE_REWARDS, scale_rewards="none")
    assert none["scale"] == 1.0 and none["advantages"][:3] == pytest.approx([1.125, 0.125, -0.875], abs=1e-12)
    rloo = advantage_table(WORKED_EXAMPLE_REWARDS, scale_rewards="none", baseline="rloo")
    assert rloo["advantages"][:3] == pytest.approx([2 - 5 / 7, 1 - 6 / 7, 0 - 7 / 7], abs=1e-12)


def test_advantage_table_constant_group_is_zero_not_nan():
    for rewards in ([0.0] * 8, [2.0] * 8):
        table = advantage_table(rewards)
        assert table["advantages"] == [0.0] * 8


def test_format_advantage_table_is_plain_deterministic_text():
    text = format_advantage_table(advantage_table(WORKED_EXAMPLE_REWARDS))
    lines = text.splitlines()
    assert lines[0] == "mean reward 0.8750 | scale 0.8346"
    assert lines[1] == "o1  r = 2  A = +1.3479"
    assert lines[3] == "o3  r = 0  A = -1.0484"
    assert lines[-1] == "sum of advantages 0.0000"  # never "-0.0000"
    assert (
        format_advantage_table(advantage_table([1, 1]), labels=["yes", "no"]).splitlines()[1]
        == "yes  r = 1  A = +0.0000"
    )


def test_clipping_table_values_and_gradients():
    up = clipping_table([0.7, 1.0, 1.3], 1.0, epsilon=0.2)
    assert [row["clipped"] for row in up] == pytest.approx([0.7, 1.0, 1.2], abs=1e-12)
    assert [row["gradient"] for row in up] == [1.0, 1.0, 0.0]
    down = clipping_table([0.7, 1.0, 1.3], -1.0, epsilon=0.2, epsilon_high=0.28)
    assert [row["clipped"] for row in down] == pytest.approx([-0.8, -1.0, -1.3], abs=1e-12)
    assert [row["gradient"] for row in down] == [0.0, -1.0, -1.0]
    assert format_clipping_table(up).splitlines()[-1] == "1.30   +1.300  +1.200     +0.000"


def test_kl_table_exact_and_expectations():
    zero = kl_table(0.0, num_samples=50)
    assert zero["exact"] == pytest.approx(0.0, abs=1e-12) and zero["k3_mean"] == pytest.approx(0.0, abs=1e-12)
    table = kl_table(1.5, num_samples=2000)
    assert table["k1_expected"] == pytest.approx(table["exact"], abs=1e-12)
    assert table["k3_expected"] == pytest.approx(table["exact"], abs=1e-12)
    assert table["k3_std"] < table["k1_std"]
    text = format_kl_table(table)
    assert text.splitlines()[0] == f"exact KL {table['exact']:.4f}" and len(text.splitlines()) == 5


# --- the explorers: changing a control updates the output -----------------------------------
def test_group_advantage_explorer_updates_live():
    explorer = group_advantage_explorer(draw=False)
    assert "A = +1.3479" in explorer.text.value and "scale 0.8346" in explorer.text.value
    explorer.controls["scale_rewards"].value = "none"
    assert "A = +1.1250" in explorer.text.value and "scale 1.0000" in explorer.text.value
    explorer.controls["baseline"].value = "rloo"
    assert "A = +1.2857" in explorer.text.value
    for g in range(8):
        explorer.controls[f"r{g}"].value = 2.0  # all correct: no signal
    assert explorer.text.value.count("A = +0.0000") == 8
    assert "nan" not in explorer.text.value.lower()


def test_group_advantage_explorer_ddof_toggle_and_figure(monkeypatch):
    explorer = group_advantage_explorer()
    explorer.controls["ddof"].value = 0
    expected = advantage_table(WORKED_EXAMPLE_REWARDS, ddof=0)["advantages"][0]
    assert f"A = {expected:+.4f}" in explorer.text.value
    assert explorer.widget.children[-1] is explorer.figure  # the figure sits under the table
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objects: shown.extend(objects))
    explorer._ipython_display_()  # what Jupyter calls when the explorer ends a cell
    assert shown == [explorer.widget]


def test_clipping_explorer_follows_epsilon_and_sign():
    explorer = clipping_explorer(ratios=(1.4,), draw=False)
    assert "+1.200" in explorer.text.value  # clipped at 1 + 0.2
    explorer.controls["epsilon_high"].value = 0.3
    assert "+1.300" in explorer.text.value
    explorer.controls["advantage"].value = -1.0
    assert "-1.400" in explorer.text.value.splitlines()[-1]  # A < 0: the high side is not clipped
    clipping_explorer()  # with its figure


def test_kl_explorer_follows_shift():
    explorer = kl_explorer(draw=False)
    explorer.controls["shift"].value = 0.0
    assert "exact KL 0.0000" in explorer.text.value
    explorer.controls["shift"].value = 2.0
    assert f"exact KL {kl_table(2.0)['exact']:.4f}" in explorer.text.value
    kl_explorer()  # with its figure


def test_explorer_controls_keep_their_labels_and_rows_readable():
    """The kernel side of the layout tests/test_browser.py checks in a browser, the same in ipywidgets 7.7 (Colab's)
    and 8: labels as wide as their text, toggle buttons as wide as theirs and beside their label, rows that wrap
    whole controls."""
    import ipywidgets as widgets

    for explorer in (group_advantage_explorer(draw=False), clipping_explorer(draw=False), kl_explorer(draw=False)):
        *rows, text, figure = explorer.widget.children
        assert (text, figure) == (explorer.text, explorer.figure)
        assert all(row.layout.flex_flow == "row wrap" for row in rows)
        shown = [control for row in rows for control in row.children]
        assert sorted(map(id, shown)) == sorted(map(id, explorer.controls.values()))  # each control once
        for control in explorer.controls.values():
            assert control.style.description_width == "initial" and control.layout.flex == "0 0 auto"
            if isinstance(control, widgets.ToggleButtons):
                assert control.style.button_width == "auto" and control.layout.display == "flex"
            else:
                assert control.continuous_update is False  # one redraw when the mouse is released
    sliders = [group_advantage_explorer(draw=False).controls[f"r{g}"] for g in range(8)]
    assert {slider.layout.width for slider in sliders} == {"220px"}  # four to a row in a 1,400-pixel window


def module_level_imports(module) -> set[str]:
    """Names imported by a module's top-level statements (imports inside functions are lazy)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0] if not node.module.startswith("minigrpo") else node.module)
    return names


def test_importing_minigrpo_does_not_need_ipywidgets():
    import minigrpo
    import minigrpo.course.plots
    import minigrpo.course.widgets

    for module in (minigrpo, minigrpo.course.plots, minigrpo.course.widgets):
        imports = module_level_imports(module)
        assert "ipywidgets" not in imports and "IPython" not in imports, module.__name__
    assert "minigrpo.course.widgets" not in module_level_imports(minigrpo)

"""The lessons' saved figures (scripts/refresh_figures.py): every cell that draws keeps the figure it draws, made
from its current source, small enough for the web, and labelled where it was drawn in quick mode.

A reader on GitHub, or in Colab before running anything, sees the pictures the prose describes. A cell draws when it
calls plt.show() or one of the course's plot helpers (scripts/stamp_colab.draws); the figures are counted against
those cells, not against the prose. nbval compares none of them: only the checked text outputs.
"""

import base64
import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PNG_BUDGET = 100_000  # bytes per figure: a 9 x 3 inch plot at 90 dpi, palette PNG, is 15-40 kB
TOTAL_BUDGET = 1_500_000  # bytes for every figure of every lesson


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stamp_colab, refresh_figures = load("stamp_colab"), load("refresh_figures")


def saved_figures(cell) -> list:
    return [output for output in cell.get("outputs", []) if stamp_colab.is_saved_figure(output)]


def png_bytes(output) -> int:
    return len(base64.b64decode(output.data["image/png"]))


def figure_problems(nb, name: str) -> list[str]:
    """What is wrong with the saved figures of lesson `name`: a cell that draws without its figure, a figure whose
    cell changed since it was drawn, a figure drawn in the wrong mode."""
    fix = f"run python scripts/refresh_figures.py notebooks/{name}"
    expected = "quick" if name in refresh_figures.QUICK else "full"
    problems = []
    for number, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), start=1):
        if not stamp_colab.draws(cell):
            continue
        figures = saved_figures(cell)
        if not figures:
            problems.append(f"{name} code cell {number} draws, but its figure is not saved: {fix}")
        for output in figures:
            stamp = output.metadata[stamp_colab.FIGURE_KEY]
            if stamp["source_sha256"] != stamp_colab.source_hash(cell):
                problems.append(f"{name} code cell {number} changed since its figure was drawn: {fix}")
            if stamp["mode"] != expected:
                problems.append(f"{name} code cell {number}: a figure drawn in {stamp['mode']} mode: {fix}")
    return problems


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem.split("_")[0])
def test_every_cell_that_draws_keeps_its_figure_made_from_its_source(path):
    assert figure_problems(nbformat.read(path, as_version=4), path.name) == []


@pytest.mark.parametrize("path", [ROOT / "notebooks" / name for name in refresh_figures.QUICK], ids=lambda p: p.stem)
def test_a_figure_drawn_in_quick_mode_says_so_below_it(path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if saved_figures(cell):
            caption = nb.cells[index + 1]
            assert caption.cell_type == "markdown" and "quick mode" in caption.source.split("\n\n")[0], (
                f"{path.name}: the markdown cell after a figure drawn in quick mode must say so in its first paragraph"
            )


def test_the_figures_fit_their_budgets():
    sizes = {
        f"{path.name} cell {index}": png_bytes(output)
        for path in LESSONS
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells)
        for output in saved_figures(cell)
    }
    assert len(sizes) >= 20, "the lessons draw more figures than this: run python scripts/refresh_figures.py"
    too_big = {name: size for name, size in sizes.items() if size > PNG_BUDGET}
    assert not too_big, f"figures over {PNG_BUDGET:,} bytes (draw them smaller): {too_big}"
    assert sum(sizes.values()) <= TOTAL_BUDGET, f"the lessons' figures take {sum(sizes.values()):,} bytes"


def test_a_stale_or_missing_figure_is_caught():
    cell = nbformat.v4.new_code_cell("plot_group_advantages(rewards)\nplt.show()")
    stamp = {"source_sha256": stamp_colab.source_hash(cell), "mode": "full"}
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={"image/png": "iVBO"}, metadata={stamp_colab.FIGURE_KEY: stamp})
    ]
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert figure_problems(nb, "03_x.ipynb") == []
    cell.source += "\nax.set_ylim(-3, 3)"  # the cell changed; its figure was not drawn again
    assert figure_problems(nb, "03_x.ipynb") == [
        "03_x.ipynb code cell 1 changed since its figure was drawn: run python scripts/refresh_figures.py "
        "notebooks/03_x.ipynb"
    ]
    cell.outputs = []
    assert "draws, but its figure is not saved" in figure_problems(nb, "03_x.ipynb")[0]
    assert not stamp_colab.draws(nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nplt.show()"))  # checked: text only

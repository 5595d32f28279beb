"""Draw the lessons' figures again and save them in the committed notebooks, so that a reader sees every figure on
GitHub, or in Colab before running anything.

    python scripts/refresh_figures.py                                        # every lesson
    python scripts/refresh_figures.py notebooks/03_group_relative_advantages.ipynb

Where the figures are drawn (the stated environment): a CPU, the bundled tiny Qwen (every lesson picks it on a
machine without a GPU), offline, each lesson executed top to bottom from a fresh kernel in its full mode, what a
learner runs. The lessons in QUICK below are the exception: their full runs take too long, so they draw in quick
mode (MINIGRPO_QUICK=1, as CI runs them) and the markdown cell after each of their figures says so.

What is saved: the PNGs of every cell that draws (scripts/stamp_colab.draws: plt.show() or a course plot helper),
at FIGURE_DPI and quantised to a 256-colour palette (Pillow), each with the sha256 of its cell's source and the
mode it was drawn in; nothing else of the run is kept (the checked text outputs are
scripts/refresh_checked_outputs.py's, from quick mode). tests/test_notebooks.py fails on a cell that draws without
its figure, on a figure whose cell changed since, and on a PNG or a total past the budgets. Review the images before
committing: a changed figure is a changed lesson.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import io
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("stamp_colab", ROOT / "scripts" / "stamp_colab.py")
stamp_colab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamp_colab)

QUICK = {"05_ppo_vs_grpo.ipynb": "its full study runs about 17 minutes"}
"""Lessons whose figures are drawn in quick mode, and why."""
FIGURE_DPI = 90
"""The figures' resolution: a figure of the course's usual 9 x 3 inches is 810 x 270 pixels."""
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}
# Run before the lesson's own cells and removed after: the resolution of every figure the inline backend draws.
SETUP = f"import matplotlib\nmatplotlib.rcParams['figure.dpi'] = {FIGURE_DPI}"


def small_png(data: str) -> str:
    """A base64 PNG as a 256-colour palette PNG (a quarter of the size; the course's plots use few colours)."""
    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(buffer, format="PNG", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def figures_of(cell, mode: str) -> list:
    """The saved-figure outputs of an executed cell that draws: its PNGs, each stamped with the cell's hash."""
    figures = []
    for output in cell.outputs:
        png = output.get("data", {}).get("image/png")
        if png is None:
            continue
        metadata = {stamp_colab.FIGURE_KEY: {"source_sha256": stamp_colab.source_hash(cell), "mode": mode}}
        figures.append(nbformat.v4.new_output("display_data", data={"image/png": small_png(png)}, metadata=metadata))
    return figures


def draw(path: Path, timeout: int) -> int:
    """Execute the lesson and put its figures into the committed notebook; returns the number of figures saved."""
    quick = path.name in QUICK
    mode = "quick" if quick else "full"
    environment = dict(ENVIRONMENT, MINIGRPO_QUICK="1") if quick else ENVIRONMENT
    os.environ.update(environment)  # the kernel inherits this process's environment
    if not quick:
        os.environ.pop("MINIGRPO_QUICK", None)
    executed = nbformat.read(path, as_version=4)
    executed.cells.insert(0, nbformat.v4.new_code_cell(SETUP))
    NotebookClient(
        executed, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    drawn = {cell.id: figures_of(cell, mode) for cell in executed.cells[1:] if stamp_colab.draws(cell)}
    committed = nbformat.read(path, as_version=4)
    for cell in committed.cells:
        if stamp_colab.draws(cell):
            cell.outputs = drawn[cell.id]
    stamp_colab.clean_outputs(committed)  # the execution counts of a fresh run, as nbval wants them
    nbformat.write(committed, path)
    return sum(len(figures) for figures in drawn.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="lessons (default: every notebook in notebooks/)")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    args = parser.parse_args(argv)
    for path in args.paths or sorted((ROOT / "notebooks").glob("*.ipynb")):
        path = path.resolve()
        count = draw(path, args.timeout)
        mode = f"quick mode: {QUICK[path.name]}" if path.name in QUICK else "full mode"
        print(f"{path.relative_to(ROOT)}: {count} figures ({mode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

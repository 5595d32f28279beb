"""Re-run notebooks top to bottom in quick mode and store the outputs nbval will compare.

    python scripts/refresh_checked_outputs.py notebooks/03_group_relative_advantages.ipynb
    python scripts/refresh_checked_outputs.py            # every lesson and solution

Run it after a change that moves a printed number (a new bundled model, a new default): each notebook is
executed as the test suite runs it (MINIGRPO_QUICK=1, offline, from its own folder), then cleaned as
`stamp_colab.py --clean` does: only the `# NBVAL_CHECK_OUTPUT` cells keep their outputs, and the cells that draw keep
the figures scripts/refresh_figures.py saved (this quick run's figures are not kept). Stderr outputs
(warnings, progress bars) are dropped from checked cells; a checked cell must print its result on stdout.
Review the diff before committing: a changed number is a changed lesson.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("stamp_colab", ROOT / "scripts" / "stamp_colab.py")
stamp_colab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamp_colab)

QUICK_ENV = {"MINIGRPO_QUICK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}


def refresh(path: Path, timeout: int) -> None:
    nb = nbformat.read(path, as_version=4)
    # the saved figures stay as scripts/refresh_figures.py drew them (this run is in quick mode)
    figures = {cell.id: [o for o in cell.get("outputs", []) if stamp_colab.is_saved_figure(o)] for cell in nb.cells}
    os.environ.update(QUICK_ENV)  # the kernel inherits this process's environment, as under nbval
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    for cell in nb.cells:
        if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in cell.source:
            # what nbval compares: printed text and a cell's value (no stderr, no progress bars, no figures)
            kept = [o for o in cell.outputs if o.get("name") == "stdout" or o.output_type == "execute_result"]
            cell.outputs = joined_streams(kept)
    for cell in nb.cells:
        if stamp_colab.draws(cell):
            cell.outputs = figures.get(cell.id, [])
    stamp_colab.clean_outputs(nb)
    nbformat.write(nb, path)
    print(f"refreshed {path.relative_to(ROOT)}")


def joined_streams(outputs: list) -> list:
    """Consecutive stdout outputs as one, as nbval joins them before comparing: how the kernel happened to flush a
    cell's prints does not change the committed notebook."""
    joined = []
    for output in outputs:
        if joined and output.get("name") == "stdout" and joined[-1].get("name") == "stdout":
            joined[-1].text += output.text
        else:
            joined.append(output)
    return joined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: notebooks/ and solutions/)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = args.paths or sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
    for path in paths:
        refresh(path.resolve(), args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

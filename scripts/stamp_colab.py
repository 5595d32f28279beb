"""Stamp every course notebook with its "Open in Colab" badge and the Colab setup cell.

    python scripts/stamp_colab.py            # notebooks/, solutions/, exercises/ (idempotent)
    python scripts/stamp_colab.py --check    # exit 1 if a notebook is not stamped as it should be
    python scripts/stamp_colab.py notebooks/00_tour_and_setup.ipynb
    python scripts/stamp_colab.py --clean    # also: clear outputs except in NBVAL_CHECK_OUTPUT cells, and widget state

What it writes comes from pyproject.toml: the badge links to [project.urls]'s
Repository (the one place a fork sets its URL; none set means "not published":
the badge cell then says in one line how to open a notebook in Colab; a lesson's
Practice section ends with a line that gives each exercise's Colab URL, or says
how to open it where none is set), and the setup cell installs `minigrpo[colab]==<[project] version>`
(minigrpo.course.colab_install), printing minigrpo.course.INSTALL_HELP after
pip's last line if pip fails. tests/test_notebooks.py fails when a notebook's
stamp drifts from pyproject.toml: after changing the version or the URL, run
this script.

The badge is the first cell (a markdown cell with id "colab-badge"); the setup
cell (id "colab-install") goes just before the notebook's first code cell. A
stamped cell is found again by its id, and rewritten only when its text differs.
The setup cell runs before minigrpo is installed, so it is plain Python (no
magics): it is a no-op outside Colab, and in Colab never ends in a traceback.
It runs pip every time (a second run is pip's "already satisfied"), so that a
runtime with another version installed gets this notebook's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("notebooks", "solutions", "exercises")
BADGE_ID, INSTALL_ID = "colab-badge", "colab-install"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"


def course_constants(pyproject_text: str | None = None) -> tuple[str | None, str, str]:
    """(repository URL or None, the setup cell's pip requirement, INSTALL_HELP): the URL and the version from
    pyproject.toml ([project.urls] Repository, [project] version), the rest from minigrpo.course."""
    import tomllib

    sys.path.insert(0, str(ROOT))
    from minigrpo.course import INSTALL_HELP, colab_install

    project = tomllib.loads(pyproject_text or (ROOT / "pyproject.toml").read_text())["project"]
    return project.get("urls", {}).get("Repository") or None, colab_install(project["version"]), INSTALL_HELP


def colab_url(repository_url: str, relative_path: str, branch: str = "main") -> str:
    """https://github.com/OWNER/REPO + notebooks/x.ipynb -> the Colab URL that opens it from GitHub."""
    prefix = "https://github.com/"
    if not repository_url.startswith(prefix):
        raise ValueError(
            f"pyproject.toml's [project.urls] Repository = {repository_url!r} must start with {prefix}: Colab opens "
            "notebooks from GitHub."
        )
    repository = repository_url.removeprefix(prefix).removesuffix(".git").strip("/")
    return f"https://colab.research.google.com/github/{repository}/blob/{branch}/{relative_path}"


UNPUBLISHED_BADGE = "**Open in Colab:** in Colab, File > Upload notebook, then run the cells from the top."


def badge_source(repository_url: str | None, relative_path: str) -> str:
    if not repository_url:
        return UNPUBLISHED_BADGE
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(repository_url, relative_path)})"


PRACTICE = "## Practice: graded exercises"
COLAB_PRACTICE_LINE = re.compile(r"^\*\*In Colab:\*\* .*$", re.M)
EXERCISE_LINK = re.compile(r"\]\(\.\./(exercises/[^)\s]+\.ipynb)\)")


def practice_colab_line(repository_url: str | None, exercises: list[str]) -> str:
    """The one line under a lesson's graded exercises for a reader in Colab, where a relative link to another notebook
    does not open it: each exercise's Colab URL once the repository is published, else how to open it."""
    if repository_url:
        links = ", ".join(f"[exercise {Path(e).name.split('_')[0]}]({colab_url(repository_url, e)})" for e in exercises)
        return f"**In Colab:** open {links} in Colab (the links above open the notebooks on GitHub)."
    names = ", ".join(f"`{exercise}`" for exercise in exercises)
    return (
        "**In Colab:** a link to another notebook does not open it there: File > Upload notebook, then pick "
        f"{names} from a copy of the repository."
    )


def stamp_practice(nb, repository_url: str | None) -> bool:
    """Put (or refresh) the Colab line at the end of the lesson's Practice section, for the exercises it links.
    Returns True if nb changed."""
    index = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and PRACTICE in c.source), None)
    if index is None:
        return False
    cell = nb.cells[index]
    before, practice = cell.source.split(PRACTICE, 1)
    exercises = list(dict.fromkeys(EXERCISE_LINK.findall(practice)))
    if not exercises:
        return False
    line = practice_colab_line(repository_url, exercises)
    if COLAB_PRACTICE_LINE.search(practice):
        practice = COLAB_PRACTICE_LINE.sub(lambda _: line, practice, count=1)
    else:
        practice = practice.rstrip("\n") + "\n\n" + line
    source = before + PRACTICE + practice
    if source == cell.source:
        return False
    cell.source = source
    return True


def install_source(colab_install: str, install_help: str) -> str:
    """The setup cell: in Colab, pip-install `colab_install`, then turn on the widget manager; if pip fails, print
    its last line and `install_help` in one line. Elsewhere: nothing."""
    if '"' in install_help or "\\" in install_help or "\n" in install_help:
        raise ValueError("INSTALL_HELP must be one line without double quotes or backslashes")
    return (
        "# Colab setup: installs minigrpo there (elsewhere this does nothing: `pip install -e .` in the repository).\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:  # minigrpo.course.in_colab(), before minigrpo can be imported\n'
        f"    PACKAGE = {json.dumps(colab_install)}  # pyproject.toml's version, stamped by scripts/stamp_colab.py\n"
        '    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", PACKAGE], '
        "capture_output=True, text=True)\n"
        "    if pip.returncode != 0:\n"
        '        last_line = (pip.stderr.strip().splitlines() or ["?"])[-1]\n'
        f'        print(f"pip could not install {{PACKAGE}} ({{last_line}}): {install_help}")\n'
        "    else:\n"
        "        from minigrpo import course\n"
        "\n"
        "        course.colab_setup()  # the widget manager that draws the course's ipywidgets in Colab"
    )


def _find(nb, cell_id: str) -> int | None:
    return next((i for i, cell in enumerate(nb.cells) if cell.get("id") == cell_id), None)


def stamp_notebook(nb, relative_path: str, repository_url: str | None, colab_install: str, install_help: str) -> bool:
    """Put the badge first, the setup cell before the first code cell and, in a lesson that links graded exercises,
    the Colab line at the end of its Practice section. Returns True if nb changed."""
    changed = False
    badge = badge_source(repository_url, relative_path)
    index = _find(nb, BADGE_ID)
    if index is None:
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(badge, id=BADGE_ID))
        changed = True
    else:
        if nb.cells[index].source != badge:
            nb.cells[index].source = badge
            changed = True
        if index != 0:
            nb.cells.insert(0, nb.cells.pop(index))
            changed = True
    install = install_source(colab_install, install_help)
    index = _find(nb, INSTALL_ID)
    if index is None:
        first_code = next((i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"), len(nb.cells))
        cell = nbformat.v4.new_code_cell(install, id=INSTALL_ID)
        nb.cells.insert(first_code, cell)
        changed = True
    else:
        cell = nb.cells[index]
        if cell.source != install:
            cell.source = install
            changed = True
        first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        if first_code != index:
            nb.cells.insert(first_code, nb.cells.pop(index))
            changed = True
    if cell.outputs or cell.execution_count is not None:
        cell.outputs, cell.execution_count = [], None
        changed = True
    return stamp_practice(nb, repository_url) | changed


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def strip_widget_state(nb) -> None:
    """Remove ipywidgets state: the notebook's metadata.widgets (a snapshot of every widget's value, large and
    different on each run) and the widget mime types in outputs. A widget view only means something to the kernel
    that made it, so it is never kept, not even in an NBVAL_CHECK_OUTPUT cell; an output left with no data goes."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.outputs:
            data = output.get("data")
            if data is not None:
                for mime in (WIDGET_STATE, WIDGET_VIEW):
                    data.pop(mime, None)
                if not data:
                    continue
            kept.append(output)
        cell.outputs = kept


# A cell that draws: plt.show() or one of the course's plot helpers (minigrpo.course.plots.plot_*). Its figures are
# saved in the committed notebook (scripts/refresh_figures.py), each stamped with the hash of the cell's source.
DRAWS = re.compile(r"\bplt\.show\(|\bplot_\w+\(")
FIGURE_KEY = "minigrpo_figure"  # an image output's metadata entry: {"source_sha256": ..., "mode": ...}


def draws(cell) -> bool:
    """Whether a code cell draws a figure the committed notebook keeps."""
    return cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" not in cell.source and bool(DRAWS.search(cell.source))


def source_hash(cell) -> str:
    """The sha256 of the cell's source: a saved figure records it, so a figure whose cell changed since is stale."""
    return hashlib.sha256(cell.source.encode("utf-8")).hexdigest()


def is_saved_figure(output) -> bool:
    """Whether an output is a figure scripts/refresh_figures.py saved (a PNG with its cell's hash)."""
    return output.get("output_type") == "display_data" and FIGURE_KEY in output.get("metadata", {})


def clean_outputs(nb) -> bool:
    """Clear every output and execution count, except in NBVAL_CHECK_OUTPUT cells: those keep their outputs (what
    nbval compares) and get the execution count a fresh top-to-bottom run gives them (nbval skips a cell without
    one, and fails one that has outputs but no count); and the cells that draw keep their saved figures alone, with
    their count too (nbval runs them, but compares no cell without the check marker). Widget state goes everywhere.
    Returns True if nb changed."""
    before = nbformat.writes(nb)
    strip_widget_state(nb)
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    for number, cell in enumerate(code_cells, start=1):
        cell.metadata.pop("execution", None)
        if "NBVAL_CHECK_OUTPUT" not in cell.source:
            cell.outputs = [output for output in cell.outputs if draws(cell) and is_saved_figure(output)]
        if cell.outputs:
            cell.execution_count = number
            for output in cell.outputs:
                if "execution_count" in output:
                    output.execution_count = number
        else:
            cell.execution_count = None
    return nbformat.writes(nb) != before


def course_notebooks(root: Path = ROOT) -> list[Path]:
    """Every .ipynb under notebooks/, solutions/ and exercises/ (checkpoint folders excluded)."""
    paths = []
    for folder in FOLDERS:
        paths += sorted(p for p in (root / folder).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks to stamp (default: all course notebooks)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook needs stamping")
    parser.add_argument("--clean", action="store_true", help="also clear outputs except in NBVAL_CHECK_OUTPUT cells")
    args = parser.parse_args(argv)
    repository_url, colab_install, install_help = course_constants()
    stale = []
    for path in [p.resolve() for p in args.paths] or course_notebooks():
        nb = nbformat.read(path, as_version=4)
        stamped = stamp_notebook(nb, path.relative_to(ROOT).as_posix(), repository_url, colab_install, install_help)
        if stamped | (args.clean and clean_outputs(nb)):
            stale.append(path.relative_to(ROOT))
            if not args.check:
                nbformat.write(nb, path)
    verb = "needs stamping" if args.check else "stamped"
    for path in stale:
        print(f"{verb}: {path}")
    if args.check and stale:
        print("run: python scripts/stamp_colab.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

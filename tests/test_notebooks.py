"""The course notebooks as files: Colab-ready, committed without outputs except the checked cells, wired to nbval.

nbval itself runs the notebooks (pytest's testpaths include notebooks/ and solutions/, with --nbval-lax); these
tests check what nbval cannot: the badge and install cell are stamped, nothing but the outputs that nbval compares
is committed, and the pytest configuration really runs the notebooks.
"""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from minigrpo.course import COLAB_INSTALL, REPOSITORY_URL

ROOT = Path(__file__).resolve().parent.parent
CHECK = "NBVAL_CHECK_OUTPUT"
LESSONS = [
    "00_tour_and_setup",
    "01_policy_gradients_and_ppo",
    "02_group_sampling",
    "03_group_relative_advantages",
    "04_grpo_objective",
]

spec = importlib.util.spec_from_file_location("stamp_colab", ROOT / "scripts" / "stamp_colab.py")
stamp_colab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamp_colab)

NOTEBOOKS = stamp_colab.course_notebooks(ROOT)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_lessons_exist():
    names = {path.stem for path in (ROOT / "notebooks").glob("*.ipynb")}
    assert set(LESSONS) <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=relative)
def test_notebook_has_badge_and_colab_install_cell(path):
    nb = nbformat.read(path, as_version=4)
    badge = nb.cells[0]
    assert badge.cell_type == "markdown" and badge.get("id") == stamp_colab.BADGE_ID
    assert badge.source == stamp_colab.badge_source(REPOSITORY_URL, relative(path))
    assert f"/blob/main/{relative(path)})" in badge.source
    first_code = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert first_code.get("id") == stamp_colab.INSTALL_ID, "the first code cell must be the Colab install cell"
    assert first_code.source == stamp_colab.install_source(COLAB_INSTALL)
    assert 'if "google.colab" in sys.modules:' in first_code.source and f"%{COLAB_INSTALL}" in first_code.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=relative)
def test_notebook_has_no_outputs_except_checked_cells(path):
    """Only NBVAL_CHECK_OUTPUT cells keep outputs: the plain text nbval compares. nbval skips the comparison for a
    cell without an execution count ("unrun") and fails one that has outputs but no count, so a checked cell keeps
    the count a fresh top-to-bottom run gives it, and every other cell has none."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    for number, cell in enumerate(code_cells, start=1):
        where = f"{relative(path)} code cell {number}"
        if CHECK in cell.source:
            assert cell.outputs, f"{where}: an {CHECK} cell must keep its expected output, or nbval checks nothing"
            assert cell.execution_count == number, f"{where}: set execution_count {number} (nbval skips unrun cells)"
            for output in cell.outputs:
                assert output.output_type in ("stream", "execute_result"), f"{where}: {output.output_type}"
                assert output.get("name") != "stderr", f"{where}: warnings in a checked cell"
                data = output.get("data", {})
                assert set(data) <= {"text/plain"}, f"{where}: checked outputs must be plain text"
                text = output.get("text", "") or data.get("text/plain", "")
                assert "tensor(" not in text, f"{where}: print plain numbers, not tensor reprs"
                assert not re.search(r"0x[0-9a-f]{6}", text), f"{where}: no object addresses"
        else:
            assert not cell.outputs, f"{where}: commit without outputs (only {CHECK} cells keep theirs)"
            assert cell.execution_count is None, f"{where}: clear execution counts"


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_shape(name):
    """A question at the top, the course module for the setup, a Summary and exercises at the end."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    markdown = [cell.source for cell in nb.cells if cell.cell_type == "markdown"]
    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    assert markdown[1].startswith(f"# {name[:2]} ") and "**The question.**" in markdown[1]
    assert "from minigrpo import course" in code and "course.describe()" in code
    assert "## Summary" in markdown[-1] and "## Exercises" in markdown[-1]
    assert sum(CHECK in cell.source for cell in nb.cells if cell.cell_type == "code") >= 2
    for banned in ("torch.cuda.is_available", "Qwen/Qwen2.5", "MINIGRPO_QUICK"):  # course.py decides these
        assert banned not in code, f"{name}: use minigrpo.course instead of {banned}"
    redefined = set(re.findall(r"^def (\w+)", code, flags=re.M)) & set(dir(__import__("minigrpo")))
    assert not redefined, f"{name} redefines package functions {redefined}: import them"


def test_stamping_is_idempotent(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x"), nbformat.v4.new_code_cell("1")])
    assert stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", REPOSITORY_URL, COLAB_INSTALL)
    first = nbformat.writes(nb)
    assert nb.cells[0].id == "colab-badge" and nb.cells[1].source == "# x" and nb.cells[2].id == "colab-install"
    assert not stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", REPOSITORY_URL, COLAB_INSTALL)
    assert nbformat.writes(nb) == first
    assert stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", "https://github.com/someone/fork", COLAB_INSTALL)
    assert "github/someone/fork/blob/main/notebooks/x.ipynb" in nb.cells[0].source


def test_clean_outputs_keeps_only_checked_outputs_with_their_counts():
    checked = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(1)", execution_count=7)
    checked.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    other = nbformat.v4.new_code_cell("print(2)", execution_count=3)
    other.outputs = [nbformat.v4.new_output("stream", name="stdout", text="2\n")]
    nb = nbformat.v4.new_notebook(cells=[other, checked])
    assert stamp_colab.clean_outputs(nb)
    assert other.outputs == [] and other.execution_count is None
    assert checked.outputs[0].text == "1\n" and checked.execution_count == 2  # its place in a fresh run
    assert not stamp_colab.clean_outputs(nb)


def test_colab_url_comes_from_the_repository_url():
    url = stamp_colab.colab_url("https://github.com/a/b", "notebooks/00_tour_and_setup.ipynb")
    assert url == "https://colab.research.google.com/github/a/b/blob/main/notebooks/00_tour_and_setup.ipynb"
    with pytest.raises(ValueError, match="must start with https://github.com/"):
        stamp_colab.colab_url("https://gitlab.com/a/b", "x.ipynb")


def test_pytest_runs_the_notebooks_with_nbval_and_not_the_exercises(pytestconfig):
    assert pytestconfig.getini("testpaths") == ["tests", "notebooks", "solutions"]
    addopts = pytestconfig.getini("addopts")
    assert "--nbval-lax" in addopts and "--nbval-current-env" in addopts
    assert any(opt.startswith("--nbval-cell-timeout=") for opt in addopts)
    assert pytestconfig.option.nbval_lax and pytestconfig.option.nbval_cell_timeout <= 600
    assert "exercises" in pytestconfig.getini("norecursedirs")
    assert "MINIGRPO_QUICK" in (ROOT / "conftest.py").read_text()  # applies to notebooks/ and solutions/

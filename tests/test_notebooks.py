"""The course notebooks as files: Colab-ready, committed without outputs except the checked cells, wired to nbval.

nbval itself runs the lessons (pytest's testpaths include notebooks/, with --nbval-lax; the grading test runs the
solutions, which have no checked cell); these
tests check what nbval cannot: the badge and setup cell are stamped, nothing but the outputs that nbval compares
is committed (and no widget state), each lesson asks for the model it should, and the pytest configuration really
runs the notebooks. `python scripts/stamp_colab.py --clean` fixes what the stamping and output tests find.
"""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
CHECK = "NBVAL_CHECK_OUTPUT"
PRACTICE = "## Practice: graded exercises"  # a lesson's last section; its own questions are "Questions to try"
LESSONS = [
    "00_tour_and_setup",
    "01_policy_gradients_and_ppo",
    "02_group_sampling",
    "02b_from_prompt_to_logprobs",
    "02c_rewards_and_verifiers",
    "03_group_relative_advantages",
    "04_grpo_objective",
    "04_grpo_objective_appendix_kl_gradient",
    "04b_the_update_loop",
    "06b_what_rl_changes",
    "08_from_minigrpo_to_trl",
    "09_tools_and_multi_turn_episodes",
]

spec = importlib.util.spec_from_file_location("stamp_colab", ROOT / "scripts" / "stamp_colab.py")
stamp_colab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamp_colab)

spec = importlib.util.spec_from_file_location("make_exercises", ROOT / "scripts" / "make_exercises.py")
make_exercises = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_exercises)

NOTEBOOKS = stamp_colab.course_notebooks(ROOT)
REPOSITORY_URL, COLAB_INSTALL, INSTALL_HELP = stamp_colab.course_constants()  # from pyproject.toml
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WIDGET_MIMES = (stamp_colab.WIDGET_STATE, stamp_colab.WIDGET_VIEW)


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
    if REPOSITORY_URL:
        assert f"/blob/main/{relative(path)})" in badge.source
    first_code = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert first_code.get("id") == stamp_colab.INSTALL_ID, "the first code cell must be the Colab setup cell"
    stamped = f'PACKAGE = "minigrpo[colab]=={VERSION}"'
    assert stamped in first_code.source, f"{relative(path)}: stamp pyproject.toml's version: scripts/stamp_colab.py"
    assert first_code.source == stamp_colab.install_source(COLAB_INSTALL, INSTALL_HELP)
    assert 'if "google.colab" in sys.modules:' in first_code.source and "course.colab_setup()" in first_code.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=relative)
def test_notebook_has_no_widget_state(path):
    """ipywidgets state (metadata.widgets, widget outputs) is a snapshot of one run: large, different every run,
    and meaningless without its kernel. Run `python scripts/stamp_colab.py --clean` (make_exercises for exercises/)."""
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata, f"{relative(path)}: widget state in the notebook metadata"
    for number, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), start=1):
        for output in cell.outputs:
            found = set(output.get("data", {})) & set(WIDGET_MIMES)
            assert not found, f"{relative(path)} code cell {number}: widget output {sorted(found)}"


# Lessons 00-05 teach mechanics on the tiny model in seconds on any machine; 06 trains Qwen on a GPU. 07 compares
# many short runs on the tiny model everywhere and says how to repeat them on Qwen (model_name=... in its prose).
REAL_MODEL_LESSONS = ("06",)


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=relative)
def test_lesson_asks_for_its_model(path):
    code = "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code")
    if path.name.split("_")[0] in REAL_MODEL_LESSONS:  # "06", not "06b"
        assert "course.model_name(real_on_gpu=True)" in code, f"{relative(path)}: train the real Qwen on a GPU"
        assert "course.model_name()" not in code, f"{relative(path)}: every model_name() call needs real_on_gpu=True"
        assert "course.course_config()" not in code, f"{relative(path)}: pass the model: course.course_config(MODEL)"
    else:
        assert "real_on_gpu=True" not in code, f"{relative(path)}: every lesson but 06 uses the tiny model everywhere"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=relative)
def test_notebook_has_no_outputs_except_checked_cells(path):
    """Only NBVAL_CHECK_OUTPUT cells keep outputs: the plain text nbval compares (and the cells that draw, their saved
    figures: tests/test_figures.py). nbval skips the comparison for a
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
            kept = [output for output in cell.outputs if not stamp_colab.is_saved_figure(output)]
            assert not kept, f"{where}: commit without outputs (only {CHECK} cells and saved figures stay)"
            assert stamp_colab.draws(cell) or not cell.outputs, f"{where}: a figure saved in a cell that draws none"
            for output in cell.outputs:
                assert set(output.data) == {"image/png"}, f"{where}: a saved figure is a PNG alone"
            expected = number if cell.outputs else None  # nbval refuses a cell with outputs and no count
            assert cell.execution_count == expected, f"{where}: execution count {expected}"


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_shape(name):
    """A question at the top, the course module for the setup, a Summary and the graded exercises at the end."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    markdown = [cell.source for cell in nb.cells if cell.cell_type == "markdown"]
    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    number = name.split("_")[0]  # "03", or "02b" for a lesson placed between 02 and 03
    assert markdown[1].startswith(f"# {number} ") and "**The question.**" in markdown[1]
    assert "from minigrpo import course" in code and "course.describe(" in code  # describe("tiny-tools") in 09
    assert "## Summary" in markdown[-1] and PRACTICE in markdown[-1]
    headings = re.findall(r"^## .*$", "\n".join(markdown), flags=re.M)
    assert headings[-1] == PRACTICE, f"{name}: the lesson ends with its graded exercises ({PRACTICE})"
    assert sum(CHECK in cell.source for cell in nb.cells if cell.cell_type == "code") >= 2
    for banned in ("torch.cuda.is_available", "Qwen/Qwen2.5", "MINIGRPO_QUICK"):  # course.py decides these
        assert banned not in code, f"{name}: use minigrpo.course instead of {banned}"
    redefined = set(re.findall(r"^def (\w+)", code, flags=re.M)) & set(dir(__import__("minigrpo")))
    assert not redefined, f"{name} redefines package functions {redefined}: import them"


def test_stamping_is_idempotent_and_follows_a_new_version_and_url(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x"), nbformat.v4.new_code_cell("1")])
    stamp = [None, "minigrpo[colab]==1.2.0", INSTALL_HELP]
    assert stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", *stamp)
    first = nbformat.writes(nb)
    assert nb.cells[0].id == "colab-badge" and nb.cells[1].source == "# x" and nb.cells[2].id == "colab-install"
    assert not stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", *stamp)
    assert nbformat.writes(nb) == first
    fork = "https://github.com/someone/fork"
    assert stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", fork, "minigrpo[colab]==1.3.0", INSTALL_HELP)
    assert "github/someone/fork/blob/main/notebooks/x.ipynb" in nb.cells[0].source
    assert 'PACKAGE = "minigrpo[colab]==1.3.0"' in nb.cells[2].source


def test_a_lessons_practice_section_says_how_to_open_its_exercises_in_colab():
    links = "- [Exercise 03](../exercises/03_x.ipynb)\n- [Exercise 11](../exercises/11_y.ipynb)"
    practice = f"{stamp_colab.PRACTICE}\n\n{links}"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1"), nbformat.v4.new_markdown_cell(practice)])
    stamp = ["minigrpo[colab]==1.2.0", INSTALL_HELP]
    assert stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", None, *stamp)
    unpublished = nb.cells[-1].source.splitlines()[-1]
    assert unpublished.startswith("**In Colab:**") and "Upload notebook" in unpublished
    assert "`exercises/03_x.ipynb`, `exercises/11_y.ipynb`" in unpublished
    assert not stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", None, *stamp)  # idempotent
    assert stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", "https://github.com/someone/fork", *stamp)
    published = nb.cells[-1].source.splitlines()
    assert published[-1] == (
        "**In Colab:** open [exercise 03](https://colab.research.google.com/github/someone/fork/blob/main/exercises/"
        "03_x.ipynb), [exercise 11](https://colab.research.google.com/github/someone/fork/blob/main/exercises/"
        "11_y.ipynb) in Colab (the links above open the notebooks on GitHub)."
    )
    assert sum(line.startswith("**In Colab:**") for line in published) == 1  # the line replaced, not added again


def test_the_stamp_comes_from_pyprojects_version_and_url():
    published = '[project]\nversion = "1.2.0"\n[project.urls]\nRepository = "https://github.com/a/b"\n'
    assert stamp_colab.course_constants(published) == ("https://github.com/a/b", "minigrpo[colab]==1.2.0", INSTALL_HELP)
    unpublished = '[project]\nversion = "1.2.0"\n[project.urls]\n'
    assert stamp_colab.course_constants(unpublished)[:2] == (None, "minigrpo[colab]==1.2.0")


def test_unpublished_repository_gets_a_one_line_upload_note():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
    assert stamp_colab.stamp_notebook(nb, "notebooks/x.ipynb", None, "minigrpo[colab]==1.2.0", INSTALL_HELP)
    assert nb.cells[0].source == stamp_colab.UNPUBLISHED_BADGE and "Upload notebook" in nb.cells[0].source
    assert "\n" not in nb.cells[0].source
    compile(nb.cells[1].source, "setup cell", "exec")  # plain Python: runs before minigrpo (or any magic) is there


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


def test_clean_outputs_keeps_the_saved_figures_of_the_cells_that_draw():
    figure = nbformat.v4.new_output(
        "display_data", data={"image/png": "iVBO"}, metadata={stamp_colab.FIGURE_KEY: {"source_sha256": "x"}}
    )
    fresh = nbformat.v4.new_output("display_data", data={"image/png": "iVBO", "text/plain": "<Figure>"})
    drawing = nbformat.v4.new_code_cell("plot_curves(history)\nplt.show()", execution_count=4)
    drawing.outputs = [figure, fresh]
    printing = nbformat.v4.new_code_cell("print(2)", execution_count=5)
    printing.outputs = [figure]  # a saved figure in a cell that no longer draws: gone
    nb = nbformat.v4.new_notebook(cells=[drawing, printing])
    assert stamp_colab.clean_outputs(nb)
    assert drawing.outputs == [figure] and drawing.execution_count == 1  # nbval runs it, compares nothing
    assert printing.outputs == [] and printing.execution_count is None
    assert not stamp_colab.clean_outputs(nb)


def test_clean_outputs_strips_widget_state_even_in_checked_cells():
    checked = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nexplorer", execution_count=1)
    view = {"model_id": "abc", "version_major": 2, "version_minor": 0}
    widget_only = nbformat.v4.new_output("display_data", data={stamp_colab.WIDGET_VIEW: view})
    with_text = nbformat.v4.new_output(
        "execute_result", data={stamp_colab.WIDGET_VIEW: view, "text/plain": "3"}, execution_count=1
    )
    checked.outputs = [widget_only, with_text]
    nb = nbformat.v4.new_notebook(cells=[checked])
    nb.metadata["widgets"] = {stamp_colab.WIDGET_STATE: {"state": {}, "version_major": 2, "version_minor": 0}}
    assert stamp_colab.clean_outputs(nb)
    assert "widgets" not in nb.metadata
    assert [dict(output.data) for output in checked.outputs] == [{"text/plain": "3"}]
    assert not stamp_colab.clean_outputs(nb)


def test_exercises_are_made_without_widget_state():
    solution = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")]
    )
    solution.metadata["widgets"] = {stamp_colab.WIDGET_STATE: {"state": {}}}
    exercise = make_exercises.make_exercise(solution, "x.ipynb")
    assert "widgets" not in exercise.metadata and "widgets" in solution.metadata


def test_colab_url_comes_from_the_repository_url():
    url = stamp_colab.colab_url("https://github.com/a/b", "notebooks/00_tour_and_setup.ipynb")
    assert url == "https://colab.research.google.com/github/a/b/blob/main/notebooks/00_tour_and_setup.ipynb"
    with pytest.raises(ValueError, match="must start with https://github.com/"):
        stamp_colab.colab_url("https://gitlab.com/a/b", "x.ipynb")


def test_pytest_runs_the_notebooks_with_nbval_and_not_the_exercises(pytestconfig):
    assert pytestconfig.getini("testpaths") == ["tests", "notebooks"]
    addopts = pytestconfig.getini("addopts")
    assert "--nbval-lax" in addopts and "--nbval-current-env" in addopts
    assert any(opt.startswith("--nbval-cell-timeout=") for opt in addopts)
    assert pytestconfig.option.nbval_lax and pytestconfig.option.nbval_cell_timeout <= 600
    assert "exercises" in pytestconfig.getini("norecursedirs")
    assert "MINIGRPO_QUICK" in (ROOT / "conftest.py").read_text()  # applies to notebooks/ and solutions/


def test_solutions_have_no_checked_cell():
    """nbval does not run solutions/ (the grading test runs them): a checked output there would never be compared."""
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        checked = [i for i, cell in enumerate(cells) if "NBVAL_CHECK_OUTPUT" in cell.source]
        assert not checked, (
            f"{path.name}: cells {checked} are marked # NBVAL_CHECK_OUTPUT; check those values in a test"
        )


def test_every_exercise_is_linked_from_a_lessons_practice_section():
    """A learner meets each graded exercise where it belongs: in the Practice section of the lesson that teaches it."""
    linked = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        name, nb = path.stem, nbformat.read(path, as_version=4)
        practice = [cell.source for cell in nb.cells if cell.cell_type == "markdown"][-1].split(PRACTICE, 1)[1]
        for exercise in re.findall(r"\]\(\.\./exercises/([\w-]+)\.ipynb\)", practice):
            assert (ROOT / "exercises" / f"{exercise}.ipynb").exists(), f"{name} links a missing exercise {exercise}"
            linked.setdefault(exercise, []).append(name)
    unlinked = {path.stem for path in (ROOT / "exercises").glob("*.ipynb")} - set(linked)
    assert not unlinked, f"exercises linked from no lesson's {PRACTICE!r} section: {sorted(unlinked)}"

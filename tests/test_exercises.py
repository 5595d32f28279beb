"""exercises/ is generated from solutions/ (scripts/make_exercises.py) and must not drift from it."""

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minigrpo import grading
from minigrpo.grading import CASES, CHECKS, expected_checks, max_points

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"
SCRIPT = ROOT / "scripts" / "make_exercises.py"
spec = importlib.util.spec_from_file_location("make_exercises", SCRIPT)
make_exercises = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_exercises)

SOLUTION_PATHS = sorted(SOLUTIONS.glob("*.ipynb"))


def test_exercises_are_up_to_date_with_the_solutions():
    problems = make_exercises.stale_exercises(SOLUTIONS, EXERCISES)
    assert problems == [], "run python scripts/make_exercises.py:\n" + "\n".join(problems)


def test_check_mode_fails_when_a_solution_changes(tmp_path):
    shutil.copytree(SOLUTIONS, tmp_path / "solutions")
    shutil.copytree(EXERCISES, tmp_path / "exercises")
    args = [sys.executable, str(SCRIPT), "--check", "--solutions", str(tmp_path / "solutions")]
    args += ["--exercises", str(tmp_path / "exercises")]
    assert subprocess.run(args, capture_output=True).returncode == 0
    path = tmp_path / "solutions" / SOLUTION_PATHS[0].name
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("a new paragraph"))
    nbformat.write(nb, path)
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 1
    assert SOLUTION_PATHS[0].name in result.stderr and "out of date" in result.stderr


def test_a_solution_block_becomes_a_stub_that_keeps_signature_and_docstring():
    source = (
        "def f(x):\n"
        '    """Docstring (N, T)."""\n'
        "    ### BEGIN SOLUTION\n"
        "    y = x + 1\n"
        "    return y\n"
        "    ### END SOLUTION\n"
        "\n"
        "print(f)"
    )
    stub = make_exercises.strip_solutions(source, make_exercises.CODE_STUB)
    assert stub.splitlines()[:4] == [
        "def f(x):",
        '    """Docstring (N, T)."""',
        "    # YOUR CODE HERE",
        '    raise NotImplementedError("Exercise: replace this line with your solution, then run the check below.")',
    ]
    assert "x + 1" not in stub and stub.endswith("\nprint(f)")
    namespace = {}
    exec(stub.replace("print(f)", ""), namespace)
    with pytest.raises(NotImplementedError):
        namespace["f"](1)


def test_a_cell_tagged_solution_only_stays_out_of_the_exercise():
    solution = nbformat.v4.new_notebook()
    solution.cells = [
        nbformat.v4.new_markdown_cell("the task"),
        nbformat.v4.new_markdown_cell("the worked reference", metadata={"tags": ["solution-only"]}),
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["solution-only", "other"]}),
        nbformat.v4.new_markdown_cell("what to remember", metadata={"tags": ["other"]}),
    ]
    exercise = make_exercises.make_exercise(solution, "99_example.ipynb")
    assert [cell.source for cell in exercise.cells] == ["the task", "what to remember"]
    assert len(solution.cells) == 4  # the solution keeps it


def test_the_capstone_links_the_single_file_example_in_its_solution_only():
    link = "examples/grpo_single_file.py"
    assert link in SOLUTIONS.joinpath("12_grpo_from_scratch.ipynb").read_text()
    assert link not in EXERCISES.joinpath("12_grpo_from_scratch.ipynb").read_text()


@pytest.mark.parametrize(
    "source",
    [
        "### BEGIN SOLUTION\nx = 1",
        "x = 1\n### END SOLUTION",
        "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION",
    ],
)
def test_unbalanced_markers_are_an_error(source):
    with pytest.raises(ValueError, match="SOLUTION"):
        make_exercises.strip_solutions(source, make_exercises.CODE_STUB)


def test_there_are_at_least_ten_exercises_each_with_a_solution_and_checks():
    assert len(SOLUTION_PATHS) >= 10
    used = set()
    for path in SOLUTION_PATHS:
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "### BEGIN SOLUTION" in code, path.name
        checks = expected_checks(nb)
        assert checks, f"{path.name} calls no check_* from minigrpo.grading"
        used |= set(checks)
    assert used == set(CASES), f"checks no notebook uses: {sorted(set(CASES) - used)}"


def test_the_checks_the_solutions_call_are_the_one_registry():
    """@check (CHECKS: what minigrpo.grading exports), @cases (CASES: what the grader runs), the checks the grader
    expects of the solutions, the check_x( calls in their cells and the table of minigrpo.grading.checks agree."""
    called, expected = set(), set()
    for path in SOLUTION_PATHS:
        nb = nbformat.read(path, as_version=4)
        called |= {name for cell in nb.cells for name in re.findall(r"\b(check_\w+)\(", cell.source)}
        expected |= set(expected_checks(nb))
    assert called <= set(CHECKS), f"called but not registered with @check: {sorted(called - set(CHECKS))}"
    assert called == expected == set(CHECKS) == set(CASES)
    assert all(getattr(grading, name) is CHECKS[name] and name in grading.__all__ for name in CHECKS)
    docstring = importlib.import_module("minigrpo.grading.checks").__doc__
    table = docstring[docstring.index("| exercise |") :]
    assert set(re.findall(r"\bcheck_\w+", table)) == set(CHECKS)


@pytest.mark.parametrize("path", SOLUTION_PATHS, ids=lambda p: p.stem)
def test_instructions_state_the_points_and_the_grade_command(path):
    nb = nbformat.read(path, as_version=4)
    instructions = next(c.source for c in nb.cells if c.cell_type == "markdown" and "Exercise" in c.source)
    assert f"python -m minigrpo grade exercises/{path.name}" in instructions
    stated = int(re.search(r"\| points \| (\d+) \|", instructions).group(1))
    assert stated == sum(max_points(name) for name in expected_checks(nb))
    for name in expected_checks(nb):
        assert f"`{name}` ({max_points(name):g} points)" in instructions


@pytest.mark.parametrize("folder", [SOLUTIONS, EXERCISES], ids=["solutions", "exercises"])
def test_notebooks_are_committed_without_outputs(folder):
    for path in sorted(folder.glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear the outputs"


def test_exercises_hold_no_solution_code():
    for path in sorted(EXERCISES.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells)
        assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text, path.name
        assert "raise NotImplementedError" in text, path.name
        assert f"exercises/{path.name}" in text and f"solutions/{path.name}" not in text, path.name

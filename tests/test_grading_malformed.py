"""A notebook costs only its own points: a malformed or crafted notebook is unreadable, with the reason, and the
class's grading goes on.

Each notebook here is built by hand, as JSON, the way a learner's editor (or a learner) could leave it. The unit
tests read and grade the ones that start no kernel, in this process; one run of `python -m minigrpo grade`, with
every output asked for, grades a class holding all of them beside two honest notebooks of exercise 04 (the cheapest
exercise to judge), two notebooks at a time.
"""

import csv
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from test_grading_class import CHECK_GRPO, CHECK_RLOO, EXERCISE, GRPO, IMPORTS, NAME, RLOO, notebook

from minigrpo import __version__
from minigrpo.grading.exercises import EXERCISES, identify
from minigrpo.grading.reports.gradebook import grade_command
from minigrpo.grading.runner import _read


def code(source, **fields) -> dict:
    """A code cell as nbformat 4 writes it, with `fields` replaced; a field given as None is left out."""
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source, **fields}
    return {key: value for key, value in cell.items() if fields.get(key, "") is not None}


def notebook_json(*cells: dict, metadata: dict | None = None) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 4, "metadata": metadata or {}, "cells": list(cells)})


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


NOT_CELLS = {
    "source_number": (code(5), "cell 1's source is not text (a number)"),
    "source_null": (code(None), "cell 1's source is not text (null)"),
    "no_cell_type": (code("x = 1", cell_type=None), "cell 1 has no cell_type"),
}
"""A cell that is not a cell (nbformat reads each of these, and only logs that it breaks the schema): the second
cell of its notebook, and the reason the notebook is unreadable."""


@pytest.mark.parametrize("case", sorted(NOT_CELLS))
def test_a_cell_that_is_not_a_cell_makes_its_notebook_unreadable(tmp_path, case):
    cell, reason = NOT_CELLS[case]
    path = write(tmp_path, "06_kl_k3_estimator.ipynb", notebook_json(code("x = 1"), cell))
    nb, why = _read(path, tmp_path)
    assert nb is None and why == f"cannot read {path}: {reason}"


TOO_DEEP = {"nested_minus": "-" * 10_000 + "1"}  # MemoryError: the parser's stack
if sys.version_info >= (3, 11):  # Python 3.10 builds the syntax tree without a recursion limit, and reads this sum
    TOO_DEEP["long_sum"] = "+".join(["1"] * 10_000)  # RecursionError: the syntax tree's depth
"""A cell of about 10-20 kB that Python's parser cannot read at the grader's recursion limit. A kernel whose limit the
learner raised might run the second, so the grader cannot say what either cell runs."""


@pytest.mark.parametrize("case", sorted(TOO_DEEP))
def test_a_cell_nested_too_deeply_for_the_parser_makes_its_notebook_unreadable(tmp_path, case):
    cell = code("check_kl_k3(kl_k3)\n" + TOO_DEEP[case])
    path = write(tmp_path, "06_kl_k3_estimator.ipynb", notebook_json(code("x = 1"), cell))
    nb, why = _read(path, tmp_path)
    error = {"nested_minus": "MemoryError", "long_sum": "RecursionError"}[case]
    assert nb is None and why == (
        f"cannot read {path}: cell 1 is nested too deeply for the grader to read ({error} in Python's parser): "
        "write its expressions in steps"
    )


@pytest.mark.parametrize("stamp", [{"exercise": ["06_kl_k3_estimator"]}, {"exercise": {"id": 5}}, ["05"]])
def test_a_stamp_that_names_no_exercises_id_is_ignored_with_a_note(stamp):
    identity = identify({"minigrpo": stamp}, "06_kl_k3_estimator.ipynb", [], __version__)
    assert (identity.exercise, identity.by, identity.refusal) == (EXERCISES["06_kl_k3_estimator"], "file name", None)
    assert identity.warnings == [
        "its metadata's stamp names no exercise's id (it is not the stamp scripts/make_exercises.py writes): ignored"
    ]


def test_malformed_notebooks_score_zero_and_the_class_goes_on(tmp_path, capsys):
    """Every notebook here is unreadable or calls no check: no kernel starts."""
    folder = tmp_path / "class"
    for student, (cell, _) in NOT_CELLS.items():
        write(folder / student, "06_kl_k3_estimator.ipynb", notebook_json(code("x = 1"), cell))
    for student, source in TOO_DEEP.items():
        write(folder / student, "06_kl_k3_estimator.ipynb", notebook_json(code("check_kl_k3(kl_k3)\n" + source)))
    listed = {"nbformat": 4, "nbformat_minor": 4, "cells": [], "metadata": {"minigrpo": {"exercise": ["05"]}}}
    write(folder / "listed", "mine.ipynb", json.dumps(listed))  # names no exercise, calls no check: runs nothing
    assert grade_command(str(folder), as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    graded = {n["student"]: n for n in report["notebooks"]}
    listed = graded.pop("listed")
    assert (listed["status"], listed["exercise"], listed["checks"]) == ("ok", None, [])
    assert "its metadata's stamp names no exercise's id" in listed["notes"][0]
    assert sorted(graded) == sorted([*NOT_CELLS, *TOO_DEEP])
    for student, report in graded.items():
        assert (report["status"], report["points"], report["max_points"]) == ("unreadable", 0, 3)
        reason = NOT_CELLS[student][1] if student in NOT_CELLS else "cell 0 is nested too deeply"
        path = folder / student / "06_kl_k3_estimator.ipynb"
        assert report["errors"][0].startswith(f"cannot read {path}: {reason}")


SAVED_ERROR = {"output_type": "error", "evalue": "saved by the learner", "traceback": []}  # no ename
KILLS_ITS_KERNEL = "import os\nos._exit(0)"


def test_what_a_notebook_saved_besides_its_cells_is_never_read(tmp_path):
    saved = code("1 / 0", execution_count=7, outputs=[SAVED_ERROR], metadata={"tags": 5})
    path = write(tmp_path, "06_kl_k3_estimator.ipynb", notebook_json(code(KILLS_ITS_KERNEL), saved))
    nb, why = _read(path, tmp_path)
    assert why is None and [cell.source for cell in nb.cells] == [KILLS_ITS_KERNEL, "1 / 0"]
    assert all(cell.outputs == [] and cell.execution_count is None and cell.metadata == {} for cell in nb.cells)


# --- a class of them, with two honest notebooks, graded from the command line ----------------------------------
PRESETS_THE_JUDGES_FOLDER = 'import os\nos.makedirs(os.path.join(os.environ["TMPDIR"], os.pardir, "judge"))'


@pytest.fixture(scope="module")
def class_run(tmp_path_factory):
    """Every notebook above in one class folder (a folder per student), beside ann's and ben's honest notebooks of
    exercise 04, graded once with every output asked for: (exit code, {student: report}, stderr, the outputs' folder).

    Four notebooks start a kernel: the two honest ones, one that makes the folder its judge will use (from the TMPDIR
    its kernel is given) and then answers right, and one whose kernel exits before its cell with a saved error runs.
    """
    home = tmp_path_factory.mktemp("malformed")
    folder, out = home / "class", home / "out"
    out.mkdir()
    honest = notebook(IMPORTS, GRPO, CHECK_GRPO, RLOO, CHECK_RLOO, stamp=EXERCISE.stamp(__version__))
    for student in ("ann", "ben"):
        write(folder / student, NAME, nbformat.writes(honest))
    presets = notebook(PRESETS_THE_JUDGES_FOLDER, IMPORTS, GRPO, CHECK_GRPO, RLOO, CHECK_RLOO)
    write(folder / "presets", NAME, nbformat.writes(presets))
    saved = code(CHECK_GRPO, outputs=[SAVED_ERROR], execution_count=3)
    write(folder / "dies", NAME, notebook_json(code(IMPORTS + GRPO), code(KILLS_ITS_KERNEL), saved))
    for student, (cell, _) in NOT_CELLS.items():
        write(folder / student, NAME, notebook_json(code("x = 1"), cell))
    for student, source in TOO_DEEP.items():
        write(folder / student, NAME, notebook_json(code(CHECK_GRPO + "\n" + source)))
    listed = {"nbformat": 4, "nbformat_minor": 4, "cells": [], "metadata": {"minigrpo": {"exercise": [NAME]}}}
    write(folder / "listed", NAME, json.dumps(listed))
    command = [sys.executable, "-m", "minigrpo", "grade", str(folder), "--json", "--jobs", "2", "--timeout", "90"]
    command += ["--csv", str(out / "grades.csv"), "--checks-csv", str(out / "checks.csv")]
    command += ["--feedback", str(out / "feedback"), "--gradescope", str(out / "results.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    reports = {n["student"]: n for n in json.loads(result.stdout)["notebooks"]} if result.stdout else {}
    return result.returncode, reports, result.stderr, out


def test_a_class_with_every_malformed_notebook_is_graded_and_the_honest_notebooks_in_full(class_run):
    exit_code, reports, stderr, _ = class_run
    assert exit_code == 0, stderr
    for student in ("ann", "ben"):
        assert (reports[student]["status"], reports[student]["points"], reports[student]["max_points"]) == ("ok", 6, 6)
    unreadable = [*NOT_CELLS, *TOO_DEEP]
    assert all(
        (reports[s]["status"], reports[s]["points"], reports[s]["max_points"]) == ("unreadable", 0, 6)
        for s in unreadable
    )
    assert (reports["listed"]["status"], reports["listed"]["points"]) == ("ok", 0)  # known by its file name


def test_a_notebook_that_makes_its_judges_folder_first_is_judged_all_the_same(class_run):
    _, reports, _, _ = class_run
    presets = reports["presets"]
    assert (presets["status"], presets["points"], presets["errors"]) == ("ok", 6, [])


def test_an_error_saved_in_a_cell_that_never_ran_is_not_reported(class_run):
    _, reports, _, _ = class_run
    dies = reports["dies"]
    assert (dies["status"], dies["points"], dies["max_points"]) == ("kernel died", 0, 6)
    assert "saved by the learner" not in json.dumps(dies)


def test_every_output_asked_for_is_written(class_run):
    _, reports, _, out = class_run
    with open(out / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == sorted(reports) and rows["ann"]["total"] == "6"
    checks = (out / "checks.csv").read_text()
    assert checks.count("\n") > len(reports)
    assert sorted(p.stem for p in (out / "feedback").iterdir()) == sorted(reports)
    assert json.loads((out / "results.json").read_text())["tests"]


def test_an_error_no_rule_foresaw_costs_its_notebook_only(tmp_path, capsys, monkeypatch):
    """A notebook on which the grader itself raises (here: its reading of the checks a notebook calls, made to fail on
    one notebook) is unreadable, with the error's type, and the class's grading goes on. No kernel starts."""
    from minigrpo.grading import runner

    folder = tmp_path / "class"
    write(folder / "ann", "06_kl_k3_estimator.ipynb", notebook_json(code("unforeseen")))
    write(folder / "ben", "mine.ipynb", notebook_json(code("x = 1")))  # no exercise, no check: nothing to run
    expected_checks = runner.expected_checks

    def fails_on_one(nb):
        if nb.cells and nb.cells[0].source == "unforeseen":
            raise RuntimeError("a case the grader did not foresee")
        return expected_checks(nb)

    monkeypatch.setattr(runner, "expected_checks", fails_on_one)
    assert grade_command(str(folder), as_json=True) == 0
    reports = {n["student"]: n for n in json.loads(capsys.readouterr().out)["notebooks"]}
    ann, ben = reports["ann"], reports["ben"]
    assert (ann["status"], ann["exercise"], ann["points"], ann["max_points"]) == (
        "unreadable",
        "06_kl_k3_estimator",
        0,
        3,
    )
    assert "the grader failed on it (RuntimeError)" in ann["errors"][0] and "foresee" not in json.dumps(ann)
    assert ben["status"] == "ok"

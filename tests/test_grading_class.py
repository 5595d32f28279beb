"""Grading a class: each exercise's checks and fixed maximum, students from the folders, one gradebook row per
student, honest time, the version contract.

One grading run of a small class in nbgrader's layout (submitted/<student>/ps1/), on exercise 04 (two checks of
hand-made tensors: the cheapest exercise to judge), two notebooks at a time; the other tests need no kernel.
"""

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from minigrpo import __version__, grading
from minigrpo.grading.exercises import EXERCISES, TIME_LIMIT_FACTOR, from_file_name, identify, renumbered
from minigrpo.grading.framework import AFTER_TIMEOUT
from minigrpo.grading.reports.gradebook import class_grades, format_scores, json_report, write_gradebook
from minigrpo.grading.reports.gradescope import exercise_ids
from minigrpo.grading.reports.layouts import read_layout
from minigrpo.grading.runner import EMPTY, NOT_FOUND, NotebookReport, Submission, collect, judge_budget

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = EXERCISES["04_group_relative_advantages"]
NAME = f"{EXERCISE.id}.ipynb"

IMPORTS = "import torch\nfrom minigrpo.grading import check_group_relative_advantages, check_rloo_advantages"
GRPO = """
def group_relative_advantages(grouped_rewards, eps=1e-4):
    mean = grouped_rewards.mean(dim=1, keepdim=True)
    std = grouped_rewards.std(dim=1, keepdim=True)
    advantages = (grouped_rewards - mean) / (std + eps)
    constant = grouped_rewards.max(dim=1, keepdim=True).values == grouped_rewards.min(dim=1, keepdim=True).values
    return torch.where(constant, torch.zeros_like(advantages), advantages)
"""
RLOO = """
def rloo_advantages(grouped_rewards):
    G = grouped_rewards.shape[1]
    return grouped_rewards - (grouped_rewards.sum(dim=1, keepdim=True) - grouped_rewards) / (G - 1)
"""
CHECK_GRPO = "check_group_relative_advantages(group_relative_advantages)"
CHECK_RLOO = "check_rloo_advantages(rloo_advantages)"
PASTED = "from minigrpo.grading import check_kl_k3\n\ncheck_kl_k3(lambda a, b: a - b)"  # exercise 06's check
GRPO_LOOPS = """
def group_relative_advantages(grouped_rewards, eps=1e-4):
    while True:  # an infinite loop: it never returns
        pass
"""
TIMEOUT = 90  # seconds per notebook in the class run


def notebook(*sources: str, stamp: dict | None = None) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    if stamp is not None:
        nb.metadata["minigrpo"] = stamp
    return nb


def handed_in(submitted: Path, student: str, name: str, nb) -> Path:
    path = submitted / student / "ps1" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class, graded once from the command line: (the JSON report, stderr, the gradebook CSV, wall seconds)."""
    submitted = tmp_path_factory.mktemp("course") / "submitted"
    current = EXERCISE.stamp(__version__)
    older = {**current, "version": "0.0.1"}
    # aaron comes first, so his notebook, whose function loops forever when the judge calls it, runs beside the others
    handed_in(submitted, "aaron", NAME, notebook(IMPORTS, GRPO_LOOPS, CHECK_GRPO, RLOO, CHECK_RLOO, stamp=older))
    # bob renamed his copy and deleted the RLOO check's cell, pasted exercise 06's check, and handed in an empty copy
    copy = notebook(IMPORTS, GRPO, CHECK_GRPO, RLOO, PASTED, stamp=current)
    handed_in(submitted, "bob", f"Copy of {NAME}", copy)
    handed_in(submitted, "bob", f"{EXERCISE.id} (1).ipynb", notebook(stamp=current))
    handed_in(submitted, "carol", NAME, '{"cells": [ this is not a notebook')  # unreadable
    handed_in(submitted, "dave", NAME, notebook())  # empty, unstamped: known by its file name
    changed = {**current, "version": "0.0.1", "checks": {"check_group_relative_advantages": 4}}
    handed_in(submitted, "erin", NAME, notebook(IMPORTS, GRPO, CHECK_GRPO, RLOO, CHECK_RLOO, stamp=changed))
    # frank's handout came before the renumbering: exercise 04 under its former id, in its stamp and its file name
    former = {**current, "exercise": EXERCISE.formerly}
    handed_in(
        submitted,
        "frank",
        f"{EXERCISE.formerly}.ipynb",
        notebook(IMPORTS, GRPO, CHECK_GRPO, RLOO, CHECK_RLOO, stamp=former),
    )
    gradebook = submitted.parent / "grades.csv"
    command = [sys.executable, "-m", "minigrpo", "grade", str(submitted), "--json", "--jobs", "2"]
    command += ["--timeout", str(TIMEOUT), "--csv", str(gradebook), "--checks-csv", str(submitted.parent / "c.csv")]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    with open(gradebook, newline="") as f:
        rows = list(csv.DictReader(f))
    return json.loads(result.stdout), result.stderr, rows, seconds


def by_student(report: dict) -> dict[str, list[dict]]:
    students = {}
    for notebook_report in report["notebooks"]:
        students.setdefault(notebook_report["student"], []).append(notebook_report)
    return students


def checks_of(notebook_report: dict) -> dict[str, dict]:
    return {c["check"]: c for c in notebook_report["checks"]}


def test_every_notebook_is_graded_on_its_exercises_fixed_maximum(graded):
    report, _, _, _ = graded
    assert {n["exercise"] for n in report["notebooks"]} == {EXERCISE.id}
    assert all(n["max_points"] == EXERCISE.max_points == 6 for n in report["notebooks"])
    copy = next(n for n in by_student(report)["bob"] if Path(n["path"]).name.startswith("Copy of"))
    assert (copy["points"], copy["status"], copy["identified_by"]) == (4, "ok", "metadata")


def test_a_deleted_check_scores_zero_of_its_points_and_a_pasted_one_is_ignored(graded):
    report, _, _, _ = graded
    copy = next(n for n in by_student(report)["bob"] if Path(n["path"]).name.startswith("Copy of"))
    checks = checks_of(copy)
    assert list(checks) == ["check_group_relative_advantages", "check_rloo_advantages"]  # no check_kl_k3
    assert checks["check_rloo_advantages"]["points"] == 0 and checks["check_rloo_advantages"]["max_points"] == 2
    assert checks["check_rloo_advantages"]["not_run"] == NOT_FOUND
    assert checks["check_group_relative_advantages"]["points"] == 4 and copy["points"] == 4
    assert any("check_kl_k3 belongs to exercise 06_kl_k3_estimator" in note for note in copy["notes"])


def test_empty_and_unreadable_notebooks_score_zero_of_the_maximum(graded):
    report, _, _, _ = graded
    (carol,) = by_student(report)["carol"]
    (dave,) = by_student(report)["dave"]
    assert (carol["status"], carol["points"], carol["max_points"]) == ("unreadable", 0, 6)
    assert (dave["status"], dave["points"], dave["max_points"], dave["identified_by"]) == ("ok", 0, 6, "file name")
    assert all(c["not_run"] == EMPTY for c in dave["checks"]) and dave["seconds"] == 0  # said so, and not run


def test_renamed_copies_grade_as_their_exercise_and_the_best_of_several_counts(graded):
    report, _, rows, _ = graded
    bob = by_student(report)["bob"]
    assert sorted(Path(n["path"]).name for n in bob) == [f"{EXERCISE.id} (1).ipynb", f"Copy of {NAME}"]
    assert {n["exercise"] for n in bob} == {EXERCISE.id}
    (grade,) = [s for s in report["students"] if s["student"] == "bob"]
    assert grade["exercises"] == {EXERCISE.id: 4} and grade["points"] == 4  # the copy's 4, not the empty one's 0
    assert any("2 notebooks of exercise 04" in note and "the best counts" in note for note in grade["notes"])


def test_the_gradebook_has_one_row_per_student(graded):
    report, _, rows, _ = graded
    assert [r["student"] for r in rows] == ["aaron", "bob", "carol", "dave", "erin", "frank"]
    assert list(rows[0]) == ["student", EXERCISE.id, "total", "max_points"]
    totals = {r["student"]: (r[EXERCISE.id], r["total"], r["max_points"]) for r in rows}
    assert totals["aaron"] == ("2", "2", "6") and totals["bob"] == ("4", "4", "6")
    assert totals["carol"] == ("0", "0", "6") and totals["erin"] == ("0", "0", "6")
    assert [s["student"] for s in report["students"]] == [r["student"] for r in rows]


def test_another_versions_handout_is_graded_with_a_warning_or_refused_when_its_checks_changed(graded):
    report, _, _, _ = graded
    (aaron,) = by_student(report)["aaron"]
    assert any("handed out with minigrpo 0.0.1, graded with minigrpo " + __version__ in n for n in aaron["notes"])
    (erin,) = by_student(report)["erin"]
    assert (erin["status"], erin["points"], erin["max_points"]) == ("refused", 0, 6)
    assert "whose exercise 04_group_relative_advantages differs from minigrpo " in erin["errors"][0]
    assert erin["seconds"] == 0  # refused before any kernel started


def test_a_notebook_under_its_former_number_is_graded_under_its_new_one_with_a_note(graded):
    report, _, rows, _ = graded
    (frank,) = by_student(report)["frank"]
    assert (frank["exercise"], frank["points"], frank["max_points"], frank["status"]) == (EXERCISE.id, 6, 6, "ok")
    assert frank["notes"] == [renumbered(EXERCISE.formerly, EXERCISE)]
    assert next(r for r in rows if r["student"] == "frank")[EXERCISE.id] == "6"  # the new number's column


@pytest.mark.parametrize("exercise_", [e for e in EXERCISES.values() if e.formerly], ids=lambda e: e.id)
def test_every_renumbered_exercise_is_known_by_its_former_id(exercise_):
    note = renumbered(exercise_.formerly, exercise_)
    assert note.startswith(f"exercise {exercise_.formerly} is exercise {exercise_.id} since the exercises were")
    old_handout = {"minigrpo": {**exercise_.stamp("0.2.0"), "exercise": exercise_.formerly}}
    stamped = identify(old_handout, f"{exercise_.formerly}.ipynb", [], __version__)
    assert (stamped.exercise, stamped.by, stamped.refusal) == (exercise_, "metadata", None)
    assert stamped.warnings[0] == note and "checks are the same in both" in stamped.warnings[1]
    this_version = {"minigrpo": {**exercise_.stamp(__version__), "exercise": exercise_.formerly}}
    assert identify(this_version, f"Copy of {exercise_.formerly}.ipynb", [], __version__).warnings == [note]
    unstamped = identify({}, f"{exercise_.formerly} (1).ipynb", [], __version__)
    assert (unstamped.exercise, unstamped.by, unstamped.warnings) == (exercise_, "file name", [note])
    in_a_folder_so_named = identify({}, f"{exercise_.formerly}/{exercise_.id}.ipynb", [], __version__)
    assert (in_a_folder_so_named.exercise, in_a_folder_so_named.warnings) == (exercise_, [])
    assert exercise_ids([exercise_.formerly]) == [exercise_.id]  # an autograder zip made before the renumbering
    changed = {**old_handout["minigrpo"], "revision": exercise_.revision + 1}
    assert identify({"minigrpo": changed}, "x.ipynb", [], __version__).refusal is not None  # the contract still holds


def test_every_exercise_of_the_renumbering_has_one_former_id_and_no_two_share_one():
    """The fifteen exercises that minigrpo 0.3.0 renumbered each have their former id; an exercise added since has
    none, and a number past theirs, so no handout's former number can name it."""
    renumbered_ = [e for e in EXERCISES.values() if e.formerly is not None]
    formers = [e.formerly for e in renumbered_]
    assert len(set(formers)) == len(formers) == 15 and not set(formers) & set(EXERCISES)
    assert sorted(f[:2] for f in formers) == sorted(e.number for e in renumbered_)
    assert all(e.number > max(formers)[:2] for e in EXERCISES.values() if e.formerly is None)


def test_a_function_that_loops_costs_its_own_check_within_the_notebooks_limit(graded):
    report, _, _, _ = graded
    (aaron,) = by_student(report)["aaron"]
    # the notebook's limit, and at most the judge's own time for its checks (runner.judge_budget) when that is more
    judged = judge_budget(EXERCISES[aaron["exercise"]].checks, 0.0)
    assert aaron["time_limit"] == TIMEOUT and aaron["seconds"] <= TIMEOUT + judged + 2  # + killing the kernel
    checks = checks_of(aaron)
    first, *rest = checks["check_group_relative_advantages"]["cases"]
    assert first["message"].startswith("timed out: your function took longer than")
    assert rest and all(c["message"] == AFTER_TIMEOUT for c in rest)  # one case's time, not each case's
    assert checks["check_rloo_advantages"]["points"] == 2  # the next check had its own share of the time


def test_progress_counts_the_graded_notebooks_and_names_their_students(graded):
    report, stderr, _, _ = graded
    lines = stderr.splitlines()
    counts = [int(m.group(1)) for line in lines if (m := re.match(r"(\d+)/7 graded: (\w+) ", line))]
    assert counts == list(range(1, 8))
    assert any(line.startswith("7/7 graded: ") for line in lines)


CALLS_ITS_CHECK = "check_kl_k3(kl_k3)"  # a NameError (nothing imported): the notebook is run, and judged on time
IMPORT_FAILS = "import numpyy  # a typo: the check's NameError comes from it"
STOPS = "while True:  # an experiment that never ends\n    pass"
WILL_NOT_STOP = (
    "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass"
)


@pytest.fixture(scope="module")
def hanging_cells(tmp_path_factory):
    """Two notebooks whose first code cell hangs (after a Markdown cell), graded at once with a limit of 24 s (12 s a
    cell) and a running line every second: one cell stops when interrupted, the other catches KeyboardInterrupt; an
    import fails after it. {student: report}, lines."""
    folder = tmp_path_factory.mktemp("hanging")
    submissions = []
    for student, hang in [("stops", STOPS), ("will_not_stop", WILL_NOT_STOP)]:
        path = folder / student / "06_kl_k3_estimator.ipynb"
        path.parent.mkdir()
        nb = notebook(hang, IMPORT_FAILS, "after = 1", CALLS_ITS_CHECK)
        nb.cells.insert(0, nbformat.v4.new_markdown_cell("# Exercise 06: not a cell the learner counts"))
        nbformat.write(nb, path)
        submissions.append(Submission(path, student))
    lines = []
    reports = grading.grade_notebooks(submissions, timeout=24, jobs=2, progress=lines.append, heartbeat_s=1)
    return {r.student: r for r in reports}, lines


def test_the_cells_after_a_hanging_cell_still_run_within_the_limit(hanging_cells):
    reports, _ = hanging_cells
    stops = reports["stops"]
    assert stops.seconds <= 24 + judge_budget(["check_kl_k3"], 0.0) + 2 and stops.max_points == 3
    assert stops.errors[0] == (  # counted as the learner counts: code cells, from 1, with the cell's first line
        "code cell 1 (`while True:  # an experiment that never ends`) ran out of time: it ran longer than 12 s (half "
        "the notebook's limit), was interrupted, and the cells after it still ran"
    )
    assert any(e.startswith("NameError") for e in stops.errors)  # the check's cell ran: the cells after it did
    assert stops.checks[0]["not_run"] == (  # the import error first, not only the NameError it caused
        "ModuleNotFoundError: No module named 'numpyy', in code cell 2 (`import numpyy  # a typo: the check's "
        "NameError comes from it`); this check's cell then raised NameError: name 'check_kl_k3' is not defined"
    )


def test_a_cell_that_does_not_stop_when_interrupted_ends_the_notebook_saying_it_ran_out_of_time(hanging_cells):
    reports, _ = hanging_cells
    stuck = reports["will_not_stop"]
    assert stuck.status == "timed out" and stuck.seconds <= 24 + 2
    assert stuck.errors[0].startswith("code cell 1 (`while True:`) ran out of time (over 12 s) and did not stop when ")
    assert "the notebook ran out of time; the cells after it did not run (limit 24 s (--timeout))" in stuck.errors[0]
    assert stuck.checks[0]["points"] == 0 and stuck.checks[0]["not_run"] == "the notebook timed out"  # never ran


def test_running_lines_come_at_least_every_heartbeat_while_notebooks_run(hanging_cells):
    _, lines = hanging_cells
    running = [line for line in lines if line.startswith("0/2 graded; running: ")]
    assert len(running) >= 3 and "stops 06_kl_k3_estimator.ipynb (" in running[0]
    assert [line.split(":")[0] for line in lines if " graded: " in line] == ["1/2 graded", "2/2 graded"]


# --- the pieces, without a kernel ---------------------------------------------------------------------
def test_every_check_belongs_to_exactly_one_exercise_and_its_solution_calls_all_of_them():
    owned = [name for e in EXERCISES.values() for name in e.checks]
    assert sorted(owned) == sorted(grading.CASES) and len(owned) == len(set(owned))
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        exercise = EXERCISES[path.stem]
        assert grading.expected_checks(nb) == list(exercise.checks), path.name
        assert nb.metadata["minigrpo"] == exercise.stamp(__version__), "run python scripts/make_exercises.py"


def test_the_default_limit_is_three_times_the_solutions_grading_time_and_help_shows_it(capsys):
    from minigrpo.__main__ import build_parser

    for exercise in EXERCISES.values():
        assert exercise.time_limit <= TIME_LIMIT_FACTOR * exercise.solution_seconds < exercise.time_limit + 1
    with pytest.raises(SystemExit):
        build_parser().parse_args(["grade", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"04 {EXERCISE.time_limit} s" in help_text and "3x the time its solution takes to grade" in help_text


@pytest.mark.parametrize(
    "name",
    [NAME, f"Copy of {NAME}", f"{EXERCISE.id} (1).ipynb", f"{EXERCISE.id}-Copy1.ipynb", "04_mine.ipynb"],
)
def test_renamed_file_names_name_their_exercise(name):
    assert from_file_name(name) is EXERCISE


@pytest.mark.parametrize("name", ["homework.ipynb", "2024_notes.ipynb", "20_future.ipynb"])
def test_other_file_names_name_no_exercise(name):
    assert from_file_name(name) is None


def test_identity_comes_from_the_stamp_then_the_file_name_then_the_checks():
    stamp = {"minigrpo": EXERCISE.stamp(__version__)}
    by_stamp = identify(stamp, "06_kl_k3_estimator.ipynb", [], __version__)
    assert (by_stamp.exercise, by_stamp.by) == (EXERCISE, "metadata")
    assert "file name says exercise 06_kl_k3_estimator" in by_stamp.warnings[0]
    assert identify({}, "Copy of 04_x.ipynb", ["check_kl_k3"], __version__).exercise is EXERCISE
    by_checks = identify({}, "mine.ipynb", ["check_kl_k3"], __version__)
    assert (by_checks.exercise.id, by_checks.by) == ("06_kl_k3_estimator", "checks")
    unknown = identify({}, "mine.ipynb", ["check_kl_k3", "check_rloo_advantages"], __version__)
    assert unknown.exercise is None and "left out of the gradebook" in unknown.warnings[0]


def test_the_version_contract_warns_when_checks_match_and_refuses_when_they_changed():
    same = identify({"minigrpo": {**EXERCISE.stamp("0.0.1")}}, NAME, [], "9.9.9")
    assert same.refusal is None
    assert same.warnings == [
        "handed out with minigrpo 0.0.1, graded with minigrpo 9.9.9: exercise 04_group_relative_advantages's checks "
        "are the same in both"
    ]
    renamed = {**EXERCISE.stamp("0.0.1"), "checks": {"check_group_relative_advantages": 4, "check_rloo": 2}}
    assert "differs from minigrpo 9.9.9's" in identify({"minigrpo": renamed}, NAME, [], "9.9.9").refusal
    revised = {**EXERCISE.stamp("0.0.1"), "revision": EXERCISE.revision + 1}
    assert identify({"minigrpo": revised}, NAME, [], "9.9.9").refusal is not None
    assert identify({"minigrpo": EXERCISE.stamp(__version__)}, NAME, [], __version__).warnings == []


def test_a_refusal_names_what_differs_and_what_to_do():
    revised = {**EXERCISE.stamp("9.9.9"), "revision": EXERCISE.revision + 1}  # this very version, another revision
    assert identify({"minigrpo": revised}, NAME, [], "9.9.9").refusal == (
        "handed out with minigrpo 9.9.9, this very version, but another copy of it, whose exercise "
        f"04_group_relative_advantages differs from this copy's (revision {EXERCISE.revision + 1} in the handout, "
        f"{EXERCISE.revision} here: what the learner writes changed): grade it with the copy of minigrpo 9.9.9 that "
        "made the handout, or hand out this copy's exercise (python scripts/make_exercises.py writes it)"
    )
    renamed = {**EXERCISE.stamp("0.0.1"), "checks": {"check_group_relative_advantages": 3, "check_rloo": 2}}
    assert identify({"minigrpo": renamed}, NAME, [], "9.9.9").refusal == (
        "handed out with minigrpo 0.0.1, whose exercise 04_group_relative_advantages differs from minigrpo 9.9.9's "
        "(check_group_relative_advantages: 4 points here, 3 in the handout; check_rloo_advantages: not in the handout; "
        "'check_rloo': in the handout only): grade it with minigrpo 0.0.1, or hand out minigrpo 9.9.9's exercise"
    )
    crafted = {**EXERCISE.stamp("0.0.1"), "checks": {f"x{i}": [0] * 100 for i in range(12)}}  # the learner's file
    refusal = identify({"minigrpo": crafted}, NAME, [], "9.9.9").refusal
    assert "; 'x2': in the handout only; 9 more)" in refusal and len(refusal) < 500
    unversioned = {key: value for key, value in revised.items() if key != "version"}
    refusal = identify({"minigrpo": unversioned}, NAME, [], "9.9.9").refusal
    assert refusal.startswith("handed out with a minigrpo that stamped no version, whose exercise 04_group_relative")
    assert refusal.endswith("grade it with the minigrpo that made the handout, or hand out minigrpo 9.9.9's exercise")


def lay_out(root: Path, *relatives: str) -> Path:
    """Empty notebooks at `relatives` under `root`; returns root."""
    for relative in relatives:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook(), root / relative)
    return root


def students(path, student=None) -> list[str]:
    return [s.student for s in read_layout(path, student).submissions]


def test_students_come_from_nbgraders_layout_a_folder_each_or_the_file_name(tmp_path):
    lay_out(tmp_path, "submitted/ann/ps1/04_a.ipynb", "folders/ben/04_a.ipynb", "flat/cat.ipynb")
    assert students(tmp_path / "submitted") == ["ann"]
    assert students(tmp_path / "folders") == ["ben"]
    assert students(tmp_path / "flat") == ["cat"]
    assert students(tmp_path / "flat" / "cat.ipynb") == ["cat"]
    assert read_layout(tmp_path / "submitted").description == (
        "nbgrader's submitted/ (submitted/<student>/<assignment>/): 1 student (ann)"
    )
    flat = read_layout(tmp_path / "flat").description
    assert flat == "a flat folder: each notebook's student is its file's stem (1 notebook)"


def test_one_students_folder_of_nbgraders_layout_is_theirs_however_deep_the_path_points(tmp_path):
    class_ = lay_out(tmp_path / "submitted", "gus/hw02/02_a.ipynb", "gus/hw05/05_b.ipynb", "ann/hw02/02_a.ipynb")
    assert students(class_) == ["ann", "gus", "gus"]
    for path in (class_ / "gus", class_ / "gus" / "hw02", class_ / "gus" / "hw02" / "02_a.ipynb"):
        assert set(students(path)) == {"gus"}, path
    line = read_layout(class_ / "gus").description
    assert line == (
        "nbgrader's, one student's folder (submitted/<student>/<assignment>/): every notebook is gus's "
        "(2 notebooks; --student NAME names another)"
    )


def test_a_folder_per_student_keeps_its_students_whatever_subfolders_their_notebooks_sit_in(tmp_path):
    class_ = lay_out(tmp_path / "class", "ann/week1/02_a.ipynb", "ann/week2/deep/05_b.ipynb", "ben/02_a.ipynb")
    assert students(class_) == ["ann", "ann", "ben"]
    line = read_layout(class_).description
    assert line.startswith("a folder per student (<student>/...): 2 students (ann, ben); ")
    assert line.endswith("; for one student's folder, give --student NAME")  # its folders could be assignments


def test_which_layout_wins_when_a_folder_reads_two_ways_and_student_wins_over_all(tmp_path):
    """PATH/a/x.ipynb: a class (a is a student) or one student's nbgrader folder (a is an assignment)? PATH's own path
    decides: right below a folder named submitted, one student's; elsewhere a class. --student wins over both."""
    tree = ("hw02/02_a.ipynb", "hw05/05_b.ipynb")
    below_submitted = lay_out(tmp_path / "submitted" / "eve", *tree)
    elsewhere = lay_out(tmp_path / "copied" / "eve", *tree)
    assert students(below_submitted) == ["eve", "eve"]
    assert students(elsewhere) == ["hw02", "hw05"]  # a class of two: the line names them, and says what to give
    line = read_layout(elsewhere).description
    assert "2 students (hw02, hw05)" in line and "--student NAME" in line
    assert students(elsewhere, student="eve") == students(below_submitted, student="eve") == ["eve", "eve"]
    assert students(tmp_path / "submitted", student="eve") == ["eve", "eve"]  # a whole class, named one student
    line = read_layout(elsewhere, "eve").description
    assert line == f"--student: every notebook under {elsewhere} is eve's (2 notebooks)"


def test_regrading_one_student_of_a_class_writes_one_row_and_one_feedback_file_under_their_name(
    tmp_path, monkeypatch, capsys
):
    from minigrpo.__main__ import main

    for student in ("ann", "eve"):  # no kernel starts: an empty notebook and one that is no notebook
        lay_out(tmp_path / "submitted" / student, f"hw02/{NAME}")
        (tmp_path / "submitted" / student / "hw05" / "06_kl_k3_estimator.ipynb").parent.mkdir()
        (tmp_path / "submitted" / student / "hw05" / "06_kl_k3_estimator.ipynb").write_text("not a notebook")
    monkeypatch.chdir(tmp_path)
    outputs = ["--feedback", "fb", "--csv", "eve.csv", "--gradescope", "eve.json"]
    assert main(["grade", "submitted/eve", *outputs]) == 0
    err = capsys.readouterr().err
    assert (
        "\nlayout: nbgrader's, one student's folder (submitted/<student>/<assignment>/): every notebook is eve's ("
        in ("\n" + err)
    )
    with open("eve.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["student"], r[EXERCISE.id], r["06_kl_k3_estimator"], r["max_points"]) for r in rows] == [
        ("eve", "0", "0", "9")
    ]
    assert sorted(p.name for p in Path("fb").iterdir()) == ["eve.md"]
    assert "# Feedback for `eve`" in Path("fb/eve.md").read_text()
    results = json.loads(Path("eve.json").read_text())  # one submission: both exercises, every check listed
    assert [t["name"] for t in results["tests"]] == [
        "04 check_group_relative_advantages",
        "04 check_rloo_advantages",
        "06 check_kl_k3",
    ]
    assert main(["grade", "submitted/eve/hw02", "--student", "evelyn", "--csv", "evelyn.csv"]) == 0
    assert "layout: --student: every notebook under submitted/eve/hw02 is evelyn's" in capsys.readouterr().err
    assert Path("evelyn.csv").read_text().splitlines()[1].startswith("evelyn,0,")


def report_of(student: str, name: str, points: float, exercise: str | None = EXERCISE.id) -> NotebookReport:
    checks = [{"check": "check_group_relative_advantages", "points": points, "max_points": 4, "cases": []}]
    return NotebookReport(f"{student}/{name}", checks=checks, student=student, exercise=exercise)


def test_class_grades_keep_the_best_of_several_notebooks_and_leave_unknown_ones_out(tmp_path):
    reports = [
        report_of("ann", "a.ipynb", 1),
        report_of("ann", "b.ipynb", 3),
        report_of("ann", "c.ipynb", 3),  # a tie: the first path counts
        report_of("ben", "x.ipynb", 2, exercise=None),
    ]
    grades = class_grades(reports)
    ann, ben = grades.students
    assert ann.exercises[EXERCISE.id] is reports[1] and ann.points == 3
    assert (
        "3 notebooks of exercise 04_group_relative_advantages" in ann.notes[0] and "counts, ann/b.ipynb" in ann.notes[0]
    )
    assert ben.exercises == {} and "left out of the gradebook" in ben.notes[0]
    write_gradebook(reports, tmp_path / "g.csv")
    assert (tmp_path / "g.csv").read_text().splitlines() == [
        f"student,{EXERCISE.id},total,max_points",
        "ann,3,3,6",
        "ben,,0,6",  # not handed in: an empty cell, 0 in the total
    ]


def test_every_line_of_the_table_about_a_notebook_names_its_student(tmp_path):
    path = tmp_path / "ann" / NAME
    path.parent.mkdir()
    nbformat.write(notebook(IMPORTS, CHECK_GRPO), path)
    report = NotebookReport(str(path), student="ann", exercise=EXERCISE.id)
    collect(nbformat.read(path, as_version=4), {}, report)
    table = format_scores([report])
    assert re.search(rf"ann\s+{EXERCISE.id}\s+check_rloo_advantages\s+0\s+2", table)
    lost = table.split("what lost points:")[1].split("\n\n")[0].strip().splitlines()
    assert lost and all(line.strip().startswith(f"ann / {EXERCISE.id} ({NAME})") for line in lost)
    assert f"ann / {EXERCISE.id} ({NAME}) / check_rloo_advantages: did not run ({NOT_FOUND})" in table


# --- what the grader says, as a learner reads it -------------------------------------------------------------
def test_an_empty_notebook_is_told_that_nothing_was_handed_in_and_is_not_run(tmp_path):
    empty = lay_out(tmp_path, NAME) / NAME  # saved with no cell at all
    text_only = notebook("   \n")  # a blank code cell, and text
    text_only.cells.insert(0, nbformat.v4.new_markdown_cell("I did not get to it."))
    nbformat.write(text_only, tmp_path / "06_kl_k3_estimator.ipynb")
    started = time.monotonic()
    reports = grading.grade_notebooks([empty, tmp_path / "06_kl_k3_estimator.ipynb"], timeout=60, jobs=1)
    assert time.monotonic() - started < 5  # no kernel started
    for report in reports:
        assert report.points == 0 and report.max_points > 0 and report.errors == []
        assert [c["not_run"] for c in report.checks] == [EMPTY] * len(report.checks)
    assert EMPTY == "nothing was handed in: your notebook has no code in it"  # not "was its cell deleted?"


def test_a_cell_is_named_as_a_learner_finds_it_a_code_cells_number_from_one_and_its_first_line():
    from minigrpo.grading.cells import cell_label, code_cell_numbers
    from minigrpo.grading.runner import _out_of_time

    nb = notebook("x = 1", "\n\n    while True:  # forever\n        pass", "y = " + "1 + " * 30 + "1", "")
    nb.cells.insert(0, nbformat.v4.new_markdown_cell("# Title"))
    nb.cells.insert(2, nbformat.v4.new_markdown_cell("Why."))  # cells: md, x, md, while, y, empty
    assert [cell_label(nb.cells, i) for i in (1, 3, 5)] == [
        "code cell 1 (`x = 1`)",
        "code cell 2 (`while True:  # forever`)",
        "code cell 4 (empty)",
    ]
    assert cell_label(nb.cells, 4) == f"code cell 3 (`{('y = ' + '1 + ' * 30)[:57]}...`)"
    report = NotebookReport("ann/02.ipynb")
    _out_of_time(report, nb, [4, 5], "24 s (--timeout)", interrupted=3)
    assert report.errors == [
        "the notebook ran out of time: its limit is 24 s (--timeout); code cell 2 (`while True:  # forever`) was "
        "interrupted; code cells 3, 4 did not run"
    ]
    assert code_cell_numbers(nb.cells, [5]) == "code cell 4"


def test_an_import_error_is_said_before_the_name_error_it_causes_in_a_checks_cell():
    def failed(ename: str, evalue: str) -> list:
        return [nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[])]

    nb = notebook(
        "import torch\nfrom minigrpo import kl_k3_mine",
        "def kl_k3(logp, ref_logp):\n    return torch.exp(ref_logp - logp)",
        "check_kl_k3(kl_k3)",
    )
    nb.cells[0].outputs = failed("ImportError", "cannot import name 'kl_k3_mine' from 'minigrpo'")
    nb.cells[2].outputs = failed("NameError", "name 'check_kl_k3' is not defined")
    report = NotebookReport("ann/06_kl_k3_estimator.ipynb", student="ann", exercise="06_kl_k3_estimator")
    collect(nb, {}, report)
    assert report.checks[0]["not_run"] == (
        "ImportError: cannot import name 'kl_k3_mine' from 'minigrpo', in code cell 1 (`import torch`); "
        "this check's cell then raised NameError: name 'check_kl_k3' is not defined"
    )
    nb.cells[0].outputs = []  # no import failed: the NameError is the cell's own error
    report = NotebookReport("ann/06_kl_k3_estimator.ipynb", student="ann", exercise="06_kl_k3_estimator")
    collect(nb, {}, report)
    assert report.checks[0]["not_run"] == "NameError: name 'check_kl_k3' is not defined"


def test_the_table_names_a_students_notebooks_of_one_exercise_and_totals_only_the_one_that_counts():
    reports = [
        report_of("ann", NAME, 3),
        report_of("bob", f"{EXERCISE.id} (1).ipynb", 0),  # an empty second copy: not counted
        report_of("bob", f"Copy of {NAME}", 4),
    ]
    table = format_scores(reports)
    rows = [line.split("  check_")[0].rstrip() for line in table.splitlines() if "  check_" in line]
    assert rows == [
        f"ann      {EXERCISE.id}",
        f"bob      {EXERCISE.id} ({EXERCISE.id} (1).ipynb, not counted)",
        f"bob      {EXERCISE.id} (Copy of {NAME})",
    ]
    assert re.search(r"^total\s+7\s+8$", table, flags=re.MULTILINE)  # ann's 3/4 and bob's 4/4, not bob's copy's 4
    summary = json_report("class", reports, 1.0, None)
    assert (summary["points"], summary["max_points"]) == (7, 8)
    gradebook = table.split("gradebook (one row per student; --csv writes it):\n")[1].splitlines()
    assert [line.split()[0] for line in gradebook[1:]] == ["ann", "bob"]

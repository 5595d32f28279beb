"""What a graded class hands back: a feedback file per student, Gradescope's results.json, the autograder zip.

Built from the gradebook's data structures (NotebookReports holding check records that `evaluate` made from real
cases), with no kernel: the guide's test (tests/test_instructors_guide.py) runs the same outputs from the command
line on a graded class and through the autograder's run_autograder.
"""

import json
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import jsonschema
import pytest
import torch

from minigrpo import __version__
from minigrpo.__main__ import main
from minigrpo.grading import run_check
from minigrpo.grading.exercises import EXERCISES
from minigrpo.grading.reports.feedback import check_text, code_block, code_span, feedback_file_name, write_feedback
from minigrpo.grading.reports.files import write_text
from minigrpo.grading.reports.gradescope import autograder_command, exercise_ids, results, write_autograder
from minigrpo.grading.runner import NOT_FOUND, NotebookReport, Submission

SCHEMA = json.loads((Path(__file__).parent / "data" / "gradescope_results.schema.json").read_text())
EXERCISE = EXERCISES["04_group_relative_advantages"]


def nan_on_equal_rewards(grouped_rewards, eps=1e-4):
    """A learner's mistake: right, except that a group whose rewards are all equal gets 0 / (0 + eps), NaN at eps=0."""
    mean = grouped_rewards.mean(dim=1, keepdim=True)
    return (grouped_rewards - mean) / (grouped_rewards.std(dim=1, keepdim=True) + eps)


def rloo(grouped_rewards):
    G = grouped_rewards.shape[1]
    return grouped_rewards - (grouped_rewards.sum(dim=1, keepdim=True) - grouped_rewards) / (G - 1)


@pytest.fixture(scope="module")
def records():
    """Check records as the judge writes them: {"grpo_wrong": 3 of 4 points, "rloo": 2 of 2}."""
    wrong = run_check("check_group_relative_advantages", nan_on_equal_rewards, quiet=True)
    right = run_check("check_rloo_advantages", rloo, quiet=True)
    return {"grpo_wrong": wrong.to_dict(), "rloo": right.to_dict()}


def not_found(check: str, points: float) -> dict:
    return {"check": check, "points": 0.0, "max_points": points, "cases": [], "not_run": NOT_FOUND}


def report(student, name, checks, exercise=EXERCISE.id, **fields) -> NotebookReport:
    return NotebookReport(
        f"/course/submitted/{student}/ps1/{name}", checks=checks, student=student, exercise=exercise, **fields
    )


@pytest.fixture(scope="module")
def reports(records):
    """ann: two notebooks of exercise 04 (3 + 2 and 0 + 2 points: the first counts); ben: an unreadable one;
    a student whose folder name is Markdown, HTML and an escape sequence."""
    ann_best = report("ann", "02_mine.ipynb", [records["grpo_wrong"], records["rloo"]])
    ann_other = report("ann", "02_old.ipynb", [not_found("check_group_relative_advantages", 4), records["rloo"]])
    ben = report(
        "ben",
        f"{EXERCISE.id}.ipynb",
        [not_found("check_group_relative_advantages", 4), not_found("check_rloo_advantages", 2)],
        status="unreadable",
        errors=["not a notebook: Expecting value: line 1 column 1 (char 0)"],
    )
    odd = report("c`<b>x</b>\x1b[31m", "02.ipynb", [records["rloo"]], notes=["a note with ``` inside"])
    return [ann_best, ann_other, ben, odd]


# --- feedback -----------------------------------------------------------------------------------------------
def test_a_checks_text_is_what_the_notebooks_check_cell_prints(records, capsys):
    run_check("check_group_relative_advantages", nan_on_equal_rewards)
    printed = capsys.readouterr().out
    assert check_text(records["grpo_wrong"]) + "\n" == printed
    assert "FAIL  groups whose rewards are all equal get 0, not NaN (eps=0)  [0/0.5]" in printed
    assert "NaN where the answer has none" in printed  # the hint reaches the student


def test_a_check_that_did_not_run_scores_zero_of_its_maximum_and_says_why():
    assert check_text(not_found("check_rloo_advantages", 2)) == (
        f"check_rloo_advantages: 0/2 points\n  did not run: {NOT_FOUND}"
    )


def test_one_feedback_file_per_student_with_their_gradebook_row_and_every_notebook(reports, records, tmp_path):
    written = write_feedback(reports, tmp_path / "feedback")
    assert sorted(p.name for p in (tmp_path / "feedback").iterdir()) == ["ann.md", "ben.md", "c__b_x__b___31m.md"]
    assert set(written) == {r.student for r in reports}
    ann = written["ann"].read_text()
    assert ann.startswith("# Feedback for `ann`\n\nGraded by minigrpo " + __version__ + ": 5.5 of 6 points.\n")
    assert f"| {EXERCISE.id} | 5.5 | 6 |" in ann
    counted, other = ann.index("Notebook: `02_mine.ipynb`\n"), ann.index("Notebook: `02_old.ipynb` (not counted)")
    assert counted < other  # the notebook that counts comes first
    assert check_text(records["grpo_wrong"]) in ann and f"  did not run: {NOT_FOUND}" in ann
    assert "2 notebooks of exercise 04_group_relative_advantages" in ann  # which one counted, and why
    ben = written["ben"].read_text()
    assert "## 04_group_relative_advantages: 0/6 points" in ben
    assert "This notebook was not graded in full (unreadable):\n```text\nnot a notebook: Expecting" in ben


def test_what_a_learner_named_is_escaped_inside_markdown_code(reports, tmp_path):
    odd = write_feedback(reports, tmp_path)["c`<b>x</b>\x1b[31m"].read_text()
    assert "\x1b" not in odd and odd.startswith("# Feedback for ``c`<b>x</b>\\x1b[31m``\n")
    assert "````text\na note with ``` inside\n````" in odd  # a fence longer than the backticks inside
    assert code_span("`a`") == "`` `a` ``" and code_block(["x"]) == ["```text", "x", "```"]


def test_feedback_file_names_are_plain_and_never_collide():
    taken = set()
    names = [feedback_file_name(s, taken) for s in ["a b", "a_b", "A_B", "../x", ".hidden", "é"]]
    assert names == ["a_b.md", "a_b-2.md", "A_B-3.md", "_x.md", "hidden.md", "_.md"]


# --- every output, whole or not at all --------------------------------------------------------------------------
def test_an_output_stopped_while_it_is_written_leaves_the_file_it_replaces(reports, tmp_path, monkeypatch):
    """Ctrl-C while the gradebook's second row is made, and a text that cannot be written at all: each time the path
    holds the gradebook it held before, and nothing else is left in its folder."""
    from minigrpo.grading.reports import gradebook

    path = tmp_path / "grades.csv"
    path.write_text("the last gradebook\n")
    printable = gradebook.printable

    def interrupted(text: str) -> str:
        if text == "ben":
            raise KeyboardInterrupt
        return printable(text)

    monkeypatch.setattr(gradebook, "printable", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gradebook.write_gradebook(reports, path)
    assert path.read_text() == "the last gradebook\n" and os.listdir(tmp_path) == ["grades.csv"]
    with pytest.raises(UnicodeEncodeError):
        write_text(path, "a lone surrogate, \udce9, fails as it is written")
    assert path.read_text() == "the last gradebook\n" and os.listdir(tmp_path) == ["grades.csv"]


# --- Gradescope's results.json -------------------------------------------------------------------------------
def test_results_follow_gradescopes_schema_one_test_per_check_the_best_notebook_counting(reports):
    result = results(reports[:2], ["04", "06"], seconds=12.4)
    jsonschema.validate(result, SCHEMA)
    assert [(t["name"], t["score"], t["max_score"], t["status"]) for t in result["tests"]] == [
        ("04 check_group_relative_advantages", 3.5, 4.0, "failed"),
        ("04 check_rloo_advantages", 2.0, 2.0, "passed"),
        ("06 check_kl_k3", 0.0, 3.0, "failed"),  # asked for, not handed in: 0 of its maximum
    ]
    assert result["score"] == 5.5 and result["execution_time"] == 12
    assert result["tests"][0]["output"] == check_text(reports[0].checks[0])
    assert "no notebook of exercise 06_kl_k3_estimator was found" in result["tests"][2]["output"]
    lines = result["output"].splitlines()
    assert lines[0] == f"minigrpo {__version__} graded 2 notebook(s): 5.5/9 points."
    assert "02_old.ipynb: not counted (exercise 04_group_relative_advantages, another notebook of it counts)" in lines


def test_results_without_exercises_cover_those_handed_in_and_an_empty_submission_scores_zero(reports):
    assert [t["name"][:2] for t in results(reports[:1])["tests"]] == ["04", "04"]
    empty = results([], ["04_group_relative_advantages"])
    jsonschema.validate(empty, SCHEMA)
    assert empty["score"] == 0 and [t["max_score"] for t in empty["tests"]] == [4.0, 2.0]
    assert results([])["tests"] == [] and results([])["score"] == 0


def test_an_interrupted_grading_says_so_and_scores_what_it_graded(reports):
    """Gradescope's time limit stopped the grading of ann's second notebook: her first counts, and the exercise of
    which no notebook was graded scores 0, saying why, never that it was not handed in."""
    stopped = [Submission(Path("/autograder/submission/05_kl.ipynb"), "ann")]
    result = results(reports[:1], ["04", "06"], seconds=600, not_graded=stopped)
    jsonschema.validate(result, SCHEMA)
    assert result["score"] == 5.5 and [t["score"] for t in result["tests"]] == [3.5, 2.0, 0.0]
    lines = result["output"].splitlines()
    assert lines[1] == (
        "grading was interrupted before 05_kl.ipynb was graded: it scores 0 here, and this score counts only the "
        "notebooks graded before it"
    )
    assert "grading was interrupted before 05_kl.ipynb was graded" in result["tests"][2]["output"]
    assert "hand in" not in json.dumps(result)


def test_the_schema_refuses_what_gradescope_does_not_read():
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tests": [{"name": "x", "max_score": 1}]}, SCHEMA)  # no score anywhere
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"score": 1, "tests": [{"score": 1, "maxscore": 1}]}, SCHEMA)  # a misspelled field


def test_exercises_are_named_by_id_or_number_and_an_unknown_one_is_a_clear_error():
    assert exercise_ids(["06", "04_group_relative_advantages", "04"]) == [
        "04_group_relative_advantages",
        "06_kl_k3_estimator",
    ]
    with pytest.raises(ValueError, match=r"--exercise '99' is no exercise: give an id or its number \(01_"):
        exercise_ids(["99"])


def test_exercise_without_gradescope_or_an_unknown_one_is_refused_before_grading(capsys, tmp_path):
    assert main(["grade", "nowhere", "--exercise", "04"]) == 2
    assert "give --gradescope FILE too" in capsys.readouterr().err
    assert main(["grade", str(tmp_path), "--gradescope", str(tmp_path / "r.json"), "--exercise", "99"]) == 2
    assert "error: --exercise '99' is no exercise" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


# --- the autograder zip --------------------------------------------------------------------------------------
@pytest.fixture()
def wheel(tmp_path):
    path = tmp_path / f"minigrpo-{__version__}-py3-none-any.whl"
    path.write_bytes(b"a wheel's bytes")
    return path


def test_an_autograder_made_for_a_renumbered_exercise_says_how_to_move_a_running_course(wheel, tmp_path, capsys):
    assert autograder_command("08_one_grpo_step", str(wheel), str(tmp_path / "ag.zip")) == 0  # a former id
    printed = " ".join(capsys.readouterr().out.split())
    assert "for exercise 10_one_grpo_step (9 points)" in printed
    assert "Exercise 10_one_grpo_step was 08_one_grpo_step before minigrpo 0.3.0" in printed
    assert "upload this zip to the assignment of 08_one_grpo_step" in printed


def test_the_autograder_zip_holds_executable_scripts_and_this_versions_wheel_at_its_root(wheel, tmp_path):
    out = write_autograder("04", wheel, tmp_path / "ag.zip")
    with zipfile.ZipFile(out) as archive:
        assert sorted(archive.namelist()) == sorted(["setup.sh", "run_autograder", wheel.name])
        for name in ("setup.sh", "run_autograder"):
            assert stat.S_IMODE(archive.getinfo(name).external_attr >> 16) == 0o755
        setup = archive.read("setup.sh").decode()
        run = archive.read("run_autograder").decode()
    torch_version = torch.__version__.split("+")[0]
    assert (
        f'pip install --no-cache-dir "torch=={torch_version}" --index-url https://download.pytorch.org/whl/cpu' in setup
    )
    assert f'pip install --no-cache-dir "/autograder/source/{wheel.name}[grade]"' in setup
    assert (
        '"$PYTHON" -m minigrpo grade "$AUTOGRADER/submission" --exercise 04_group_relative_advantages '
        '--gradescope "$RESULTS"' in run
    )


def test_a_wheel_of_another_version_or_none_is_refused(tmp_path):
    other = tmp_path / "minigrpo-0.0.1-py3-none-any.whl"
    other.write_bytes(b"")
    with pytest.raises(ValueError, match=f"is not a wheel of minigrpo {__version__}"):
        write_autograder("04", other, tmp_path / "ag.zip")
    with pytest.raises(FileNotFoundError, match="pip wheel --no-deps -w dist ."):
        write_autograder("04", tmp_path / "missing.whl", tmp_path / "ag.zip")
    assert not (tmp_path / "ag.zip").exists()


def test_run_autograder_gives_gradescope_a_score_and_a_reason_when_grading_cannot_run(wheel, tmp_path):
    root = tmp_path / "autograder"
    with zipfile.ZipFile(write_autograder("04", wheel, tmp_path / "ag.zip")) as archive:
        archive.extractall(root / "source")
    (root / "submission").mkdir()
    env = {**os.environ, "MINIGRPO_AUTOGRADER_DIR": str(root), "MINIGRPO_PYTHON": "false"}  # `false`: exits 1

    def run_autograder() -> dict:
        subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, check=True, timeout=30)
        written = json.loads((root / "results" / "results.json").read_text())
        jsonschema.validate(written, SCHEMA)
        return written

    assert run_autograder() == {
        "score": 0.0,
        "output": "no .ipynb notebook was found in your submission: submit 04_group_relative_advantages.ipynb",
    }
    (root / "submission" / "mine.ipynb").write_text("{}")
    assert run_autograder() == {
        "score": 0.0,
        "output": "minigrpo could not grade this submission (exit code 1): tell your instructor.",
    }

"""Gradescope: its results.json for one submission, and the autograder zip that writes it.

results.json
------------
`python -m minigrpo grade SUBMISSION --gradescope results.json [--exercise ID ...]` writes what Gradescope's autograder
specification asks for (https://gradescope-autograders.readthedocs.io/en/latest/specs/)::

    {"score": 4.0, "execution_time": 21, "output": "minigrpo 0.3.0 graded 1 notebook: 4/6 points ...",
     "tests": [{"name": "02 check_group_relative_advantages", "score": 4.0, "max_score": 4.0, "status": "passed",
                "output": "check_group_relative_advantages: 4/4 points\\n  PASS ..."}, ...]}

One test per check of each exercise, its output the text the notebook's check cell prints (`feedback.check_text`).
A Gradescope submission is one student's, so every notebook under SUBMISSION is theirs, whatever its folder; of
several notebooks of one exercise the best counts (`gradebook.SEVERAL_RULE`). `--exercise` names the exercises the
assignment asks for: one not handed in scores 0 of its maximum (its checks are listed, each at 0), and a notebook of
another exercise does not count. Without it, the exercises handed in are the assignment. A grading that SIGTERM
stops (Gradescope's time limit) still writes results.json: it says which notebooks were not graded, scores those
graded before, and an exercise none of whose notebooks was graded scores 0 as not graded, not as not handed in.

The autograder
--------------
`python -m minigrpo autograder EXERCISE --wheel WHEEL --out autograder.zip` writes the zip Gradescope asks for:
`setup.sh` (run once, as root, on Gradescope's Ubuntu image: Python in a virtual environment, the CPU build of the
torch this grader runs on, and minigrpo from WHEEL, the wheel of this very version) and `run_autograder` (run for each
submission: `grade /autograder/submission --exercise EXERCISE --gradescope /autograder/results/results.json`). Two
variables let it run anywhere else, for a dry run: MINIGRPO_AUTOGRADER_DIR (for /autograder) and MINIGRPO_PYTHON (for
the virtual environment's python).
"""

from __future__ import annotations

import dataclasses
import json
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

from minigrpo import __version__
from minigrpo.grading.exercises import EXERCISES, renamed
from minigrpo.grading.framework import format_points, max_points
from minigrpo.grading.reports.feedback import check_text
from minigrpo.grading.reports.files import write_text
from minigrpo.grading.reports.gradebook import class_grades
from minigrpo.grading.runner import NotebookReport, Submission
from minigrpo.grading.sandbox.limits import printable

SUBMISSION = "submission"
"""The one student of a Gradescope submission: every notebook in it is theirs."""


def exercise_ids(names: Sequence[str]) -> list[str]:
    """Exercise ids from ids or numbers ('04' -> '04_group_relative_advantages'), in the course's order; an id from
    before the renumbering names its exercise ('02_group_relative_advantages' -> '04_group_relative_advantages')."""
    ids = []
    for name in names:
        found = EXERCISES.get(name) or renamed(name) or next((e for e in EXERCISES.values() if e.number == name), None)
        if found is None:
            known = ", ".join(sorted(EXERCISES))
            raise ValueError(f"--exercise {name!r} is no exercise: give an id or its number ({known}).")
        ids.append(found.id)
    return sorted(set(ids))


def unscored_tests(exercise: str, why: str) -> list[dict]:
    """The tests of an exercise no notebook of which was graded: each check at 0 of its maximum, and why."""
    return [
        gradescope_test(exercise, {"check": name, "points": 0.0, "max_points": max_points(name), "not_run": why})
        for name in EXERCISES[exercise].checks
    ]


def interrupted_line(not_graded: Sequence[Submission]) -> str:
    """'grading was interrupted before 02_x.ipynb was graded' (a signal stopped it: Gradescope's time limit, say)."""
    names = ", ".join(Path(submission.path).name for submission in not_graded)
    return f"grading was interrupted before {names} {'was' if len(not_graded) == 1 else 'were'} graded"


def gradescope_test(exercise: str, check: dict) -> dict:
    """One check of one exercise as a Gradescope test: its points and the text its check cell prints."""
    score, most = float(check["points"]), float(check["max_points"])
    return {
        "name": f"{EXERCISES[exercise].number} {check['check']}",
        "score": score,
        "max_score": most,
        "status": "passed" if score >= most else "failed",
        "output": "\n".join(printable(line) for line in check_text(check).splitlines()),
    }


def results(
    reports: Sequence[NotebookReport],
    exercises: Sequence[str] = (),
    seconds: float = 0.0,
    not_graded: Sequence[Submission] = (),
) -> dict:
    """results.json for one submission: its `reports` (every notebook graded), over the assignment's `exercises`
    (ids or numbers; empty: those handed in). `seconds`: how long grading took. not_graded: the notebooks a signal
    (Gradescope's time limit, say) stopped grading before they were graded: the output says so first, and the score
    counts the notebooks graded before it; an exercise none of whose notebooks was graded scores 0, saying why."""
    mine = [dataclasses.replace(r, student=SUBMISSION) for r in reports]
    stopped = interrupted_line(not_graded) if not_graded else ""
    grades = class_grades(mine)
    grade = grades.students[0] if grades.students else None
    assignment = exercise_ids(exercises) or grades.exercises
    tests, summary = [], []
    for exercise in assignment:
        report = grade.exercises.get(exercise) if grade else None
        if report is None:  # none handed in, or none graded before a signal stopped grading
            if not_graded:
                why, said = f"no notebook of exercise {exercise} was graded: {stopped}", "not graded"
            else:
                why = f"no notebook of exercise {exercise} was found in the submission: hand in {exercise}.ipynb"
                said = "not handed in"
            tests += unscored_tests(exercise, why)
            summary.append(f"{exercise}: 0/{format_points(EXERCISES[exercise].max_points)} points ({said})")
            continue
        tests += [gradescope_test(exercise, check) for check in report.checks]
        line = f"{exercise}: {format_points(report.points)}/{format_points(report.max_points)} points"
        line += f", from {Path(report.path).name}" + ("" if report.status == "ok" else f" ({report.status})")
        summary.append(line + "".join(f"\n  {error}" for error in report.errors))
    counted = [grade.exercises[e] for e in assignment if grade and e in grade.exercises]
    for report in mine:
        if all(report is not c for c in counted):
            why = "not an exercise's notebook" if report.exercise is None else f"exercise {report.exercise}"
            why += "" if report.exercise not in assignment else ", another notebook of it counts"
            summary.append(f"{Path(report.path).name}: not counted ({why})")
    summary += [f"note: {note}" for r in counted for note in r.notes]
    score = sum(t["score"] for t in tests)
    most = sum(t["max_score"] for t in tests)
    head = (
        f"minigrpo {__version__} graded {len(mine)} notebook(s): {format_points(score)}/{format_points(most)} points."
    )
    if not_graded:
        they = ("it scores", "it") if len(not_graded) == 1 else ("they score", "them")
        summary.insert(
            0, f"{stopped}: {they[0]} 0 here, and this score counts only the notebooks graded before {they[1]}"
        )
    output = "\n".join([head, *summary])
    return {
        "score": score,
        "execution_time": round(seconds),
        "output": "\n".join(printable(line) for line in output.splitlines()),
        "tests": tests,
    }


def write_results(
    reports: Sequence[NotebookReport],
    path: str | Path,
    exercises: Sequence[str] = (),
    seconds: float = 0.0,
    not_graded: Sequence[Submission] = (),
) -> None:
    """results.json (`results`) to `path`, whole or not at all (`files.write_text`), its folder made if missing."""
    write_text(path, json.dumps(results(reports, exercises, seconds, not_graded), indent=1) + "\n")


# --- the autograder zip -----------------------------------------------------------------------------------
VENV = "/opt/minigrpo"
"""Where setup.sh makes the virtual environment the autograder grades in."""
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): Python, then the CPU build of
# torch {torch}, then minigrpo {version} from the wheel beside this script, with the grader's extra.
set -euo pipefail
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv
python3 -m venv {venv}  # a virtual environment: recent Ubuntus refuse pip installs into the system's Python
{venv}/bin/pip install --no-cache-dir "torch=={torch}" --index-url {index}
{venv}/bin/pip install --no-cache-dir "/autograder/source/{wheel}[grade]"
{venv}/bin/python -m minigrpo grade --help > /dev/null  # fails the build here, not at the first submission
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: the student's files are in /autograder/submission, and what it writes
# to /autograder/results/results.json is what the student sees.
# Exercise {exercise}, graded by minigrpo {version}.
# For a dry run elsewhere: MINIGRPO_AUTOGRADER_DIR=folder (with submission/ in it) MINIGRPO_PYTHON=python.
set -u
AUTOGRADER="${{MINIGRPO_AUTOGRADER_DIR:-/autograder}}"
PYTHON="${{MINIGRPO_PYTHON:-{venv}/bin/python}}"
RESULTS="$AUTOGRADER/results/results.json"
mkdir -p "$AUTOGRADER/results"
rm -f "$RESULTS"
"$PYTHON" -m minigrpo grade "$AUTOGRADER/submission" --exercise {exercise} --gradescope "$RESULTS"
status=$?
if [ ! -s "$RESULTS" ]; then  # grading could not run: Gradescope still gets a score, and the student a reason
  if [ -z "$(find "$AUTOGRADER/submission" -name '*.ipynb' -print -quit)" ]; then
    reason="no .ipynb notebook was found in your submission: submit {exercise}.ipynb"
  else
    reason="minigrpo could not grade this submission (exit code $status): tell your instructor."
  fi
  printf '{{"score": 0.0, "output": "%s"}}\\n' "$reason" > "$RESULTS"
fi
"""


def autograder_files(exercise: str, wheel: str, torch_version: str) -> dict[str, str]:
    """setup.sh and run_autograder for `exercise` (an id): they install `wheel` (a file name) and torch
    `torch_version`."""
    values = {"exercise": exercise, "version": __version__, "venv": VENV, "wheel": wheel}
    values |= {"torch": torch_version, "index": TORCH_CPU_INDEX}
    return {"setup.sh": SETUP_SH.format(**values), "run_autograder": RUN_AUTOGRADER.format(**values)}


def check_wheel(wheel: Path) -> None:
    """The wheel must be this very version of minigrpo: the autograder grades as this grader does."""
    if not wheel.is_file():
        raise FileNotFoundError(
            f"{printable(str(wheel))} is no file: build the wheel with `pip wheel --no-deps -w dist .` in the checkout."
        )
    found = re.fullmatch(r"minigrpo-([^-]+)-.+\.whl", wheel.name)
    if found is None or found.group(1) != __version__:
        raise ValueError(
            f"{printable(wheel.name)} is not a wheel of minigrpo {__version__}, the version grading here: build it "
            "from the checkout that made the handout (`pip wheel --no-deps -w dist .`)."
        )


def write_autograder(exercise: str, wheel: str | Path, out: str | Path, torch_version: str | None = None) -> Path:
    """The autograder zip for `exercise` (an id or its number): setup.sh, run_autograder (both executable) and the
    wheel, at the zip's root as Gradescope requires. torch_version: None for the torch running here (its CPU build)."""
    import torch

    (exercise,) = exercise_ids([exercise])
    wheel = Path(wheel)
    check_wheel(wheel)
    torch_version = torch_version or torch.__version__.split("+")[0]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in autograder_files(exercise, wheel.name, torch_version).items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100755 << 16) | 0  # a regular file, executable: Gradescope runs it as it is
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, text)
        archive.write(wheel, wheel.name)
    return out


def autograder_command(exercise: str, wheel: str, out: str) -> int:
    """`python -m minigrpo autograder EXERCISE --wheel WHEEL --out ZIP`: writes the zip and says what is in it."""
    path = write_autograder(exercise, wheel, out)
    (exercise,) = exercise_ids([exercise])
    limit = EXERCISES[exercise].time_limit
    print(
        f"wrote {path}: setup.sh, run_autograder and {Path(wheel).name} for exercise {exercise} "
        f"({format_points(EXERCISES[exercise].max_points)} points). On Gradescope: a programming assignment with that "
        f"many points, this zip as its autograder, and a timeout above {limit} s (the exercise's time limit) plus "
        "the kernel's start."
    )
    former = EXERCISES[exercise].formerly
    if former is not None:  # a course that handed out the exercise under its former number moves to this zip
        print(
            f"Exercise {exercise} was {former} before minigrpo 0.3.0: a notebook handed out under that id is graded "
            f"as {exercise}, with a note, when its checks are the same (else it is refused, and says why). Moving a "
            f"running course: upload this zip to the assignment of {former}, and set its points as above."
        )
    return 0

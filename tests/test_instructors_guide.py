"""docs/instructors.md works as written: every ```bash block of the guide runs, in order, in a copy of the repository
with a small class in nbgrader's layout, and writes what the guide says it writes.

The class is two students of exercise 04 (the cheapest exercise to judge): ann hands in a full solution, bob deleted
the RLOO check's cell. One class grading run (two notebooks at once), one wheel built offline with this environment's
setuptools, and one dry run of the Gradescope autograder on ann's notebook.
"""

import ast
import csv
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest
from test_grading_class import CHECK_GRPO, CHECK_RLOO, EXERCISE, GRPO, IMPORTS, RLOO, notebook

from minigrpo import __version__
from minigrpo.grading.exercises import EXERCISES
from minigrpo.grading.runner import NOT_FOUND

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "instructors.md"
SCHEMA = json.loads((ROOT / "tests" / "data" / "gradescope_results.schema.json").read_text())
CLONE = ("pyproject.toml", "README.md", "minigrpo", "exercises")  # what the guide's commands read in a clone


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def ran(tmp_path_factory, copy_from_checkout):
    """(the clone the guide's commands ran in, each block's stdout)."""
    home = tmp_path_factory.mktemp("guide")
    clone = home / "minigrpo"
    clone.mkdir()
    copy_from_checkout(CLONE, clone)
    stamp = EXERCISE.stamp(__version__)
    for student, cells in [
        ("ann", [IMPORTS, GRPO, CHECK_GRPO, RLOO, CHECK_RLOO]),
        ("bob", [IMPORTS, GRPO, CHECK_GRPO]),
    ]:
        path = clone / "submitted" / student / "ps1" / f"{EXERCISE.id}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(notebook(*cells, stamp=stamp), path)
    (home / "bin").mkdir()
    # The guide says `python`: this environment's. A script that runs it, not a symlink to it: Python finds its
    # virtual environment next to the path it was started by, and a symlink elsewhere starts the base interpreter.
    python = home / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env |= {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # offline
    outputs = []
    for block in bash_blocks(GUIDE.read_text()):
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block], cwd=clone, env=env, capture_output=True, text=True, timeout=400
        )
        assert result.returncode == 0, f"{block}\nexited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr}"
        outputs.append(result.stdout)
    return clone, outputs


def test_the_guide_has_the_blocks_this_test_expects():
    blocks = bash_blocks(GUIDE.read_text())
    assert len(blocks) == 4 and "--feedback feedback/" in blocks[1] and "run_autograder" in blocks[3]


def test_the_hand_out_commands_print_the_version_and_the_exercises_stamp(ran):
    _, outputs = ran
    version, stamp = outputs[0].splitlines()
    assert version == __version__ and ast.literal_eval(stamp) == EXERCISE.stamp(__version__)


def test_the_class_command_writes_the_gradebook_the_checks_and_a_feedback_file_per_student(ran):
    clone, outputs = ran
    with open(clone / "grades.csv", newline="") as f:
        assert [(r["student"], r[EXERCISE.id], r["max_points"]) for r in csv.DictReader(f)] == [
            ("ann", "6", "6"),
            ("bob", "4", "6"),
        ]
    with open(clone / "checks.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 4  # two notebooks, two checks each
    assert sorted(p.name for p in (clone / "feedback").iterdir()) == ["ann.md", "bob.md"]
    bob = (clone / "feedback" / "bob.md").read_text()
    assert "Graded by minigrpo " + __version__ + ": 4 of 6 points." in bob
    assert f"check_rloo_advantages: 0/2 points\n  did not run: {NOT_FOUND}" in bob
    assert "check_group_relative_advantages: 4/4 points\n  PASS  the worked example" in bob
    assert "gradebook (one row per student" in outputs[1]


def test_the_autograder_zip_and_its_dry_run_give_gradescope_a_valid_results_json(ran):
    clone, outputs = ran
    (wheel,) = (clone / "dist").glob("minigrpo-*.whl")
    assert wheel.name.startswith(f"minigrpo-{__version__}-")
    with zipfile.ZipFile(clone / "autograder_04.zip") as archive:
        assert sorted(archive.namelist()) == sorted(["run_autograder", "setup.sh", wheel.name])
    assert "timeout above 180 s" in outputs[2]  # exercise 04's time limit
    written = json.loads((clone / "dry-run" / "results" / "results.json").read_text())
    jsonschema.validate(written, SCHEMA)
    printed = outputs[3][outputs[3].index("\n{\n") :]  # the score table, then json.tool's print of results.json
    assert written["score"] == 6.0 and json.loads(printed) == written
    assert [(t["name"], t["score"], t["max_score"], t["status"]) for t in written["tests"]] == [
        ("04 check_group_relative_advantages", 4.0, 4.0, "passed"),
        ("04 check_rloo_advantages", 2.0, 2.0, "passed"),
    ]
    assert written["output"].splitlines()[1] == f"{EXERCISE.id}: 6/6 points, from {EXERCISE.id}.ipynb"


def test_the_guides_time_figures_follow_the_exercises_measured_solution_seconds():
    text = " ".join(GUIDE.read_text().split())
    seconds = {e.id: e.solution_seconds for e in EXERCISES.values()}
    capstone = seconds.pop("12_grpo_from_scratch")
    others = f"{min(seconds.values()):g} to {max(seconds.values()):g} s for the exercises other than the capstone"
    assert f"{others}, {capstone:g} s" in text
    minutes_02 = 40 * seconds[EXERCISE.id] / 2 / 60
    hours, minutes = divmod(round(40 * capstone / 2 / 60), 60)
    assert f"about {minutes_02:g} minutes for 40 notebooks of exercise 04 ({seconds[EXERCISE.id]:g} s)" in text
    assert f"{hours} h {minutes} min for 40 capstones ({capstone:g} s)" in text


def test_the_guides_table_of_former_numbers_is_the_exercises_own():
    rows = re.findall(r"^\| (\d\d) \| (\d\d) \| `(\w+)` \|$", GUIDE.read_text(), re.M)
    assert rows == sorted((e.formerly[:2], e.number, e.id) for e in EXERCISES.values() if e.formerly is not None)
    assert all(EXERCISES[id].formerly[:2] == former for former, _, id in rows)

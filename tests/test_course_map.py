"""The README's course map (scripts/course_map.py): made from the lessons, its totals the sums of its rows, and every
lesson's first line stating a reading time within 5 minutes of its words at 150 a minute."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("course_map", ROOT / "scripts" / "course_map.py")
course_map = importlib.util.module_from_spec(spec)
sys.modules["course_map"] = course_map  # its dataclass looks itself up there
spec.loader.exec_module(course_map)


def test_the_readme_map_and_every_lessons_reading_time_agree_with_the_lessons():
    assert course_map.problems() == [], "run python scripts/course_map.py --write, or fix the lesson's Time line"


def test_exercise_numbers_rise_along_the_course_map():
    reached = course_map.first_links(course_map.lessons())
    assert [name[:2] for name in reached] == [f"{k:02d}" for k in range(1, len(reached) + 1)]
    assert reached[-1] != course_map.CAPSTONE  # the capstone is numbered where 04b first links it, not last
    swapped = [course_map.Lesson("03_x.ipynb", 0, 0, "", ("02_b.ipynb", "01_a.ipynb"))]
    assert course_map.numbering_problems(swapped) == [
        "exercises/02_b.ipynb is exercise 1 in the order the lessons reach them: number it 01",
        "exercises/01_a.ipynb is exercise 2 in the order the lessons reach them: number it 02",
    ]


def test_a_stated_reading_time_is_the_words_at_150_a_minute_within_5_minutes(tmp_path):
    lesson = course_map.Lesson("x.ipynb", 3208, 20, "", ())
    assert lesson.counted_minutes == pytest.approx(21.387, abs=1e-3)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "README.md").write_text("no map")  # problems()'s last line, whatever the lesson
    time_line = "**Time:** about 20 minutes to read; it runs in about 5 seconds on two CPU cores."
    cells = [{"cell_type": "markdown", "source": time_line}]
    for words, flagged in ((2251, False), (3749, False), (2249, True), (3751, True)):  # 15.007 .. 24.993 minutes
        cells_with_words = [*cells, {"cell_type": "markdown", "source": "word " * (words - len(time_line.split()))}]
        path = tmp_path / "notebooks" / "03_x.ipynb"
        path.write_text(json.dumps({"cells": cells_with_words}))
        assert course_map.read_lesson(path).words == words
        assert bool(course_map.problems(tmp_path)[:-1]) == flagged, words


def test_the_totals_are_the_sums_of_the_rows():
    course = [
        course_map.Lesson("00_a.ipynb", 1500, 10, "about 30 seconds on two CPU cores", ()),
        course_map.Lesson(
            "05_ppo_vs_grpo.ipynb", 3000, 20, "about 30 minutes on two CPU cores", ("13_gae_for_ppo.ipynb",)
        ),
        course_map.Lesson(
            "06_b.ipynb", 9000, 60, "about 2.5 minutes on two CPU cores", ("13_gae_for_ppo.ipynb", course_map.CAPSTONE)
        ),
    ]
    table = course_map.render(course, {"00_a.ipynb": "why?"})
    rows = table.splitlines()
    assert rows[2] == (
        "| [`00_a`](notebooks/00_a.ipynb) | why? | none | 10 min | 20 min | about 30 seconds on two CPU cores |"
    )
    assert rows[3].startswith("| [`05_ppo_vs_grpo`](notebooks/05_ppo_vs_grpo.ipynb) (optional) |  | [13](exercises/")
    totals, estimate = rows[-3], rows[-1]
    assert totals.startswith("Reading, every lesson: 1 h 30 min (1 h 10 min without the optional lesson 05)")
    assert "running every lesson's code: about 33 min (3 min without lesson 05) on two CPU cores" in totals
    assert "2 graded exercises" in totals
    # 2 x reading + 30 min per exercise, 3 h for the capstone, each counted at the first lesson that links it:
    # 00: 2 x 10 = 20; 05: 2 x 20 + 30 = 70 (13); 06: 2 x 60 + 180 = 300 (13 counted already, 12 the capstone)
    assert course_map.work_minutes(course) == {"00_a.ipynb": 20, "05_ppo_vs_grpo.ipynb": 70, "06_b.ipynb": 300}
    assert "| 1 h 10 min |" in rows[3] and "| 5 h 00 min |" in rows[4]
    assert "To work through the course: about 6 h 30 min (5 h 20 min without lesson 05), an estimate" in estimate
    assert "reading, not study" in estimate


def test_a_run_time_is_read_in_seconds_and_a_lesson_that_states_none_is_named(tmp_path):
    stated = {
        "its code runs in about a minute on two CPU cores": 60,
        "the code runs in about 6 seconds on two CPU cores": 6,
        "its code runs in about 2.5 minutes on two CPU cores with the tiny Qwen": 150,
        "the code runs in seconds on a CPU": None,  # no figure
        "about 20 seconds on a GPU": None,  # not the machine the map counts on
    }
    for runs, seconds in stated.items():
        assert course_map.Lesson("x.ipynb", 0, 0, runs, ()).run_seconds == seconds, runs
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "README.md").write_text("no map")
    lesson = {"cells": [{"cell_type": "markdown", "source": "**Time:** about 5 minutes to read; it runs in seconds."}]}
    (tmp_path / "notebooks" / "03_x.ipynb").write_text(json.dumps(lesson))
    named, _ = course_map.problems(tmp_path)
    assert named == (
        "notebooks/03_x.ipynb: its Time line states no run time ('... runs in about N seconds on two CPU cores')"
    )


def test_a_lesson_whose_time_line_disagrees_is_named(tmp_path):
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks", ignore=shutil.ignore_patterns("runs", ".*"))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    path = tmp_path / "notebooks" / "03_group_relative_advantages.ipynb"
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"][:3]:
        cell["source"] = "".join(cell["source"]).replace("about 10 minutes to read", "about 25 minutes to read")
    path.write_text(json.dumps(notebook))
    lesson, readme = course_map.problems(tmp_path)
    assert lesson.startswith("notebooks/03_group_relative_advantages.ipynb: its Time line says 25 minutes to read")
    assert readme.startswith("README.md's course map is out of date")  # the map shows what the lessons state

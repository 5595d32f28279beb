"""The README's course map, made from the lessons themselves: lesson, graded exercises, reading time, run time.

Each row's question is README.md's own (edit it there: --write keeps it); the other columns come from the lessons.

    python scripts/course_map.py            # print the map (Markdown)
    python scripts/course_map.py --write    # put it into README.md, between the map's two marker lines
    python scripts/course_map.py --check    # exit 1 when README.md or a lesson's first line disagrees (tests)

Reading time is what each lesson's **Time:** line states, which must be its words, prose and code, at 150 a minute,
within 5 minutes (a time in steps of 5 minutes, give or take a step, so that an edit of a few words changes no line;
code is read more slowly than prose and is counted as words). The graded exercises are those its "## Practice: graded
exercises" section links. The run time is what the lesson's **Time:** line says of its code, quoted: "about N seconds"
or "about N minutes" (or "about a minute") on two CPU cores, the wall time of running the whole lesson from a fresh
kernel in its full mode (what a learner runs: MINIGRPO_QUICK unset), measured with nbclient on a quiet two-core
machine. The map's last line sums them.

The reading time is reading, not study. The "to work through" column is an estimate, labelled as one: no learner
was timed. It assumes STUDY_FACTOR times the reading (running the cells, working the maths with pen and paper, the
lesson's ungraded questions), EXERCISE_MINUTES per graded exercise and CAPSTONE_MINUTES for the capstone, each
exercise counted once, at the first lesson that links it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
WORDS_PER_MINUTE = 150
BEGIN, END = "<!-- course map: scripts/course_map.py --write -->", "<!-- end of the course map -->"
PRACTICE = "## Practice: graded exercises"
OPTIONAL = {"05_ppo_vs_grpo.ipynb"}  # a detour the course reads correctly without
# The work-through estimate's assumptions (not measurements; the map says so beside the figures)
STUDY_FACTOR = 2  # study time per minute of reading: running the cells, the maths by hand, the questions
EXERCISE_MINUTES = 30  # one graded exercise: a function or two, its checks, its hints
CAPSTONE = "12_grpo_from_scratch.ipynb"
CAPSTONE_MINUTES = 180  # every stage from scratch, then a training run graded on learning
TIME_LINE = re.compile(r"\*\*Time:\*\* about (\d+) minutes to read(.*?)(?:\n\n|$)", re.S)
RUN_TIME = re.compile(r"\babout (a|\d+(?:\.\d+)?) (second|minute)s? on two CPU cores")


@dataclass(frozen=True)
class Lesson:
    name: str  # the notebook's file name
    words: int
    stated_minutes: int  # what its **Time:** line says
    runs: str  # what its **Time:** line says of its code
    exercises: tuple[str, ...]  # exercise file names, as its Practice section links them

    @property
    def counted_minutes(self) -> float:
        """The words at WORDS_PER_MINUTE."""
        return self.words / WORDS_PER_MINUTE

    @property
    def run_seconds(self) -> float | None:
        """The run time its Time line states ("about 20 seconds on two CPU cores"), or None where it states none."""
        found = RUN_TIME.search(self.runs)
        if found is None:
            return None
        amount = 1.0 if found.group(1) == "a" else float(found.group(1))
        return amount * (60 if found.group(2) == "minute" else 1)


def read_lesson(path: Path) -> Lesson:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = ["".join(cell["source"]) for cell in cells]
    words = sum(len(source.split()) for source in text)
    time_line = next((m for source in text[:3] if (m := TIME_LINE.search(source))), None)
    if time_line is None:
        raise ValueError(f"{path.name}: no '**Time:** about N minutes to read; ...' line in its first cells")
    runs = re.sub(r"\s+", " ", time_line.group(2)).partition("; ")[2]  # what follows the reading time
    practice = text[-1].split(PRACTICE, 1)[1] if PRACTICE in text[-1] else ""
    exercises = tuple(re.findall(r"\]\(\.\./exercises/([^)]+\.ipynb)\)", practice))
    return Lesson(path.name, words, int(time_line.group(1)), runs.split(". ")[0].rstrip("."), exercises)


def lessons(root: Path = ROOT) -> list[Lesson]:
    return [read_lesson(path) for path in sorted((root / "notebooks").glob("*.ipynb"))]


def work_minutes(course: list[Lesson]) -> dict[str, int]:
    """{lesson name: the estimated minutes to work through it}: STUDY_FACTOR x its reading time, plus each graded
    exercise it is the first lesson to link (EXERCISE_MINUTES, CAPSTONE_MINUTES for the capstone)."""
    seen, minutes = set(), {}
    for lesson in course:
        first_links = [name for name in lesson.exercises if name not in seen]
        seen.update(first_links)
        exercises = sum(CAPSTONE_MINUTES if name == CAPSTONE else EXERCISE_MINUTES for name in first_links)
        minutes[lesson.name] = STUDY_FACTOR * lesson.stated_minutes + exercises
    return minutes


def hours(minutes: int) -> str:
    """95 -> '1 h 35 min'; 40 -> '40 min'."""
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def exercise_link(name: str) -> str:
    return f"[{name.split('_')[0]}](exercises/{name})"


def readme_questions(readme: str) -> dict[str, str]:
    """{lesson file name: its question}, from the map in README.md (empty where there is none)."""
    rows = readme.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in readme else ""
    found = re.findall(r"^\| \[`[^`]+`\]\(notebooks/([^)]+)\)[^|]* \| (.*?) \| ", rows, re.M)
    return dict(found)


def render(course: list[Lesson], questions: dict[str, str]) -> str:
    """The map as Markdown: one row a lesson, then the totals (the sums of the rows)."""
    rows = [
        "| lesson | question | graded exercises | reading | to work through (estimate) | its code |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    work = work_minutes(course)
    for lesson in course:
        title = f"[`{lesson.name.removesuffix('.ipynb')}`](notebooks/{lesson.name})"
        if lesson.name in OPTIONAL:
            title += " (optional)"
        exercises = ", ".join(map(exercise_link, lesson.exercises)) or "none"
        question = questions.get(lesson.name, "")
        rows.append(
            f"| {title} | {question} | {exercises} | {lesson.stated_minutes} min | {hours(work[lesson.name])} | "
            f"{lesson.runs} |"
        )
    total = sum(lesson.stated_minutes for lesson in course)
    optional = sum(lesson.stated_minutes for lesson in course if lesson.name in OPTIONAL)
    work_total = sum(work.values())
    work_optional = sum(minutes for name, minutes in work.items() if name in OPTIONAL)
    linked = sorted({name for lesson in course for name in lesson.exercises})
    run_minutes = sum(lesson.run_seconds or 0 for lesson in course) / 60
    optional_run_minutes = sum(lesson.run_seconds or 0 for lesson in course if lesson.name in OPTIONAL) / 60
    rows.append("")
    rows.append(
        f"Reading, every lesson: {hours(total)} ({hours(total - optional)} without the optional lesson 05), at "
        f"{WORDS_PER_MINUTE} words a minute, code included; running every lesson's code: about {run_minutes:.0f} min "
        f"({run_minutes - optional_run_minutes:.0f} min without lesson 05) on two CPU cores; {len(linked)} graded "
        "exercises, each linked from the lesson it practises."
    )
    rows.append("")
    rows.append(
        f"Reading times count the words, prose and code, at {WORDS_PER_MINUTE} a minute: reading, not study. To work "
        f"through the course: about {hours(work_total)} ({hours(work_total - work_optional)} without lesson 05), an "
        f"estimate, not a measurement: {STUDY_FACTOR}x the reading time for study (running the cells, the maths by "
        f"hand, the questions), {EXERCISE_MINUTES} min per graded exercise and {hours(CAPSTONE_MINUTES)} for the "
        "capstone, each exercise counted at the first lesson that links it."
    )
    return "\n".join(rows)


def first_links(course: list[Lesson]) -> list[str]:
    """The exercises in the order the course reaches them: each at the first lesson that links it."""
    order: list[str] = []
    for lesson in course:
        order += [name for name in lesson.exercises if name not in order]
    return order


def numbering_problems(course: list[Lesson]) -> list[str]:
    """Exercise numbers follow the course: the k-th exercise the lessons reach is numbered k (01, 02, ...)."""
    return [
        f"exercises/{name} is exercise {k} in the order the lessons reach them: number it {k:02d}"
        for k, name in enumerate(first_links(course), start=1)
        if not name.startswith(f"{k:02d}_")
    ]


def problems(root: Path = ROOT) -> list[str]:
    """What disagrees: a lesson whose Time line is more than 5 minutes from its words' count or states no run time, an
    exercise numbered out of the course's order, a README whose map is not render()'s."""
    course = lessons(root)
    found = numbering_problems(course)
    found += [
        f"notebooks/{lesson.name}: its Time line says {lesson.stated_minutes} minutes to read; its "
        f"{lesson.words} words make {lesson.counted_minutes:.0f}"
        for lesson in course
        if abs(lesson.stated_minutes - lesson.counted_minutes) > 5
    ]
    found += [
        f"notebooks/{lesson.name}: its Time line states no run time ('... runs in about N seconds on two CPU cores')"
        for lesson in course
        if lesson.run_seconds is None
    ]
    readme = (root / "README.md").read_text(encoding="utf-8")
    if BEGIN not in readme or END not in readme:
        found.append(f"README.md has no course map between {BEGIN!r} and {END!r}")
    elif readme.split(BEGIN, 1)[1].split(END, 1)[0].strip() != render(course, readme_questions(readme)):
        found.append("README.md's course map is out of date: run python scripts/course_map.py --write")
    return found


def write_readme(root: Path = ROOT) -> None:
    path = root / "README.md"
    readme = path.read_text(encoding="utf-8")
    before, rest = readme.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    table = render(lessons(root), readme_questions(readme))
    path.write_text(f"{before}{BEGIN}\n{table}\n{END}{after}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="put the map into README.md")
    action.add_argument("--check", action="store_true", help="exit 1 when README.md or a lesson disagrees")
    args = parser.parse_args(argv)
    if args.write:
        write_readme()
    elif args.check:
        found = problems()
        print("\n".join(found) or "the course map and every lesson's reading time agree", file=sys.stderr)
        return 1 if found else 0
    else:
        print(render(lessons(), readme_questions(README.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

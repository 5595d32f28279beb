"""A class's grades: `python -m minigrpo grade PATH [--json] [--csv FILE] [--checks-csv FILE] [--timeout S] [--jobs N]`.

Whose notebook is it
--------------------
`layouts.read_layout` reads each notebook's student from PATH and where the notebook lies (nbgrader's submitted/, one
student's folder of it, a folder per student, a flat folder; --student NAME names one student), and the command says
on stderr, in one line, which layout it read.

One score per student and exercise
----------------------------------
`class_grades` gives each student one score per exercise (`exercises.identify` says which exercise a notebook is).
A student who handed in several notebooks of one exercise gets the best of their scores (SEVERAL_RULE; a tie goes to
the first path in sorted order), and a note names every notebook and the one that counts. A notebook of no exercise
is graded (its checks are in the table and the per-check CSV) but stays out of the gradebook, with a note.

What the command writes
-----------------------
- stdout: a table of every check of every notebook (student, exercise, check, points, max), the total, what lost
  points and the notes, every line naming its student; then the gradebook (one row per student). With --json, all
  of it as JSON instead.
- stderr: a line as each notebook is graded ("12/41 graded: ...") and at least every 20 s while one runs.
- --csv FILE: the gradebook: one row per student (student, one column per exercise, total, max_points); an
  exercise the student did not hand in is an empty cell, counted as 0 in the total.
- --checks-csv FILE: one row per notebook and check (CHECK_COLUMNS), for the detail.
- --feedback DIR, --gradescope FILE: a Markdown file per student (`feedback`), Gradescope's results.json for one
  submission (`gradescope`); the CLI hands them to `grade_command` as `writers`.

Each file is written whole or not at all (`files.write_text`), its folder made if missing; the CLI checks every
output path before grading starts (`minigrpo.__main__.check_grade_outputs`). When SIGINT or SIGTERM stops grading,
each output is still written, for the notebooks graded, and says which were not (NOT_GRADED); the command exits with
128 + the signal's number.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from minigrpo.grading.exercises import EXERCISES
from minigrpo.grading.framework import format_points
from minigrpo.grading.reports.files import write_text
from minigrpo.grading.reports.layouts import read_layout
from minigrpo.grading.runner import (
    GradingError,
    GradingInterrupted,
    NotebookReport,
    Submission,
    grade_notebooks,
    say,
)
from minigrpo.grading.sandbox import bubblewrap
from minigrpo.grading.sandbox.limits import LIMITS, printable

SEVERAL_RULE = "best"
"""Which of a student's notebooks of one exercise counts: the one with the most points (ties: the first path)."""
NOT_GRADED = "not graded (interrupted)"
"""What the CSVs say of a notebook that SIGINT or SIGTERM stopped grading before it was graded: the status of its
row, and its student's total (the points of their other notebooks are not their grade)."""


# --- one score per student and exercise ------------------------------------------------------------------
@dataclass
class StudentGrade:
    """One student's row of the gradebook: the report that counts for each exercise they handed in."""

    student: str
    exercises: dict[str, NotebookReport] = field(default_factory=dict)  # exercise id -> the report that counts
    notes: list[str] = field(default_factory=list)  # which of several notebooks counted; notebooks of no exercise

    @property
    def points(self) -> float:
        return sum(report.points for report in self.exercises.values())

    def to_dict(self, exercises: Sequence[str]) -> dict:
        return {
            "student": self.student,
            "exercises": {e: self.exercises[e].points if e in self.exercises else None for e in exercises},
            "points": self.points,
            "max_points": sum(EXERCISES[e].max_points for e in exercises),
            "notes": self.notes,
        }


@dataclass
class ClassGrades:
    """The gradebook: the class's exercises (those any student handed in, in the course's order), and a row per
    student (sorted by name)."""

    exercises: list[str]
    students: list[StudentGrade]

    @property
    def max_points(self) -> float:
        return sum(EXERCISES[e].max_points for e in self.exercises)

    def counted(self, report: NotebookReport) -> bool:
        """Does this report count in its student's grade? (Not when another of their notebooks of it did.)"""
        grade = next((s for s in self.students if s.student == report.student), None)
        return grade is not None and grade.exercises.get(report.exercise) is report

    def outranked(self, report: NotebookReport) -> bool:
        """Is this one of a student's several notebooks of an exercise, not the one that counts (SEVERAL_RULE)?"""
        return report.exercise is not None and not self.counted(report)


def table_total(reports: Sequence[NotebookReport]) -> tuple[float, float]:
    """(points, maximum) of the score table's total: every notebook's once, but of a student's several notebooks of
    one exercise only the one that counts (a second copy adds neither its points nor its maximum)."""
    grades = class_grades(reports)
    kept = [report for report in reports if not grades.outranked(report)]
    return sum(r.points for r in kept), sum(r.max_points for r in kept)


def class_grades(reports: Sequence[NotebookReport]) -> ClassGrades:
    """One row per student, one score per exercise (SEVERAL_RULE for several notebooks of one exercise)."""
    by_student: dict[str, dict[str | None, list[NotebookReport]]] = {}
    for report in reports:
        by_student.setdefault(report.student, {}).setdefault(report.exercise, []).append(report)
    students = []
    for student in sorted(by_student):
        grade = StudentGrade(student)
        for exercise, handed_in in by_student[student].items():
            if exercise is None:
                grade.notes += [f"{r.path}: not an exercise's notebook, left out of the gradebook" for r in handed_in]
                continue
            best = max(sorted(handed_in, key=lambda r: r.path), key=lambda r: r.points)  # max keeps the first tie
            grade.exercises[exercise] = best
            if len(handed_in) > 1:
                scores = ", ".join(
                    f"{r.path} {format_points(r.points)}/{format_points(r.max_points)}"
                    for r in sorted(handed_in, key=lambda r: r.path)
                )
                grade.notes.append(
                    f"{len(handed_in)} notebooks of exercise {exercise} ({scores}): the {SEVERAL_RULE} counts, "
                    f"{best.path}"
                )
        students.append(grade)
    order = sorted(EXERCISES)  # the course's order: the ids start with the exercise's number
    handed = {e for s in students for e in s.exercises}
    return ClassGrades([e for e in order if e in handed], students)


# --- the printed report ---------------------------------------------------------------------------------------
def _exercise_label(report: NotebookReport) -> str:
    return report.exercise or f"({report.name})"  # a notebook of no exercise: its file's stem, in parentheses


def _table_labels(reports: Sequence[NotebookReport], grades: ClassGrades) -> list[str]:
    """Each report's exercise column: its exercise, and, for one of a student's several notebooks of an exercise,
    which notebook it is and whether it counts ('02_x (Copy of 02_x.ipynb, not counted)')."""
    handed_in = [(r.student, r.exercise) for r in reports]
    labels = []
    for report, key in zip(reports, handed_in, strict=True):
        label = _exercise_label(report)
        if report.exercise is not None and handed_in.count(key) > 1:
            label += f" ({Path(report.path).name}{', not counted' if grades.outranked(report) else ''})"
        labels.append(printable(label))
    return labels


def format_scores(reports: list[NotebookReport], not_graded: Sequence[Path] = ()) -> str:
    """The score table (student, exercise, check, points, max), the total, what lost points, the notes, the
    gradebook, and what was not graded. Every line about a notebook names its student; a student's several notebooks
    of one exercise are told apart by their file names, and the total adds only the one that counts (`table_total`).

    Every name and message a learner made is escaped (`limits.printable`): one line of text is one line of the table.
    """
    grades = class_grades(reports)
    students = [printable(r.student) for r in reports]
    labels = _table_labels(reports, grades)
    width = max([len("student")] + [len(n) for n in students])
    ex_width = max([len("exercise")] + [len(n) for n in labels])
    check_width = max([len("(no checks)")] + [len(c["check"]) for r in reports for c in r.checks])
    header = f"{'student':<{width}}  {'exercise':<{ex_width}}  {'check':<{check_width}}  {'points':>6}  {'max':>4}"
    lines = [header, "-" * len(header)]
    for student, label, report in zip(students, labels, reports, strict=True):
        for check in report.checks or [{"check": "(no checks)", "points": 0, "max_points": 0}]:
            lines.append(
                f"{student:<{width}}  {label:<{ex_width}}  {check['check']:<{check_width}}  "
                f"{format_points(check['points']):>6}  {format_points(check['max_points']):>4}"
            )
    lines.append("-" * len(header))
    total, most = table_total(reports)
    pad = f"{'':<{ex_width}}  {'':<{check_width}}"
    lines.append(f"{'total':<{width}}  {pad}  {format_points(total):>6}  {format_points(most):>4}")
    details, notes = [], []
    for student, report in zip(students, reports, strict=True):
        where = f"{student} / {printable(_exercise_label(report))} ({printable(Path(report.path).name)})"
        if report.status != "ok":
            details.append(f"{where}: {report.status}" + (f" ({report.errors[0]})" if report.errors else ""))
        for check in report.checks:
            if "not_run" in check:
                details.append(f"{where} / {check['check']}: did not run ({check['not_run']})")
            for case in check.get("cases", []):
                if not case["passed"]:
                    details.append(f"{where} / {check['check']} / {case['name']}: {case['message']}")
        notes += [f"{where}: {note}" for note in report.notes]
    if details:
        lines += ["", "what lost points:"] + [f"  {printable(d)}" for d in details]
    notes += [f"{grade.student}: {note}" for grade in grades.students for note in grade.notes]
    if notes:
        lines += ["", "notes:"] + [f"  {printable(n)}" for n in notes]
    if grades.exercises:
        lines += ["", "gradebook (one row per student; --csv writes it):", *format_gradebook(grades)]
    if not_graded:
        lines += ["", "not graded (grading was interrupted; no score recorded):"]
        lines += [f"  {printable(str(p))}" for p in not_graded]
    return "\n".join(lines)


def gradebook_rows(grades: ClassGrades, not_graded: Sequence[Submission] = ()) -> list[dict]:
    """One dict per student: student, one key per exercise (its points, "" when not handed in), total, max_points.

    not_graded: the notebooks an interrupt left ungraded; their students' total is NOT_GRADED, and a student none of
    whose notebooks was graded has a row too."""
    unfinished = {submission.student for submission in not_graded}
    students = grades.students + [StudentGrade(s) for s in unfinished - {g.student for g in grades.students}]
    rows = []
    for grade in sorted(students, key=lambda g: g.student):
        row = {"student": grade.student}
        for exercise in grades.exercises:
            report = grade.exercises.get(exercise)
            row[exercise] = "" if report is None else format_points(report.points)
        total = NOT_GRADED if grade.student in unfinished else format_points(grade.points)
        row |= {"total": total, "max_points": format_points(grades.max_points)}
        rows.append(row)
    return rows


def format_gradebook(grades: ClassGrades) -> list[str]:
    """The gradebook as aligned text lines: exercises by their number, '-' for one not handed in."""
    numbers = [EXERCISES[e].number for e in grades.exercises]
    rows = gradebook_rows(grades)
    width = max([len("student")] + [len(printable(r["student"])) for r in rows])
    header = f"  {'student':<{width}}  " + "  ".join(f"{n:>5}" for n in numbers) + f"  {'total':>6}  {'max':>5}"
    lines = [header]
    for row in rows:
        cells = "  ".join(f"{row[e] or '-':>5}" for e in grades.exercises)
        lines.append(f"  {printable(row['student']):<{width}}  {cells}  {row['total']:>6}  {row['max_points']:>5}")
    return lines


# --- CSV -----------------------------------------------------------------------------------------------------
CHECK_COLUMNS = (
    "student",
    "exercise",
    "path",
    "check",
    "points",
    "max_points",
    "status",
    "counted",
    "seconds",
    "lost_points",
)
"""The per-check CSV: counted is "yes" when the notebook is the one that counts in the student's gradebook row."""


def check_rows(reports: list[NotebookReport], not_graded: Sequence[Submission] = ()) -> list[dict]:
    """One row per notebook and check (CHECK_COLUMNS); lost_points says what failed (the cases' names and hints, or
    why the check did not run). A notebook with no checks gets one row, and so does each notebook an interrupt left
    ungraded (`not_graded`: its status NOT_GRADED)."""
    grades = class_grades(reports)
    rows = []
    for report in reports:
        common = {"student": report.student, "exercise": _exercise_label(report), "path": report.path}
        common |= {"status": report.status, "counted": "yes" if grades.counted(report) else "no"}
        common["seconds"] = round(report.seconds, 1)
        for check in report.checks or [{"check": "", "points": 0.0, "max_points": 0.0}]:
            lost = [f"{c['name']}: {c['message']}" for c in check.get("cases", []) if not c["passed"]]
            lost += [f"did not run: {check['not_run']}"] if "not_run" in check else []
            lost += [] if report.checks else report.errors[:1]
            rows.append(
                {
                    **common,
                    "check": check["check"],
                    "points": format_points(check["points"]),
                    "max_points": format_points(check["max_points"]),
                    "lost_points": " | ".join(lost),
                }
            )
    for submission in not_graded:
        blank = dict.fromkeys(CHECK_COLUMNS, "")
        rows.append(blank | {"student": submission.student, "path": str(submission.path), "status": NOT_GRADED})
    return rows


def write_rows(rows: list[dict], columns: Sequence[str], path: str | Path) -> None:
    """`rows` to a CSV file, whole or not at all (`files.write_text`). A text a learner made is written escaped
    (`limits.printable`), and one that a spreadsheet would run as a formula (=, +, -, @ first) starts with an
    apostrophe."""
    import csv
    import io

    def cell(value):
        text = printable(str(value)) if isinstance(value, str) else value
        return "'" + text if isinstance(text, str) and text[:1] in ("=", "+", "-", "@") else text

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns))
    writer.writeheader()
    for row in rows:
        writer.writerow({key: cell(value) for key, value in row.items()})
    write_text(path, text.getvalue(), newline="")


def write_gradebook(reports: list[NotebookReport], path: str | Path, not_graded: Sequence[Submission] = ()) -> None:
    """The gradebook CSV: student, one column per exercise, total, max_points (`gradebook_rows`)."""
    grades = class_grades(reports)
    write_rows(gradebook_rows(grades, not_graded), ["student", *grades.exercises, "total", "max_points"], path)


def write_check_rows(reports: list[NotebookReport], path: str | Path, not_graded: Sequence[Submission] = ()) -> None:
    write_rows(check_rows(reports, not_graded), CHECK_COLUMNS, path)


# --- the command ---------------------------------------------------------------------------------------------
def grade_command(
    path: str,
    as_json: bool = False,
    timeout: float | None = None,
    jobs: int | None = None,
    csv_path: str | None = None,
    checks_csv_path: str | None = None,
    writers: Sequence[Callable[[list[NotebookReport], float, list[Submission]], None]] = (),
    student: str | None = None,
    require_sandbox: bool = False,
) -> int:
    """`python -m minigrpo grade PATH`: 0 whatever the score; 2 for a bad PATH, 1 when grading could not run,
    128 + the signal's number when SIGINT or SIGTERM stopped it (130, 143). timeout: seconds per notebook (None:
    its exercise's limit); jobs: notebooks graded at once (None: $MINIGRPO_GRADE_JOBS, else up to 4); csv_path:
    the gradebook; checks_csv_path: the per-check rows; writers: what else to write from the reports, the seconds
    grading took and the submissions an interrupt left ungraded (the CLI's --feedback and --gradescope:
    `feedback.write_feedback`, `gradescope.write_results`), each given absolute paths, since grading leaves the
    working folder. Interrupted, it still writes every output, for the notebooks graded, and each says which were
    not (NOT_GRADED). student: every notebook under `path` is theirs (--student; None: read from the folders,
    `layouts.read_layout`, whose one line on the layout read goes to stderr). Where no operating-system sandbox can
    run, one line on stderr says that it grades trusted code only, and how to grade untrusted code; with
    `require_sandbox` that is an error (2), before anything is graded."""
    unsandboxed = bubblewrap.unavailable_reason()
    if unsandboxed is not None:
        why, how = bubblewrap.UNSANDBOXED.format(reason=unsandboxed), bubblewrap.HOW_TO_SANDBOX
        if require_sandbox:
            say(f"error: --require-sandbox: {why}; {how}", sys.stderr)
            return 2
        say(f"warning: grading trusted code only: {why}, so a notebook's code runs as you; {how}", sys.stderr)
    try:
        layout = read_layout(path, student)
    except FileNotFoundError as error:
        say(f"error: {error}", sys.stderr)
        return 2
    say(f"layout: {layout.description}", sys.stderr)
    submissions = layout.submissions
    # grading leaves the working folder
    csv_path, checks_csv_path = (None if p is None else os.path.abspath(p) for p in (csv_path, checks_csv_path))
    started, not_graded, stopped = time.monotonic(), [], None
    progress = lambda line: say(line, sys.stderr)  # noqa: E731
    try:
        reports = grade_notebooks(
            submissions, timeout=timeout, jobs=jobs, progress=progress, sandboxed=unsandboxed is None
        )
    except GradingError as error:
        say(f"error: {error}", sys.stderr)
        return 1
    except GradingInterrupted as interrupted:
        reports, stopped = interrupted.reports, interrupted
        not_graded = [s for s in submissions if s.path in set(interrupted.not_graded)]
    if as_json:
        say(json.dumps(json_report(path, reports, time.monotonic() - started, stopped), indent=1))  # ASCII
    else:
        say(format_scores(reports, [s.path for s in not_graded]))
    if csv_path is not None:
        write_gradebook(reports, csv_path, not_graded)
    if checks_csv_path is not None:
        write_check_rows(reports, checks_csv_path, not_graded)
    for write in writers:
        write(reports, time.monotonic() - started, not_graded)
    if stopped:
        names = ", ".join(printable(str(s.path)) for s in not_graded) or "none"
        say(
            f"interrupted by {stopped.signal_name}: grading stopped; not graded (no score recorded): {names}",
            sys.stderr,
        )
        return 128 + stopped.signal_number
    return 0


def json_report(path, reports: list[NotebookReport], seconds: float, stopped: GradingInterrupted | None) -> dict:
    """What --json prints: the totals, the gradebook (students), and every notebook's report."""
    grades = class_grades(reports)
    points, most = table_total(reports)
    summary = {
        "path": str(path),
        "points": points,  # the table's total: a student's second notebook of an exercise adds nothing
        "max_points": most,
        "seconds": round(seconds, 2),
        "limits": LIMITS,
        "several_notebooks_rule": SEVERAL_RULE,
        "exercises": {e: EXERCISES[e].max_points for e in grades.exercises},
        "students": [grade.to_dict(grades.exercises) for grade in grades.students],
    }
    if stopped:
        summary |= {"interrupted": stopped.signal_name, "not_graded": [str(p) for p in stopped.not_graded]}
    return {**summary, "notebooks": [r.to_dict() for r in reports]}

"""One feedback file per student: `python -m minigrpo grade PATH --feedback DIR` writes DIR/<student>.md.

A student reads in it what their notebook's check cells print (`framework.format_check`: each check's points out of
its maximum, PASS / FAIL per case with its points, the hint of each failed case), for every exercise they handed in,
but computed by the grader's judge rather than by their own kernel, plus what the grader found: a check that did not
run (its cell deleted, the notebook out of time), a notebook that could not be read or was refused, and which of
several notebooks counted. The file starts with their gradebook row (each exercise's points out of its fixed maximum).

Everything a learner made (file and folder names, messages from their code) is written escaped
(`limits.printable`) inside Markdown code (a code span or a fenced block, longer than any run of backticks inside),
so that no Markdown or HTML of theirs is rendered in the file an instructor hands back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from minigrpo import __version__
from minigrpo.grading.exercises import EXERCISES
from minigrpo.grading.framework import CaseResult, CheckResult, format_check, format_points
from minigrpo.grading.reports.files import write_text
from minigrpo.grading.reports.gradebook import StudentGrade, class_grades
from minigrpo.grading.runner import NotebookReport, Submission
from minigrpo.grading.sandbox.limits import printable


def check_text(check: dict) -> str:
    """What the notebook's check cell prints for one check record of a report (`format_check`), or, for a check the
    judge did not run, its points (0 of its maximum) and why: `check_rloo_advantages: 0/2 points` / `  did not run:
    ...`."""
    if "not_run" in check:
        head = f"{check['check']}: {format_points(check['points'])}/{format_points(check['max_points'])} points"
        return f"{head}\n  did not run: {check['not_run'] or 'no reason was given'}"
    cases = [
        CaseResult(c["name"], c["points"], c["max_points"], c["passed"], c.get("message", "")) for c in check["cases"]
    ]
    return format_check(CheckResult(check["check"], cases))


def code_span(text: str) -> str:
    """`text` escaped, as inline Markdown code: fenced by one backtick more than its longest run of backticks."""
    text = printable(text)
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(lines: Sequence[str]) -> list[str]:
    """`lines` escaped, as a fenced Markdown code block (its fence longer than any run of backticks inside)."""
    escaped = [printable(line) for line in lines]
    longest = max((len(run) for line in escaped for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", *escaped, fence]


def notebook_section(report: NotebookReport, counted: bool) -> list[str]:
    """One notebook's part of the file: a heading with its points out of its maximum, how its run went, the notes,
    and every check's text."""
    label = report.exercise or "not an exercise's notebook"
    heading = f"## {label}: {format_points(report.points)}/{format_points(report.max_points)} points"
    name = code_span(Path(report.path).name)
    lines = [heading, "", f"Notebook: {name}" + ("" if counted else " (not counted)")]
    if report.status != "ok":
        lines += ["", f"This notebook was not graded in full ({report.status}):"]
        lines += code_block(report.errors[:1] or ["no message"])
    found = report.errors[1:] if report.status != "ok" else report.errors
    if found:
        lines += ["", "Errors the notebook's cells raised:", *code_block(found)]
    if report.notes:
        lines += ["", "Notes:", *code_block(report.notes)]
    if report.checks:
        lines += ["", "The checks, as your notebook's check cells print them (run by the grader):"]
        lines += code_block("\n\n".join(check_text(c) for c in report.checks).splitlines())
    return lines


def feedback_markdown(grade: StudentGrade, exercises: Sequence[str], reports: Sequence[NotebookReport]) -> str:
    """One student's feedback file: their gradebook row over the class's `exercises`, then each notebook of theirs
    (`reports`: the one that counts for each exercise first, in the course's order; then the others)."""
    row = grade.to_dict(exercises)
    lines = [f"# Feedback for {code_span(grade.student)}", ""]
    total = f"{format_points(row['points'])} of {format_points(row['max_points'])} points"
    lines.append(f"Graded by minigrpo {__version__}: {total}.")
    lines += ["", "| exercise | points | max |", "| --- | ---: | ---: |"]
    for exercise in exercises:
        points = row["exercises"][exercise]
        shown = "not handed in" if points is None else format_points(points)
        lines.append(f"| {exercise} | {shown} | {format_points(EXERCISES[exercise].max_points)} |")
    if grade.notes:
        lines += ["", "Notes:", *code_block(grade.notes)]
    counted = [grade.exercises[e] for e in exercises if e in grade.exercises]
    others = sorted((r for r in reports if all(r is not c for c in counted)), key=lambda r: r.path)
    for report in counted + others:
        lines += ["", *notebook_section(report, counted=any(report is c for c in counted))]
    return "\n".join(lines) + "\n"


def feedback_file_name(student: str, taken: set[str]) -> str:
    """`<student>.md`, with every character but letters, digits, '.', '-' and '_' made '_' (and no leading dot);
    a name already `taken` gets '-2', '-3', ... before its suffix."""
    stem = re.sub(r"[^\w.-]", "_", student, flags=re.ASCII).lstrip(".") or "student"
    name, n = f"{stem}.md", 1
    while name.lower() in taken:
        n += 1
        name = f"{stem}-{n}.md"
    taken.add(name.lower())
    return name


def write_feedback(
    reports: Sequence[NotebookReport], folder: str | Path, not_graded: Sequence[Submission] = ()
) -> dict[str, Path]:
    """One Markdown file per student in `folder` (made if missing), each whole or not at all (`files.write_text`):
    {student: the file written}. A student with a notebook an interrupt left ungraded (`not_graded`) gets none: it
    would hand them back a grade that is not theirs."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    grades = class_grades(list(reports))
    unfinished = {submission.student for submission in not_graded}
    written, taken = {}, set()
    for grade in grades.students:
        if grade.student in unfinished:
            continue
        theirs = [r for r in reports if r.student == grade.student]
        path = folder / feedback_file_name(grade.student, taken)
        write_text(path, feedback_markdown(grade, grades.exercises, theirs))
        written[grade.student] = path
    return written

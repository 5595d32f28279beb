"""Whose notebook is it: the layout of the PATH `python -m minigrpo grade PATH` is given.

`read_layout` reads the student of every notebook under PATH from PATH's name and from where the notebook lies, and
says in one line which layout it read (`grade` prints it on stderr before grading starts):

| layout | PATH | a notebook at | student |
| --- | --- | --- | --- |
| nbgrader's, a class | submitted/ | submitted/<student>/<assignment>/<notebook>.ipynb | <student> |
| nbgrader's, one student | submitted/<student>, or a folder or notebook in it | the same | <student> |
| a folder per student | a folder | <student>/<notebook>.ipynb, or deeper in <student>/ | <student> |
| a flat folder, or one file | a folder, or a .ipynb file | <notebook>.ipynb | the file's stem |
| --student NAME | anything | anywhere under PATH | NAME |

Which layout wins
-----------------
`--student NAME` wins over everything. Without it, a folder PATH whose notebooks lie in folders (PATH/a/x.ipynb)
reads two ways: a class with a folder per student (a is a student) or one student's folder of nbgrader's layout (a is
an assignment). PATH's own path decides, never what the folders hold: right below a folder named `submitted`
(nbgrader's name for it), PATH is one student's folder, and so is a folder or notebook below that at nbgrader's depths
(submitted/<student>/<assignment>/<notebook>.ipynb); anywhere else a folder is a class, a folder per student, however
deep its notebooks lie in each student's folder. Reading the layout from the folders' contents would let one student's
files (a folder or a marker file in their own folder) change whose every notebook of the class is. A student's folder
copied elsewhere therefore reads as a class whose students are its assignments: the layout's line names the students
it found and says to give --student NAME for one student's folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from minigrpo.grading.runner import Submission, find_notebooks
from minigrpo.grading.sandbox.limits import printable

NBGRADER_FOLDER = "submitted"
"""nbgrader's folder of collected submissions: submitted/<student>/<assignment>/<notebook>.ipynb."""
NAMES_SHOWN = 5
"""The layout's line names this many students at most."""


@dataclass
class Layout:
    """The notebooks under a PATH, each with its student, and the line that says which layout they were read from."""

    submissions: list[Submission]
    description: str


def nbgrader_student(path: str | Path) -> str | None:
    """The student whose folder `path` is, or lies in, in nbgrader's layout: a folder one or two levels below a folder
    named `submitted` (<student>, <student>/<assignment>), or a notebook two or three levels below it; else None."""
    parts = Path(os.path.abspath(path)).parts
    depths = (2, 3) if Path(path).suffix == ".ipynb" and not Path(path).is_dir() else (1, 2)
    for depth in depths:  # the nearest folder named submitted
        if len(parts) > depth + 1 and parts[-depth - 1] == NBGRADER_FOLDER:
            return parts[-depth]
    return None


def read_layout(path: str | Path, student: str | None = None) -> Layout:
    """Every notebook under `path` (`runner.find_notebooks`) with its student, by the rules of the module's table;
    `student`: --student NAME, every notebook's. Raises FileNotFoundError for a path that holds no notebook."""
    path = Path(path)
    notebooks = find_notebooks(path)
    folder = path if path.is_dir() else None  # nothing outside it is read
    count = f"{len(notebooks)} notebook{'s' if len(notebooks) != 1 else ''}"
    if student is not None:
        return Layout(
            [Submission(notebook, student, folder) for notebook in notebooks],
            f"--student: every notebook under {printable(str(path))} is {printable(student)}'s ({count})",
        )
    owner = nbgrader_student(path)
    if owner is not None:
        return Layout(
            [Submission(notebook, owner, folder) for notebook in notebooks],
            f"nbgrader's, one student's folder ({NBGRADER_FOLDER}/<student>/<assignment>/): every notebook is "
            f"{printable(owner)}'s ({count}; --student NAME names another)",
        )
    if folder is None:
        line = f"one notebook: the student is its file's stem, {printable(path.stem)}"
        return Layout([Submission(notebook, notebook.stem) for notebook in notebooks], line)
    submissions = []
    for notebook in notebooks:
        parts = notebook.relative_to(folder).parts
        submissions.append(Submission(notebook, parts[0] if len(parts) > 1 else notebook.stem, folder))
    return Layout(submissions, _folder_description(folder, notebooks))


def _folder_description(folder: Path, notebooks: list[Path]) -> str:
    """The line for a folder read as a class: a flat folder, a folder per student (nbgrader's submitted/ by name), or
    both at once (notebooks directly in it and in student folders)."""
    where = [notebook.relative_to(folder).parts for notebook in notebooks]
    loose = sum(len(parts) == 1 for parts in where)
    students = sorted({parts[0] for parts in where if len(parts) > 1})
    if not students:
        return f"a flat folder: each notebook's student is its file's stem ({loose} notebook{'s' if loose > 1 else ''})"
    shown = ", ".join(printable(name) for name in students[:NAMES_SHOWN])
    shown += f" and {len(students) - NAMES_SHOWN} more" if len(students) > NAMES_SHOWN else ""
    if Path(os.path.abspath(folder)).name == NBGRADER_FOLDER:
        line = f"nbgrader's {NBGRADER_FOLDER}/ ({NBGRADER_FOLDER}/<student>/<assignment>/)"
    else:
        line = "a folder per student (<student>/...)"
    line += f": {len(students)} student{'s' if len(students) > 1 else ''} ({shown})"
    if loose:
        line += f", and {loose} notebook{'s' if loose > 1 else ''} directly in the folder, each its file's stem's"
    if not line.startswith("nbgrader"):  # its folders might be one student's assignments
        line += "; for one student's folder, give --student NAME"
    return line

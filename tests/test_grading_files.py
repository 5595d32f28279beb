"""The grader reads only the graded folder, and never quotes a file it could not parse.

A submitted "notebook" may be a symbolic link: to a file of the grader's user (its bytes would land in the report,
the JSON and the CSV) or to another class's solved notebook outside the graded folder (graded as the student's).
Both are refused, never opened; a link that stays inside the folder is read. A file that is not a notebook is
reported by its error's type and its path only.
"""

import csv
import json
import os

import nbformat
import pytest

from minigrpo.grading.reports.gradebook import grade_command
from minigrpo.grading.reports.layouts import read_layout
from minigrpo.grading.runner import _read
from minigrpo.grading.sandbox.limits import NotebookRefused, read_notebook

SECRET = "grader-private-token-4f9c"


@pytest.fixture
def classroom(tmp_path):
    """class/ (graded) with jane's link to a private file, bob's link to a solved notebook outside, ann's link
    inside the folder, and eve's file that is not JSON; private/ outside the class folder."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "token.txt").write_text(f"{SECRET}\n")
    solved = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(solved, private / "solved.ipynb")
    folder = tmp_path / "class"
    for student in ("jane", "bob", "ann", "eve"):
        (folder / student).mkdir(parents=True)
    os.symlink(private / "token.txt", folder / "jane" / "06_kl_k3_estimator.ipynb")
    os.symlink(private / "solved.ipynb", folder / "bob" / "06_kl_k3_estimator.ipynb")
    nbformat.write(solved, folder / "ann" / "real.ipynb")
    os.symlink(folder / "ann" / "real.ipynb", folder / "ann" / "06_kl_k3_estimator.ipynb")
    (folder / "eve" / "06_kl_k3_estimator.ipynb").write_text(f"not json: {SECRET}")
    os.symlink(private, folder / "eve" / "linked_folder")  # a folder link: its notebooks are not even listed
    return folder, private


def test_a_link_out_of_the_graded_folder_is_refused_and_one_inside_it_is_read(classroom):
    folder, private = classroom
    for student in ("jane", "bob"):
        with pytest.raises(NotebookRefused, match="a link to a file outside the graded folder"):
            read_notebook(folder / student / "06_kl_k3_estimator.ipynb", folder)
    with pytest.raises(NotebookRefused, match="outside the graded folder"):
        read_notebook(folder / "eve" / "linked_folder" / "solved.ipynb", folder)  # through a folder link
    inside = read_notebook(folder / "ann" / "06_kl_k3_estimator.ipynb", folder)
    assert inside == (folder / "ann" / "real.ipynb").read_text()
    assert read_notebook(private / "solved.ipynb")  # no folder given (a notebook named alone): read as before


def test_a_file_that_does_not_parse_is_reported_by_its_error_type_and_path_only(classroom):
    folder, _ = classroom
    path = folder / "eve" / "06_kl_k3_estimator.ipynb"
    nb, reason = _read(path, folder)
    assert nb is None and SECRET not in reason and "not json" not in reason
    assert reason.startswith(f"cannot read {path}: ") and "Error" in reason and "Jupyter's format" in reason


def test_grading_a_class_with_links_leaks_nothing_and_grades_no_other_file(classroom, tmp_path, capsys):
    folder, _ = classroom
    submissions = read_layout(folder).submissions
    assert sorted(s.student for s in submissions) == ["ann", "ann", "bob", "eve", "jane"]
    assert "linked_folder" not in str([s.path for s in submissions])
    gradebook, checks = tmp_path / "grades.csv", tmp_path / "checks.csv"
    # everything here is unreadable or calls no check: no kernel starts
    code = grade_command(str(folder), as_json=True, csv_path=str(gradebook), checks_csv_path=str(checks))
    out, err = capsys.readouterr()
    assert code == 0
    everything = out + err + gradebook.read_text() + checks.read_text()
    assert SECRET not in everything and "not json" not in everything
    report = {(n["student"], os.path.basename(n["path"])): n for n in json.loads(out)["notebooks"]}
    for student in ("jane", "bob"):
        refused = report[(student, "06_kl_k3_estimator.ipynb")]
        assert refused["status"] == "unreadable" and refused["points"] == 0 and refused["max_points"] == 3
        assert "a link to a file outside the graded folder" in refused["errors"][0]
    assert report[("ann", "06_kl_k3_estimator.ipynb")]["status"] == "ok"  # read through its link, inside the folder
    rows = list(csv.DictReader(gradebook.open()))
    assert {row["student"] for row in rows} == {"ann", "bob", "eve", "jane"}

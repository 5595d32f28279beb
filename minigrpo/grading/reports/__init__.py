"""The reports: what the grader writes once the notebooks are graded, for the instructor and for each student.

| module | job |
| --- | --- |
| layouts | whose each notebook is: nbgrader's submitted/ or one student's folder of it, a folder each, a flat folder |
| gradebook | `python -m minigrpo grade PATH`: one score per student and exercise, the table, the CSVs |
| feedback | `grade --feedback DIR`: a Markdown file per student, each check as its cell prints it |
| gradescope | `grade --gradescope FILE`: Gradescope's results.json; `python -m minigrpo autograder`: its zip |
| files | how they reach the disk: each file written whole or not at all |

They read the runner's `NotebookReport`s and the exercises' fixed maxima; every learner-made string goes through
`sandbox.limits.printable` before it is printed or written.
"""

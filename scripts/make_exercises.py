"""Generate exercises/ from solutions/: the solutions are the one source of truth.

    python scripts/make_exercises.py           # (re)write exercises/*.ipynb
    python scripts/make_exercises.py --check   # exit 1 when exercises/ is out of date (CI, tests)

In every code cell, the lines from `### BEGIN SOLUTION` to `### END SOLUTION`
(nbgrader's markers) become a stub at the same indentation:

    # YOUR CODE HERE
    raise NotImplementedError("...")

so a function keeps its signature and docstring (put the markers after the
docstring). In a markdown cell the block becomes "_Your answer here._". Outputs,
execution counts and ipywidgets state are stripped, a cell tagged `solution-only`
(View > Cell toolbar > Tags; for what points at the answer, such as a worked
reference) is left out, links to solutions/<name> point to
exercises/<name> (the Colab badge), and everything else is copied unchanged,
so cells that scripts/stamp_colab.py added to a solution carry over.

Every solution and exercise is stamped with its exercise and the package's version
(metadata["minigrpo"], `minigrpo.grading.exercises.Exercise.stamp`): the grader
knows a renamed copy ("Copy of 04_...ipynb") by it, and knows a handout of another
version. The script writes the stamp into solutions/ too, so a new version (or a
changed check) means running it again; --check fails until then.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

from minigrpo import __version__
from minigrpo.grading import EXERCISES
from minigrpo.grading.exercises import METADATA_KEY

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = [
    "# YOUR CODE HERE",
    'raise NotImplementedError("Exercise: replace this line with your solution, then run the check below.")',
]
MARKDOWN_STUB = ["_Your answer here._"]
SOLUTION_ONLY = "solution-only"  # a cell tag: the cell stays in the solution and is left out of the exercise


def strip_solutions(source: str, stub: list[str]) -> str:
    """Replace every BEGIN ... END SOLUTION block of `source` by `stub`, indented like the BEGIN marker."""
    lines, out, inside = source.split("\n"), [], False
    for number, line in enumerate(lines, start=1):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise ValueError(f"line {number}: {BEGIN} inside another solution block")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + s for s in stub]
        elif marker == END:
            if not inside:
                raise ValueError(f"line {number}: {END} without a {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN} without an {END}")
    return "\n".join(out)


def make_exercise(solution: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The exercise notebook for one solution notebook (a new object; the solution is not modified)."""
    exercise = copy.deepcopy(solution)
    exercise.metadata.pop("widgets", None)  # ipywidgets state: a snapshot of one run's widgets, never committed
    exercise.cells = [cell for cell in exercise.cells if SOLUTION_ONLY not in cell.metadata.get("tags", [])]
    for cell in exercise.cells:
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source, CODE_STUB)
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
        elif cell.cell_type == "markdown":
            cell.source = strip_solutions(cell.source, MARKDOWN_STUB)
        cell.source = re.sub(rf"\bsolutions/{re.escape(name)}", f"exercises/{name}", cell.source)
    return exercise


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def stamped(solution: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The solution with its exercise's stamp in its metadata (a new object): the exercise whose id is its stem."""
    exercise_id = Path(name).stem
    if exercise_id not in EXERCISES:
        raise ValueError(
            f"no exercise {exercise_id} in minigrpo.grading: register it (exercise(...)) beside its checks"
        )
    solution = copy.deepcopy(solution)
    solution.metadata[METADATA_KEY] = EXERCISES[exercise_id].stamp(__version__)
    return solution


def expected_notebooks(solutions: Path) -> dict[str, tuple[str, str]]:
    """file name -> (the stamped solution's text, its exercise's text), for every solution notebook."""
    notebooks = sorted(solutions.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no solution notebooks in {solutions}")
    expected = {}
    for path in notebooks:
        solution = nbformat.read(path, as_version=4)
        if not any(BEGIN in cell.source for cell in solution.cells):
            raise ValueError(f"{path} has no {BEGIN} block: nothing for the learner to do")
        try:
            solution = stamped(solution, path.name)
            expected[path.name] = (render(solution), render(make_exercise(solution, path.name)))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    return expected


def stale_exercises(solutions: Path, exercises: Path) -> list[str]:
    """What differs between exercises/ and what the solutions generate, and solutions whose stamp is not this
    version's (empty when up to date)."""
    expected = expected_notebooks(solutions)
    problems = [
        f"{solutions / name} has no stamp of minigrpo {__version__}'s exercise in its metadata"
        for name, (solution, _) in expected.items()
        if (solutions / name).read_text() != solution
    ]
    for name, (_, text) in expected.items():
        path = exercises / name
        if not path.exists():
            problems.append(f"{path} is missing")
        elif path.read_text() != text:
            problems.append(f"{path} differs from what {solutions / name} generates")
    for path in sorted(exercises.glob("*.ipynb")):
        if path.name not in expected:
            problems.append(f"{path} has no solution in {solutions}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when exercises/ is out of date; write nothing")
    parser.add_argument("--solutions", type=Path, default=ROOT / "solutions")
    parser.add_argument("--exercises", type=Path, default=ROOT / "exercises")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_exercises(args.solutions, args.exercises)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("exercises/ is out of date: run python scripts/make_exercises.py", file=sys.stderr)
            return 1
        print(f"exercises/ is up to date with {args.solutions}")
        return 0
    args.exercises.mkdir(parents=True, exist_ok=True)
    expected = expected_notebooks(args.solutions)
    for name, (solution, exercise) in expected.items():
        if (args.solutions / name).read_text() != solution:
            (args.solutions / name).write_text(solution)  # the stamp only: nbformat keeps the rest as it was
        (args.exercises / name).write_text(exercise)
    print(f"stamped {len(expected)} solutions and wrote their exercise notebooks to {args.exercises}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

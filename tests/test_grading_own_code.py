"""Own-code analysis that sees what runs: the capstone's cells read as IPython runs them, copies known by their code.

Case by case, each added to the solved capstone's cells: what must cost the own-code points (a cell magic's body,
`__import__` and `importlib` calls, a copy of the package's or the single-file example's code under another name),
and what must not (a docstring or a comment that names a stage, a defensive `raise NotImplementedError(f"...")`).
Then the run-time watch of the other exercises: a reference's code under another file name is still the reference.
"""

import inspect
import textwrap
import types
from pathlib import Path

import nbformat
import pytest

from minigrpo import grading
from minigrpo.grading.checks.own_code import SINGLE_FILE, STUB, stage_function_uses, unwritten
from minigrpo.grading.framework import judged_cells
from minigrpo.grading.references import ReferenceWatch, code_digest, watch_list
from minigrpo.losses import grpo_loss, kl_penalty

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "12_grpo_from_scratch.ipynb"
CELLS = [c.source for c in nbformat.read(SOLUTION, as_version=4).cells if c.cell_type == "code"]
PASTED = inspect.getsource(grpo_loss).replace("def grpo_loss(", "def my_own_loss(")  # and its docstring kept
SINGLE_FILE_LOSS = next(  # examples/grpo_single_file.py's grpo_loss, comments and docstring stripped, renamed
    textwrap.dedent(block)
    for block in SINGLE_FILE.read_text().split("\n\n\n")
    if block.lstrip().startswith("def grpo_loss(")
)


def own_code(cell: str):
    """check_capstone_own_code on the solution's cells and `cell`: (points, the message)."""
    cells = [*CELLS, cell]
    with judged_cells(cells):
        result = grading.run_check("check_capstone_own_code", lambda: None, quiet=True)
    return result.points, result.cases[0].message


@pytest.mark.parametrize(
    "cell, named",
    [
        ("%%capture\nfrom minigrpo import GRPOTrainer", "`GRPOTrainer` from minigrpo"),
        ("%%time\n%%capture\nimport minigrpo.losses as l", "`import minigrpo.losses`"),
        ("trainer = __import__('minigrpo').GRPOTrainer", "`GRPOTrainer` from minigrpo"),
        ("import importlib\nm = importlib.import_module('minigrpo')\nm.grpo_loss", "`grpo_loss` from minigrpo"),
        ("import importlib\nimportlib.import_module('minigrpo.' + 'losses')", "a name built at run time"),
        ("name = 'minigrpo'\nmodule = __import__(name)", "a name built at run time"),
        (PASTED, "`my_own_loss`, a copy of minigrpo.losses.grpo_loss"),
        (SINGLE_FILE_LOSS, "`grpo_loss`, a copy of examples/grpo_single_file.py's grpo_loss"),
    ],
)
def test_what_runs_the_package_costs_the_own_code_points(cell, named):
    points, message = own_code(cell)
    assert points == 0 and named in message, message


@pytest.mark.parametrize(
    "cell",
    [
        'def loss(x):\n    """Like minigrpo.losses.grpo_loss, written by me."""\n    return x.mean()',
        "# minigrpo.losses.grpo_loss does this too\ny = 1",
        'def agg(loss_type):\n    if loss_type != "grpo":\n        raise NotImplementedError(f"loss_type {loss_type}")',
        'raise NotImplementedError("not this one: a different message")',
        "import minigrpo_helpers\nminigrpo_helpers.grpo_loss",  # a module of the learner's, not the package
    ],
)
def test_docstrings_comments_and_a_defensive_raise_cost_nothing(cell):
    assert own_code(cell) == (2, "")


def test_only_the_exercise_s_stub_line_counts_as_unwritten():
    exercise = [c.source for c in nbformat.read(ROOT / "exercises" / SOLUTION.name, as_version=4).cells]
    assert unwritten(exercise) == 8 and unwritten(CELLS) == 0  # the handout's eight functions, the solution's none
    assert STUB in (ROOT / "scripts" / "make_exercises.py").read_text()  # the line the exercises are made with
    assert unwritten([f'def f():\n    raise NotImplementedError("{STUB}, then run the check below.")']) == 1
    assert unwritten(['raise NotImplementedError(f"loss_type {t}")', "raise NotImplementedError"]) == 0
    points, message = own_code(f'def f():\n    raise NotImplementedError("{STUB}.")')
    assert points == 0 and "1 of the exercise's stub lines still raise NotImplementedError" in message


def test_the_solution_uses_only_the_givens():
    assert stage_function_uses(CELLS) == []


# --- the run-time watch: a reference's code is known by what it is, not by its file -------------------------
def test_a_reference_s_code_object_under_another_file_name_is_seen_running_and_the_same_source_in_a_cell_is_not():
    """The code object moved to another file (the cheat) is the reference; the same code written in a cell (as a
    solution can be, line for line) is the learner's: the watch tells them apart by the code's first line."""
    watched = watch_list([kl_penalty])
    moved = types.FunctionType(kl_penalty.__code__.replace(co_filename="/elsewhere/mine.py"), kl_penalty.__globals__)
    pasted_source = inspect.getsource(kl_penalty).replace('"""', "'''", 2)  # a docstring in other quotes, same code
    namespace = dict(kl_penalty.__globals__)
    exec(compile(pasted_source.replace("def kl_penalty(", "def my_kl("), "<cell>", "exec"), namespace)
    assert code_digest(moved.__code__) == code_digest(namespace["my_kl"].__code__) == code_digest(kl_penalty.__code__)
    logps = grading.framework.torch.zeros(2, 3)
    with ReferenceWatch(watched) as watch:
        moved(logps, logps, "k3")
    assert watch.ran == "minigrpo.losses.kl_penalty"
    with ReferenceWatch(watched) as watch:
        namespace["my_kl"](logps, logps, "k3")
    assert watch.ran is None

    def honest(logps, ref):
        log_r = ref - logps
        return log_r.exp() - log_r - 1

    with ReferenceWatch(watched) as watch:
        honest(logps, logps)
    assert watch.ran is None

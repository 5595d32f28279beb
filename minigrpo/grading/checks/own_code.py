"""Is the capstone the learner's own code? Read the notebook's cells (their syntax trees) for the package's stages.

The capstone gives a few of the package's names (the model loader, the dataset, the reward functions, the config,
the held-out evaluation and the checks: GIVEN) and asks for everything else from scratch. `stage_function_uses`
lists every other use of the package in the cells:

- an import from minigrpo of anything not given (`from minigrpo import grpo_loss`, `from minigrpo.losses import *`,
  `import minigrpo.rollout`), wherever it sits (inside a function too);
- an attribute chain from an imported minigrpo module (`minigrpo.losses.grpo_loss(...)`, `m.grpo_loss` after
  `import minigrpo as m`) that reaches a name not given;
- a string that names a stage module (`importlib.import_module("minigrpo.losses")`), docstrings left out;
- `__import__(...)` or `importlib.import_module(...)` of a name built at run time, and the package reached through
  one (`__import__("minigrpo").GRPOTrainer`);
- a function whose code is one of the package's or of examples/grpo_single_file.py's (`references.code_digest`:
  its bytecode, names and constants, whatever its name, its file, its comments or its docstring).

It reads what runs: each cell as IPython runs it, a cell magic's body (`%%capture`) included (`cells.python_of`).
Comments and docstrings are not code. `unwritten(cells)` counts the exercise's own stub lines (STUB) still there:
a learner's own `raise NotImplementedError(...)` (a defensive one) is their code.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import types
from collections.abc import Sequence
from pathlib import Path

from minigrpo.grading.cells import python_of
from minigrpo.grading.references import code_digest

GIVEN = {
    "minigrpo": {"GRPOConfig", "load_model_and_tokenizer", "make_arithmetic_dataset", "correctness_reward",
                 "format_reward"},
    "minigrpo.course": {"colab_setup", "describe", "model_name", "steps", "QUICK"},
    "minigrpo.grading": {"held_out_accuracy", "CAPSTONE_LEARNING", "capstone_learning_config",
                         "capstone_learning_data"},
}  # fmt: skip
"""module -> the names the capstone gives from it (every check_x of minigrpo.grading is given too)."""
STAGE_MODULES = ("rollout", "rewards", "advantages", "logprobs", "losses", "trainer", "dynamic_sampling", "ppo",
                 "ppo_math")  # fmt: skip
_STAGE_STRING = re.compile(r"\bminigrpo\.(" + "|".join(STAGE_MODULES) + r")\b")
STUB = "Exercise: replace this line with your solution"
"""The message of the stub line that scripts/make_exercises.py writes in place of each solution."""
SINGLE_FILE = Path(__file__).resolve().parents[3] / "examples" / "grpo_single_file.py"
"""The whole algorithm in one file, where the repository has it: its functions are the package's too."""
MIN_COPY_BYTES = 48
"""Functions with less bytecode than this (a one-line helper anyone writes alike) are never called copies."""
_IMPORTERS = ("__import__", "import_module")
_IMPORTED = "<imported>"  # marks a chain that starts at an __import__ / import_module call, not at a name


def _given(module: str, name: str) -> bool:
    return name in GIVEN.get(module, ()) or (module == "minigrpo.grading" and name.startswith("check_"))


def _describe(module: str, name: str) -> str:
    """'`grpo_loss` from minigrpo (minigrpo.losses.grpo_loss, a stage of GRPO)'."""
    try:
        value = getattr(importlib.import_module(module), name, None)
    except ImportError:
        value = None
    home = getattr(value, "__module__", None) or (value.__name__ if hasattr(value, "__spec__") else None)
    what = f"`{name}` from {module}"
    if home and home.split(".")[-1] in STAGE_MODULES and home.startswith("minigrpo"):
        return f"{what} ({home}.{name}, a stage of GRPO)"
    return f"{what} (not one of the capstone's given imports)"


def stage_function_uses(cells: Sequence[str]) -> list[str]:
    """Every use of the package beyond GIVEN in the code cells, as 'WHAT (cell N)'; [] when there is none."""
    found = []
    for number, cell in enumerate(cells, start=1):
        for source, tree in python_of(cell):  # a cell that does not parse runs nothing
            found += [f"{use} (cell {number})" for use in _uses(tree) + _copies(source)]
    return list(dict.fromkeys(found))


def unwritten(cells: Sequence[str]) -> int:
    """How many of the exercise's stub lines (`raise NotImplementedError("Exercise: ...")`) the cells still have."""
    count = 0
    for cell in cells:
        for _, tree in python_of(cell)[:1]:
            count += sum(_is_stub(node) for node in ast.walk(tree))
    return count


def _is_stub(node: ast.AST) -> bool:
    error = node.exc if isinstance(node, ast.Raise) else None
    argument = error.args[0] if isinstance(error, ast.Call) and error.args else None
    return (
        getattr(error.func if isinstance(error, ast.Call) else None, "id", None) == "NotImplementedError"
        and isinstance(argument, ast.Constant)
        and isinstance(argument.value, str)
        and argument.value.startswith(STUB)
    )


def _docstrings(tree: ast.Module) -> set[int]:
    """id() of every docstring's constant node: text, not code."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _imported(node: ast.AST) -> str | None:
    """'minigrpo' for `__import__("minigrpo.losses")`, 'minigrpo.losses' for `importlib.import_module(
    "minigrpo.losses")`; '' for either with a name built at run time; None for anything else."""
    if not isinstance(node, ast.Call) or (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) not in (
        _IMPORTERS
    ):
        return None
    name = node.args[0] if node.args else None
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return ""
    top = getattr(node.func, "id", None) == "__import__" or getattr(node.func, "attr", None) == "__import__"
    return name.value.split(".")[0] if top else name.value


def _uses(tree: ast.Module) -> list[str]:
    uses, modules, docstrings = [], {}, _docstrings(tree)  # modules: a local name -> the minigrpo module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "minigrpo" and node.level == 0:
            for alias in node.names:
                if alias.name == "*":
                    uses.append(f"`from {node.module} import *`")
                elif _is_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif not _given(node.module, alias.name):
                    uses.append(_describe(node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "minigrpo":
                    continue
                if alias.name.split(".")[-1] in STAGE_MODULES:
                    uses.append(f"`import {alias.name}` (a stage module of GRPO)")
                modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "minigrpo"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _STAGE_STRING.search(node.value)
            and id(node) not in docstrings
        ):
            uses.append(f"the string {node.value!r} (names a stage module of GRPO)")
        elif _imported(node) == "":
            uses.append("a module imported by a name built at run time (import the package's given names by name)")
        elif isinstance(node, ast.Assign) and (_imported(node.value) or "").split(".")[0] == "minigrpo":
            modules.update((t.id, _imported(node.value)) for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        chain = _chain(node)
        imported = chain[0].removeprefix(_IMPORTED) if chain and chain[0].startswith(_IMPORTED) else None
        if chain and (chain[0] in modules or imported):
            module = modules.get(chain[0]) or imported
            for attribute in chain[1:]:
                if _is_module(f"{module}.{attribute}"):
                    module = f"{module}.{attribute}"
                    continue
                if not _given(module, attribute):
                    uses.append(_describe(module, attribute))
                break
    return uses


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` -> ['a', 'b', 'c'] for the outermost attribute of a chain; `__import__("minigrpo").b` ->
    ['<imported>minigrpo', 'b'] (None for anything else)."""
    if not isinstance(node, ast.Attribute):
        return None
    chain, value = [node.attr], node.value
    while isinstance(value, ast.Attribute):
        chain.insert(0, value.attr)
        value = value.value
    if isinstance(value, ast.Name):
        return [value.id, *chain]
    module = _imported(value)
    return [_IMPORTED + module, *chain] if module and module.split(".")[0] == "minigrpo" else None


def _copies(source: str) -> list[str]:
    """The functions defined in `source` whose code is one of the package's (compiled here, never run)."""
    try:
        module = compile(source, "<cell>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return []
    package = _package_functions()
    return [
        f"`{code.co_name}`, a copy of {package[digest]} (its code, whatever its name or file)"
        for code in _functions_in(module)
        if not code.co_name.startswith("<")  # a comprehension or a lambda: part of a function, not one
        and len(code.co_code) >= MIN_COPY_BYTES
        and (digest := code_digest(code)) in package
    ]


def _functions_in(code: types.CodeType) -> list[types.CodeType]:
    """Every code object defined in `code` (functions, methods, lambdas), nested ones too."""
    found = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += [const, *_functions_in(const)]
    return found


@functools.cache
def _package_functions() -> dict[str, str]:
    """code_digest -> 'minigrpo.losses.grpo_loss' for every function and method of the stage modules, and of
    examples/grpo_single_file.py where it exists."""
    found = {}
    for name in STAGE_MODULES:
        module = importlib.import_module(f"minigrpo.{name}")
        for value in vars(module).values():
            if getattr(value, "__module__", None) != module.__name__:
                continue  # imported from elsewhere: listed under its own module
            functions = [value] if inspect.isfunction(value) else []
            if inspect.isclass(value):
                functions = [f for f in vars(value).values() if inspect.isfunction(f)]
            for function in functions:
                for code in (function.__code__, *_functions_in(function.__code__)):
                    found.setdefault(code_digest(code), f"{module.__name__}.{function.__qualname__}")
    if SINGLE_FILE.is_file():
        for code in _functions_in(compile(SINGLE_FILE.read_text(), str(SINGLE_FILE), "exec", dont_inherit=True)):
            found.setdefault(code_digest(code), f"examples/grpo_single_file.py's {code.co_qualname}")
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False

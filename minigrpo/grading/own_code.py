"""Is the capstone the learner's own code? Read the notebook's cells (their syntax trees) for the package's stages.

The capstone gives a few of the package's names (the model loader, the dataset, the reward functions, the config,
the held-out evaluation and the checks: GIVEN) and asks for everything else from scratch. `stage_function_uses`
lists every other use of the package in the cells:

- an import from minigrpo of anything not given (`from minigrpo import grpo_loss`, `from minigrpo.losses import *`,
  `import minigrpo.rollout`), wherever it sits (inside a function too);
- an attribute chain from an imported minigrpo module (`minigrpo.losses.grpo_loss(...)`, `m.grpo_loss` after
  `import minigrpo as m`) that reaches a name not given;
- a string that names a stage module (`importlib.import_module("minigrpo.losses")`).

It reads source, not run time (the checks' runtime watch, `references.ReferenceWatch`, sees a stage that runs):
a name built from pieces at run time, or the package's source pasted into a cell, is not seen here.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Sequence

GIVEN = {
    "minigrpo": {"GRPOConfig", "load_model_and_tokenizer", "make_arithmetic_dataset", "correctness_reward",
                 "format_reward"},
    "minigrpo.course": {"colab_setup", "describe", "model_name", "steps", "QUICK"},
    "minigrpo.grading": {"held_out_accuracy", "CAPSTONE_LEARNING"},
}  # fmt: skip
"""module -> the names the capstone gives from it (every check_x of minigrpo.grading is given too)."""
STAGE_MODULES = ("rollout", "rewards", "advantages", "logprobs", "losses", "trainer", "dynamic_sampling", "ppo",
                 "ppo_math")  # fmt: skip
_STAGE_STRING = re.compile(r"\bminigrpo\.(" + "|".join(STAGE_MODULES) + r")\b")


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
    from IPython.core.inputtransformer2 import TransformerManager  # turns %magics into plain Python

    transformer, found = TransformerManager(), []
    for number, source in enumerate(cells, start=1):
        try:
            tree = ast.parse(transformer.transform_cell(source))
        except (SyntaxError, ValueError):
            continue  # a cell that does not parse runs nothing
        found += [f"{use} (cell {number})" for use in _uses(tree)]
    return list(dict.fromkeys(found))


def _uses(tree: ast.Module) -> list[str]:
    uses, modules = [], {}  # modules: a local name -> the minigrpo module it is bound to
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
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _STAGE_STRING.search(node.value):
            uses.append(f"the string {node.value!r} (names a stage module of GRPO)")
    for node in ast.walk(tree):
        chain = _chain(node)
        if chain and chain[0] in modules:
            module = modules[chain[0]]
            for attribute in chain[1:]:
                if _is_module(f"{module}.{attribute}"):
                    module = f"{module}.{attribute}"
                    continue
                if not _given(module, attribute):
                    uses.append(_describe(module, attribute))
                break
    return uses


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` -> ['a', 'b', 'c'] for the outermost attribute of a chain (None for anything else)."""
    if not isinstance(node, ast.Attribute):
        return None
    chain, value = [node.attr], node.value
    while isinstance(value, ast.Attribute):
        chain.insert(0, value.attr)
        value = value.value
    return [value.id, *chain] if isinstance(value, ast.Name) else None


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False

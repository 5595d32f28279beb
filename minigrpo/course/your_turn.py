"""A lesson's "your turn": the learner writes an idea's few lines, and a check compares them with the package.

Lessons 01, 02, 02b, 02c, 03, 04, 04b, 07 and 09 each have one, in four cells (tests/test_your_turn.py holds them
to it):

    your-turn-<name>-task    markdown: what to write, in the lesson's symbols
    your-turn-<name>         the learner's function; as committed, its body is `raise NotImplementedError`
    your-turn-<name>-answer  markdown: the worked answer, folded in a <details> block. One click opens it, and it
                             never runs: a code cell would run with "Run all" and replace the learner's function
    your-turn-<name>-check   check_your_turn(...) against the package's function (a # NBVAL_CHECK_OUTPUT cell)

check_your_turn never raises because of the learner's code. Unwritten (NotImplementedError), it says so and the
lesson goes on: nothing after it uses the learner's function. Written, it runs every case on the learner's function
and on the package's, and prints PASS, or per case what differs: the shape, the first value that differs, the
gradient, an exception with the line that raised it, and which known slip the result matches ("the population std").
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable

import torch

NOT_WRITTEN = "not written yet"


def check_your_turn(
    learner: Callable,
    reference: Callable,
    cases: dict[str, tuple | dict],
    against: str | None = None,
    slips: dict[str, Callable] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> None:
    """Compare `learner` with `reference` on each case and print the verdict (nothing is returned or raised).

    cases: name -> the arguments, a tuple (positional) or a dict (keywords); each function gets its own copy of
    the tensors. When the reference's result is a tensor with a gradient, the gradients of the two results' sums
    with respect to the inputs that require one must match too. against: how to name the reference (default: its
    __name__). slips: name -> a function computing a known mistake; a wrong result that equals one is named.
    """
    name = getattr(learner, "__name__", "your function")
    against = against or getattr(reference, "__name__", "the package")
    failures = []
    for case, arguments in cases.items():
        try:
            yours, your_gradients = _run(learner, arguments)
        except NotImplementedError:
            print(
                f"{name} is {NOT_WRITTEN}: replace its `raise NotImplementedError` with your lines, run that cell, "
                "then this one. The worked answer is one click away, just above. Nothing later in the lesson uses it."
            )
            return
        except Exception as error:  # the learner's mistake is feedback, never a traceback
            failures.append(f"{case}: {name} raised {type(error).__name__}: {error}{_where(error, learner)}")
            continue
        expected, gradients = _run(reference, arguments)
        difference = _difference(yours, expected, atol, rtol, _texts(arguments))
        if difference is not None:
            failures.append(f"{case}: {difference}{_slip(yours, slips, arguments)}")
        elif gradients is not None:
            difference = _gradient_difference(your_gradients, gradients, _parameter_names(learner, arguments), atol)
            if difference is not None:
                failures.append(f"{case}: {difference}")
    if not failures:
        print(f"PASS: {name} matches {against} on all {len(cases)} cases ({'; '.join(cases)}).")
        return
    print(f"{name} differs from {against} on {len(failures)} of {len(cases)} cases:")
    for failure in failures:
        print(f"- {failure}")
    print(f"Change {name}, run its cell, then this one again.")


def _fresh(value):
    """A copy of `value` whose tensors the called function may change freely (leaves keep requires_grad)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {key: _fresh(v) for key, v in value.items()}
    return value


def _run(function: Callable, arguments: tuple | dict):
    """function(*arguments) or function(**arguments) on fresh copies: (result, gradients), where gradients are
    d sum(result) / d input for each input that requires a gradient (None when the result carries none)."""
    arguments = _fresh(arguments)
    result = function(**arguments) if isinstance(arguments, dict) else function(*arguments)
    values = arguments.values() if isinstance(arguments, dict) else arguments
    leaves = [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]
    if not (leaves and isinstance(result, torch.Tensor) and result.requires_grad):
        return (result.detach() if isinstance(result, torch.Tensor) else result), None
    gradients = torch.autograd.grad(result.sum(), leaves, allow_unused=True)
    gradients = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, gradients, strict=True)]
    return result.detach(), gradients


def _texts(arguments: tuple | dict) -> list[str] | None:
    """The first argument that is a list of strings (a reward's completions), to name the one whose reward differs."""
    values = arguments.values() if isinstance(arguments, dict) else arguments
    return next((v for v in values if isinstance(v, list) and v and all(isinstance(t, str) for t in v)), None)


def _difference(yours, expected, atol: float = 1e-5, rtol: float = 1e-5, texts: list[str] | None = None) -> str | None:
    """What differs between two results (tensors, numbers or lists of numbers), or None when they match; texts: what
    each entry of a 1-D result belongs to (say, the completions a reward scored), named where they differ."""
    if yours is None:
        return "it returned None: does it end with `return ...`?"
    try:
        mine = torch.as_tensor(yours, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return f"it returned a {type(yours).__name__}, where the package returns numbers"
    theirs = torch.as_tensor(expected, dtype=torch.float64)
    if mine.shape != theirs.shape:
        if not mine.numel() == theirs.numel() == 1:  # one number is one number, whatever its shape
            return f"its result is {_shape(mine)}; the package's is {_shape(theirs)}"
        mine = mine.reshape(theirs.shape)
    close = torch.isclose(mine, theirs, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    at = tuple(int(i) for i in (~close).nonzero()[0]) if close.dim() else ()
    where = f" at {list(at)}" if at else ""
    if texts is not None and len(at) == 1 and len(texts) == close.numel():
        where += f" ({texts[at[0]]!r})"
    count = f" ({int((~close).sum())} of {close.numel()} values differ)" if close.numel() > 1 else ""
    return f"values differ{where}: yours {_number(mine[at].item())}, expected {_number(theirs[at].item())}{count}"


def _number(value: float) -> str:
    """Six decimals, or four significant digits for a small number (a gradient divided by many tokens)."""
    return f"{value:+.4e}" if 0 < abs(value) < 1e-2 else f"{value:+.6f}"


def _slip(yours, slips: dict[str, Callable] | None, arguments: tuple | dict) -> str:
    """'; that is <slip>' when `yours` equals the result of one of the known slips, else ''."""
    for name, function in (slips or {}).items():
        try:
            if _difference(yours, _run(function, arguments)[0]) is None:
                return f"; that is {name}"
        except Exception:  # a slip that cannot run on this case names nothing
            continue
    return ""


def _shape(values: torch.Tensor) -> str:
    return "one number" if values.dim() == 0 else f"a tensor of shape {tuple(values.shape)}"


def _gradient_difference(yours, expected: list, names: list[str], atol: float) -> str | None:
    """What differs between the gradients of the two results, or None when they match."""
    if yours is None:
        return (
            "the values match, but your result carries no gradient back to the inputs: keep it a tensor computed "
            "from them (no .item(), .tolist(), .detach() or torch.tensor(...) on the way)"
        )
    for name, mine, theirs in zip(names, yours, expected, strict=True):
        difference = _difference(mine, theirs, atol)
        if difference is not None:
            return f"the values match, but not the gradient with respect to {name}: " + difference.replace(
                "values differ", "it differs", 1
            )
    return None


def _parameter_names(function: Callable, arguments: tuple | dict) -> list[str]:
    """The names of the arguments that require a gradient, as `function` calls them (else their positions)."""
    if isinstance(arguments, dict):
        return [k for k, v in arguments.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        parameters = []
    return [
        parameters[i] if i < len(parameters) else f"argument {i + 1}"
        for i, v in enumerate(arguments)
        if isinstance(v, torch.Tensor) and v.requires_grad
    ]


def _where(error: Exception, learner: Callable) -> str:
    """' (line N of its cell: <the line>)' for the last line of the learner's own code that the error went through."""
    code = getattr(learner, "__code__", None)
    frames = [f for f in traceback.extract_tb(error.__traceback__) if code and f.filename == code.co_filename]
    if not frames:
        return ""
    line = f": {frames[-1].line.strip()}" if frames[-1].line else ""
    return f" (line {frames[-1].lineno} of its cell{line})"

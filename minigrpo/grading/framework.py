"""The check framework: cases with points, comparisons with hints, time limits, references.

A check is a named list of cases, each worth some points. A case runs the
learner's function and returns normally when it is right, or raises
`Mismatch(hint)` when it is wrong. `run_check` runs every case of a check,
prints one line per case (PASS / FAIL, points, the hint on failure) and
returns the result. It never raises because of the learner's code: an
exception, or a case running past its time limit, is a failed case that shows
the exception's last traceback line.

Each check is registered by name, in one module per exercise
(`minigrpo.grading.checks`): its list of cases with `@cases`, and the function a
notebook calls with `@check` (`minigrpo.grading` exports every one of them)::

    @cases("check_kl_k3", references=[kl_penalty])
    def kl_cases() -> list[Case]: ...

    @check
    def check_kl_k3(kl_k3: Callable) -> CheckResult:
        return run_check("check_kl_k3", kl_k3)

Where the points come from
--------------------------
In a notebook a check runs its cases on the learner's function and prints them:
that is feedback, and the learner's code can change anything in that process.
`python -m minigrpo grade PATH` does not believe it. The check also remembers
the function it was given (`GRADED`), and the grader's judge (a separate
process of the package's own code, `minigrpo.grading.judge`) runs every case
again, computing the expected answers and the points itself, calling the
learner's function in the kernel through `minigrpo.grading.sandbox.remote`. Inside a
notebook run by the grader ($MINIGRPO_GRADING_RUN set) a check therefore only
remembers the function and says so.

A check whose function is (or wraps, or calls) the package's own solution of
the exercise, its `references`, earns 0 with a message saying why
(`minigrpo.grading.references`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from minigrpo.time_limits import time_limit

GRADING_RUN_ENV = "MINIGRPO_GRADING_RUN"
"""Set (to a random token) in the kernels the grader starts: checks there only remember the learner's function."""
CASE_TIMEOUT_S = 20.0
"""Default time limit for one case of a check (the learner's function on one input)."""


# --- results ----------------------------------------------------------------------
@dataclass
class CaseResult:
    name: str
    points: float
    max_points: float
    passed: bool
    message: str = ""


@dataclass
class CheckResult:
    """What one check_* call returns, prints and records."""

    check: str
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def points(self) -> float:
        return sum(case.points for case in self.cases)

    @property
    def max_points(self) -> float:
        return sum(case.max_points for case in self.cases)

    @property
    def passed(self) -> bool:
        return all(case.passed for case in self.cases)

    def to_dict(self) -> dict:
        return {
            "check": self.check,
            "points": self.points,
            "max_points": self.max_points,
            "cases": [asdict(c) for c in self.cases],
        }

    def __repr__(self) -> str:
        return f"CheckResult({self.check}: {format_points(self.points)}/{format_points(self.max_points)})"


class Mismatch(Exception):
    """The learner's answer is wrong; the message is the hint shown to them."""


class CheckTimeout(BaseException):
    """A case ran past its time limit (a BaseException, so `except Exception` in learner code cannot swallow it)."""


class LearnerError(Exception):
    """The learner's function raised in the kernel; `line` is its last traceback line ('ValueError: boom')."""

    def __init__(self, line: str, not_implemented: bool = False):
        super().__init__(line)
        self.line, self.not_implemented = line, not_implemented


class NoAnswer(Exception):
    """The learner's function gave no answer to grade (its kernel died or is stuck, or sent no data): the message."""


class RemoteCallable:
    """Marks a stand-in for the learner's function that runs it in another process (minigrpo.grading.sandbox.remote)."""

    def value_and_gradient(self, wrt: int, *args):
        raise NotImplementedError


@dataclass
class Case:
    """One graded case: `run(learner_function)` returns normally when right (a str it returns is shown beside the
    PASS: what the case measured), raises Mismatch(hint) when wrong."""

    name: str
    points: float
    run: Callable[[Callable], str | None]
    timeout: float = CASE_TIMEOUT_S


# --- the registry -------------------------------------------------------------------
CASES: dict[str, Callable[[], list[Case]]] = {}
"""check name -> a function that lists its cases (cheap: a case does its work only when run)."""
REFERENCES: dict[str, tuple] = {}
"""check name -> the package's own solutions of that exercise: a learner's function that is one earns nothing."""
GRADED: dict[str, object] = {}
"""check name -> what the notebook last passed to that check: the function the grader's judge calls."""
CHECKS: dict[str, Callable[[Callable], CheckResult]] = {}
"""check name -> the check_x function a notebook calls: `from minigrpo.grading import check_x`."""


def cases(name: str, references: Sequence = ()):
    """Register a case builder under the check's name: `@cases("check_x", references=[the package's x])`."""

    def register(builder: Callable[[], list[Case]]) -> Callable[[], list[Case]]:
        CASES[name] = builder
        REFERENCES[name] = tuple(references)
        return builder

    return register


def check(function: Callable[[Callable], CheckResult]) -> Callable[[Callable], CheckResult]:
    """Register the check_x function a notebook calls (its cases: `@cases("check_x")`): `@check def check_x(...)`."""
    name = function.__name__
    if not name.startswith("check_") or name in CHECKS:
        raise ValueError(f"@check {name}: a check's name starts with 'check_' and is registered once.")
    CHECKS[name] = function
    return function


# --- the notebook's source, for checks that read it ---------------------------------------
_JUDGED_CELLS: list[str] | None = None


@contextlib.contextmanager
def judged_cells(cells: Sequence[str]):
    """Within the block, notebook_cells() is `cells`: the code cells the grader's judge read from the notebook."""
    global _JUDGED_CELLS
    previous, _JUDGED_CELLS = _JUDGED_CELLS, list(cells)
    try:
        yield
    finally:
        _JUDGED_CELLS = previous


def notebook_cells() -> list[str] | None:
    """The notebook's code cells: the judge's copy of the file when grading, else the kernel's input history
    (IPython's `In`, every cell run so far); None outside both."""
    if _JUDGED_CELLS is not None:
        return list(_JUDGED_CELLS)
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    history = shell.user_ns.get("In") if shell is not None else None
    return [cell for cell in history if cell] if history else None


# --- running cases ------------------------------------------------------------------
def last_traceback_line(error: BaseException) -> str:
    """'ValueError: boom' — the last line of the traceback, what a learner reads first."""
    return traceback.format_exception_only(type(error), error)[-1].strip()


OUT_OF_TIME = "not run: the notebook's time limit was spent before this case (did an earlier case run long?)"
AFTER_TIMEOUT = "not run: your function ran out of time on an earlier case of this check (an infinite loop?)"


def run_case(case: Case, learner: Callable, deadline: float | None = None) -> CaseResult:
    """Run one case, for at most case.timeout and until `deadline` (time.monotonic(); None: no deadline); any
    exception from the learner's code is a failed case, never a crash."""
    seconds = case.timeout if deadline is None else min(case.timeout, deadline - time.monotonic())
    if seconds <= 0:
        return CaseResult(case.name, 0.0, case.points, False, OUT_OF_TIME)
    try:
        with time_limit(seconds, lambda: CheckTimeout(f"took longer than {seconds:.3g} s")):
            measured = case.run(InputsCopied(learner))
    except Mismatch as wrong:
        return CaseResult(case.name, 0.0, case.points, False, str(wrong))
    except CheckTimeout as slow:
        message = f"timed out: your function {slow} (an infinite loop?)"
        return CaseResult(case.name, 0.0, case.points, False, message)
    except NotImplementedError as error:
        return CaseResult(case.name, 0.0, case.points, False, _not_implemented(last_traceback_line(error)))
    except LearnerError as error:  # raised in the kernel, reported by minigrpo.grading.sandbox.remote
        message = _not_implemented(error.line) if error.not_implemented else f"your code raised {error.line}"
        return CaseResult(case.name, 0.0, case.points, False, message)
    except NoAnswer as error:
        return CaseResult(case.name, 0.0, case.points, False, str(error))
    except Exception as error:
        return CaseResult(case.name, 0.0, case.points, False, f"your code raised {last_traceback_line(error)}")
    return CaseResult(case.name, case.points, case.points, True, measured if isinstance(measured, str) else "")


class InputsCopied:
    """The learner's function as a case calls it: every tensor it is given is a copy, so a function that changes its
    inputs in place (zeroes them, say) never changes the tensors the case computes its expected answers from.

    Tensors are copied inside lists, tuples and dicts too; modules and optimizers are not: a case hands those over
    to be updated (one GRPO step) and compares them with its own reference's copy.
    """

    def __init__(self, learner: Callable):
        self.learner = learner

    def __call__(self, *args, **kwargs):
        return self.learner(*copied(args), **copied(kwargs))

    def value_and_gradient(self, wrt: int, *args):
        return value_and_gradient(self.learner, wrt, *copied(args))


def copied(value):
    """`value` with every tensor in it (in lists, tuples and dicts too) a fresh copy: a leaf that requires grad
    stays one, so a gradient can be taken with respect to the copy."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(copied(item) for item in value) if type(value) in (list, tuple) else value
    if type(value) is dict:
        return {key: copied(item) for key, item in value.items()}
    return value


def _not_implemented(line: str) -> str:
    return f"not implemented yet ({line}): write your solution in place of the raise"


def run_check(name: str, learner: Callable, quiet: bool = False, allow_reference: bool = False) -> CheckResult:
    """Run every case of check `name` on the learner's function and print the results (feedback, not the grade).

    `allow_reference=True` lets the package's own functions through (the package's tests check the checks
    with them); learners' check_x calls never pass it.
    """
    GRADED[name] = learner
    if os.environ.get(GRADING_RUN_ENV):  # the grader's judge runs the cases, outside this process
        if not quiet:
            print(f"{name}: recorded; `python -m minigrpo grade` runs its cases outside the notebook.")
        return CheckResult(name)
    refusal = refusal_reason(name, learner, allow_reference)
    result = evaluate(name, learner, refusal)
    if not quiet:
        print(format_check(result))
    return result


def refusal_reason(name: str, learner, allow_reference: bool = False) -> str | None:
    """Why `learner` earns nothing without running a case: not a function, or the package's own solution."""
    if not callable(learner):
        return f"expected a function, got {type(learner).__name__}: pass the function itself, without calling it"
    if allow_reference:
        return None
    from minigrpo.grading.references import reference_reason  # it imports this module

    return reference_reason(learner, REFERENCES.get(name, ()))


def evaluate(name: str, learner: Callable, refusal: str | None = None, deadline: float | None = None) -> CheckResult:
    """Every case of check `name` on `learner`, by `deadline` (time.monotonic(); the grader's judge sets one);
    with a `refusal`, every case fails with that message instead. After a case that timed out, the later cases
    fail without running (AFTER_TIMEOUT): a function that loops costs one case's time limit, not each case's."""
    builders = CASES[name]()
    if refusal:
        return CheckResult(name, [CaseResult(c.name, 0.0, c.points, False, refusal) for c in builders])
    results = []
    for case in builders:
        if results and results[-1].message.startswith(("timed out", AFTER_TIMEOUT)):  # a loop costs one case's time
            results.append(CaseResult(case.name, 0.0, case.points, False, AFTER_TIMEOUT))
        else:
            results.append(run_case(case, learner, deadline))
    return CheckResult(name, results)


def value_and_gradient(learner: Callable, wrt: int, *args):
    """The learner's result for `args`, and d result.sum() / d args[wrt] (None when the result carries no gradient).

    args[wrt] must require grad. A stand-in for a function in another process computes both there: a graph
    cannot cross processes.
    """
    if isinstance(learner, (RemoteCallable, InputsCopied)):
        return learner.value_and_gradient(wrt, *args)
    value = learner(*args)
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return value, None
    (gradient,) = torch.autograd.grad(value.sum(), args[wrt])
    return value, gradient


def format_check(result: CheckResult) -> str:
    lines = [f"{result.check}: {format_points(result.points)}/{format_points(result.max_points)} points"]
    for case in result.cases:
        status = "PASS" if case.passed else "FAIL"
        lines.append(f"  {status}  {case.name}  [{format_points(case.points)}/{format_points(case.max_points)}]")
        if case.message:
            lines.append(f"        {case.message}")
    if result.passed:
        lines.append("  all cases pass.")
    return "\n".join(lines)


def max_points(name: str) -> float:
    """The check's points: an int when whole (6, not 6.0: the handouts' stamps and the reports print it)."""
    total = sum(case.points for case in CASES[name]())
    return int(total) if float(total).is_integer() else total


DESCRIBE_S = 10.0
"""Time allowed, beside its cases', for asking the kernel what a check was given (the judge's first question)."""


def time_needed(name: str) -> float:
    """The seconds check `name` may take when judged: its cases' own time limits, and the kernel's first answer."""
    return DESCRIBE_S + sum(case.timeout for case in CASES[name]())


def format_points(points: float) -> str:
    """3.0 -> '3', 2.5 -> '2.5'."""
    return f"{points:g}"


# --- comparing answers ----------------------------------------------------------------
def _as_tensor(value, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().double().cpu()
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise Mismatch(f"{what}: expected a tensor, got {type(value).__name__}") from None


def expect_close(
    got,
    want: torch.Tensor,
    *,
    atol: float,
    what: str = "result",
    hint: str = "",
    mistakes: Sequence[tuple[str, torch.Tensor]] = (),
) -> None:
    """Raise Mismatch unless |got - want| <= atol everywhere (same shape, NaN nowhere it should not be).

    `mistakes` are (hint, what a known wrong implementation returns): when the
    learner's answer matches one of them, its hint is shown instead of `hint`.
    """
    got_t, want_t = _as_tensor(got, what), want.detach().double().cpu()
    if got_t.shape != want_t.shape:
        raise Mismatch(f"{what}: expected shape {tuple(want_t.shape)}, got {tuple(got_t.shape)}. {hint}".strip())
    if _close(got_t, want_t, atol):
        return
    for mistake_hint, wrong in mistakes:
        wrong_t = wrong.detach().double().cpu()
        if wrong_t.shape == got_t.shape and _close(got_t, wrong_t, atol):
            raise Mismatch(f"{what} is wrong. Hint: {mistake_hint}")
    if torch.isnan(got_t).any() and not torch.isnan(want_t).any():
        raise Mismatch(f"{what} contains NaN where the answer has none. {hint}".strip())
    error = (got_t - want_t).abs().nan_to_num(nan=math.inf)
    where = tuple(int(i) for i in torch.nonzero(error == error.max())[0]) if error.dim() else ()
    detail = f"max |error| {error.max().item():.3g} > {atol:g}"
    if where:
        detail += f" at index {where} (got {got_t[where].item():.6g}, expected {want_t[where].item():.6g})"
    elif not error.dim():
        detail += f" (got {got_t.item():.6g}, expected {want_t.item():.6g})"
    raise Mismatch(f"{what}: {detail}. {hint}".strip())


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    same_nan = torch.equal(torch.isnan(a), torch.isnan(b))
    return same_nan and bool(((a - b).abs() <= atol)[~torch.isnan(b)].all())


def expect_equal(got, want, *, what: str = "result", hint: str = "") -> None:
    if got != want:
        raise Mismatch(f"{what}: expected {want!r}, got {got!r}. {hint}".strip())


# --- seeded inputs ----------------------------------------------------------------------
_SECRET: bytes | None = None


@contextlib.contextmanager
def drawn_from(secret: bytes):
    """Within the block, every random case draws its inputs from `secret`: `case_seed(n)` is a seed derived from
    both. The grader's judge draws a new secret at every grading (`secrets.token_bytes` in its own process, which
    no learner code reaches), so answers recorded in a notebook, or in another grading, answer other questions."""
    global _SECRET
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("drawn_from(secret): give at least 16 random bytes, e.g. secrets.token_bytes(32).")
    previous, _SECRET = _SECRET, secret
    try:
        yield
    finally:
        _SECRET = previous


def case_seed(seed: int) -> int:
    """The seed a random case uses: `seed` itself outside `drawn_from` (a notebook's feedback, reproducible), else
    HMAC-SHA256(secret, seed) cut to 31 bits (a seed torch, random and the datasets all take)."""
    if _SECRET is None:
        return seed
    digest = hmac.new(_SECRET, str(seed).encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big") >> 1  # [0, 2**31)


def seeded(seed: int) -> torch.Generator:
    """A generator for a random case numbered `seed`: seeded with case_seed(seed)."""
    return torch.Generator().manual_seed(case_seed(seed))


def random_mask(N: int, T: int, generator: torch.Generator, min_length: int = 1) -> torch.Tensor:
    """(N, T) right-padded 0/1 mask: row i is ones for a random length in [min_length, T], then zeros."""
    lengths = torch.randint(min_length, T + 1, (N,), generator=generator)  # (N,)
    return (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()  # (N, T)

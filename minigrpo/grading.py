"""Checks behind the exercises, with points, and the grader that runs them.

A learner's notebook calls a check with the function it wrote::

    from minigrpo.grading import check_group_relative_advantages
    check_group_relative_advantages(group_relative_advantages)

The check runs a list of cases, each worth some points: hand-made inputs with
hand-computed answers, and seeded random inputs compared with the package's
own implementation (the reference), always with an explicit tolerance. It
prints one line per case (PASS / FAIL, points earned, and a hint on failure)
and returns a `CheckResult`. It never raises because of the learner's code:
an exception, or a case running longer than its time limit, is a failed case
that shows the exception's last traceback line.

How the grader collects results (the protocol)
----------------------------------------------
`python -m minigrpo grade PATH` executes each notebook in a fresh kernel of
the current Python (nbclient, `allow_errors=True`, so a cell that raises
NotImplementedError does not stop the check cells after it). It sets the
environment variable MINIGRPO_GRADE_FILE for the kernel; every check appends
one JSON line to that file (`CheckResult.to_dict()`: check, points,
max_points, cases). The last record of a check wins (a re-run replaces it).
A check that the notebook's code cells call (`check_xxx(`) but that never
reported (its cell failed first, or the notebook timed out) scores 0 out of
its maximum, with the reason. Without MINIGRPO_GRADE_FILE (a learner running
the notebook by hand) checks only print. The grader also sets MINIGRPO_QUICK=1
unless it is already set, so the notebooks' training cells stay short.

This is feedback for learners, not a sandbox: the learner's code runs with the
grader's permissions.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

GRADE_FILE_ENV = "MINIGRPO_GRADE_FILE"
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
        return f"CheckResult({self.check}: {_fmt(self.points)}/{_fmt(self.max_points)})"


class Mismatch(Exception):
    """The learner's answer is wrong; the message is the hint shown to them."""


class CheckTimeout(BaseException):
    """A case ran past its time limit (a BaseException, so `except Exception` in learner code cannot swallow it)."""


@dataclass
class Case:
    """One graded case: `run(learner_function)` returns normally when right, raises Mismatch(hint) when wrong."""

    name: str
    points: float
    run: Callable[[Callable], None]
    timeout: float = CASE_TIMEOUT_S


# --- running cases ------------------------------------------------------------------
@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise CheckTimeout in this thread after `seconds` (SIGALRM; no limit where that is unavailable)."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or seconds <= 0:
        yield
        return

    def on_alarm(signum, frame):
        raise CheckTimeout(f"took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def last_traceback_line(error: BaseException) -> str:
    """'ValueError: boom' — the last line of the traceback, what a learner reads first."""
    return traceback.format_exception_only(type(error), error)[-1].strip()


def run_case(case: Case, learner: Callable) -> CaseResult:
    """Run one case; any exception from the learner's code is a failed case, never a crash."""
    try:
        with _time_limit(case.timeout):
            case.run(learner)
    except Mismatch as wrong:
        return CaseResult(case.name, 0.0, case.points, False, str(wrong))
    except CheckTimeout as slow:
        message = f"timed out: your function {slow} (an infinite loop?)"
        return CaseResult(case.name, 0.0, case.points, False, message)
    except NotImplementedError as error:
        message = f"not implemented yet ({last_traceback_line(error)}): write your solution in place of the raise"
        return CaseResult(case.name, 0.0, case.points, False, message)
    except Exception as error:
        return CaseResult(case.name, 0.0, case.points, False, f"your code raised {last_traceback_line(error)}")
    return CaseResult(case.name, case.points, case.points, True)


def run_check(name: str, learner: Callable, quiet: bool = False) -> CheckResult:
    """Run every case of check `name` on the learner's function, print the results and record them."""
    result = CheckResult(name)
    if not callable(learner):
        cases = CASES[name]()
        message = f"expected a function, got {type(learner).__name__}: pass the function itself, without calling it"
        result.cases = [CaseResult(c.name, 0.0, c.points, False, message) for c in cases]
    else:
        result.cases = [run_case(case, learner) for case in CASES[name]()]
    if not quiet:
        print(format_check(result))
    record_result(result)
    return result


def format_check(result: CheckResult) -> str:
    lines = [f"{result.check}: {_fmt(result.points)}/{_fmt(result.max_points)} points"]
    for case in result.cases:
        status = "PASS" if case.passed else "FAIL"
        lines.append(f"  {status}  {case.name}  [{_fmt(case.points)}/{_fmt(case.max_points)}]")
        if case.message:
            lines.append(f"        {case.message}")
    if result.passed:
        lines.append("  all cases pass.")
    return "\n".join(lines)


def record_result(result: CheckResult) -> None:
    """Append the result as one JSON line to $MINIGRPO_GRADE_FILE, when the grader set it."""
    path = os.environ.get(GRADE_FILE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(result.to_dict()) + "\n")


def max_points(name: str) -> float:
    return sum(case.points for case in CASES[name]())


def _fmt(points: float) -> str:
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


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_mask(N: int, T: int, generator: torch.Generator, min_length: int = 1) -> torch.Tensor:
    """(N, T) right-padded 0/1 mask: row i is ones for a random length in [min_length, T], then zeros."""
    lengths = torch.randint(min_length, T + 1, (N,), generator=generator)  # (N,)
    return (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()  # (N, T)


CASES: dict[str, Callable[[], list[Case]]] = {}
"""check name -> a function that lists its cases (cheap: a case does its work only when run)."""


def _cases(name: str):
    def register(builder):
        CASES[name] = builder
        return builder

    return register


# =====================================================================================
# 01 answer extraction and rewards
# =====================================================================================
_EXTRACT_HINT = (
    "return the int inside the LAST <answer>...</answer> tag; without a tag, the last number in the text "
    "(a leading '-' belongs to it); None when there is no number. Use a regex, never eval()."
)


def _extract_cases() -> list[Case]:
    from minigrpo.tasks.arithmetic import extract_answer

    def hand(examples: dict):
        def run(learner):
            for text, want in examples.items():
                expect_equal(learner(text), want, what=f"extract_answer({text!r})", hint=_EXTRACT_HINT)

        return run

    def random_texts(learner):
        rng = random.Random(0)
        pieces = ["<answer>", "</answer>", " ", "so", "=", "-", "+", "The answer is", "x", "\n"]
        for _ in range(300):
            parts = [rng.choice(pieces + [str(rng.randint(-99, 999))] * 4) for _ in range(rng.randint(0, 7))]
            text = "".join(parts)
            expect_equal(learner(text), extract_answer(text), what=f"extract_answer({text!r})", hint=_EXTRACT_HINT)

    tagged = {"<answer>19</answer>": 19, "<answer> -4 </answer>": -4, "12 + 7 = 19, so <answer>19</answer>": 19}
    fallback = {
        "<answer>1</answer> then <answer>2</answer>": 2,
        "12 + 7 = 19": 19,
        "The answer is <answer>19": 19,
        "<answer>nineteen</answer>": None,
        "<answer>__import__('os').getcwd()</answer>": None,
        "": None,
    }
    return [
        Case("tagged answers (hand-made)", 1, hand(tagged)),
        Case("last tag wins, else the last number, else None (hand-made)", 1, hand(fallback)),
        Case("300 random texts vs the reference (seed 0)", 1, random_texts),
    ]


_REWARD_HINT = "2 = well-formed and correct, 1 = well-formed but wrong, 0 = not well-formed (see the instructions)."


def _call_reward(learner, completions: list[str], answers: list[str]) -> list[float]:
    prompts = ["What is it?"] * len(completions)
    values = learner(prompts=prompts, completions=completions, completion_ids=None, answer=answers)
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise Mismatch(f"expected a list of floats, one per completion, got {values!r}") from None


def _random_completions(seed: int, n: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    completions, answers = [], []
    for _ in range(n):
        answer = rng.randint(0, 198)
        guess = rng.choice([answer, answer, answer + rng.randint(1, 9), -answer])
        template = rng.choice(
            [
                "<answer>{g}</answer>",
                "<answer> {g} </answer>\n",
                "{g}",
                "It is {g}. <answer>{g}</answer>",
                "<answer>{g}",
                "<answer>{g}</answer> done",
                "<answer>{g}</answer><answer>{a}</answer>",
                "<answer>x{g}</answer>",
                "<answer>{g}</answer>  ",
            ]
        )
        completions.append(template.format(g=guess, a=answer))
        answers.append(str(answer))
    return completions, answers


def _graded_reward_cases() -> list[Case]:
    from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_ANSWER, WORKED_EXAMPLE_COMPLETIONS, graded_reward

    def worked_example(learner):
        got = _call_reward(learner, WORKED_EXAMPLE_COMPLETIONS, [WORKED_EXAMPLE_ANSWER] * 8)
        want = [2.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 1.0]
        for text, g, w in zip(WORKED_EXAMPLE_COMPLETIONS, got, want, strict=True):
            expect_equal(g, w, what=f"reward of {text!r} (answer 19)", hint=_REWARD_HINT)

    def random_cases(learner):
        completions, answers = _random_completions(1, 200)
        got = _call_reward(learner, completions, answers)
        want = graded_reward(None, completions, None, answer=answers)
        for text, answer, g, w in zip(completions, answers, got, want, strict=True):
            expect_equal(g, w, what=f"reward of {text!r} (answer {answer})", hint=_REWARD_HINT)

    return [
        Case("the worked example: 8 answers to 12 + 7, rewards 2/1/0", 2, worked_example),
        Case("200 random completions vs the reference (seed 1)", 1, random_cases),
    ]


HACKS = {
    "hedging": ["<answer>18</answer><answer>19</answer>", "<answer>19</answer> or <answer>20</answer>"],
    "spam": ["17 18 19 20 21", "<answer>19</answer> just kidding, it is 20", "<answer>19</answer>19191919"],
}


def _reward_hacking_cases() -> list[Case]:
    def no_reward_for(kind: str):
        def run(learner):
            honest = _call_reward(learner, ["<answer>19</answer>"], ["19"])[0]
            expect_equal(honest, 2.0, what="reward of the honest '<answer>19</answer>'", hint=_REWARD_HINT)
            for text in HACKS[kind]:
                got = _call_reward(learner, [text], ["19"])[0]
                expect_equal(
                    got,
                    0.0,
                    what=f"reward of the hack {text!r}",
                    hint="a completion with more than one <answer> tag, or anything after the tag, is not "
                    "well-formed: it must score 0, or the policy learns to hedge.",
                )

        return run

    return [
        Case("hedging with several tags earns nothing", 1, no_reward_for("hedging")),
        Case("number spam and text after the tag earn nothing", 1, no_reward_for("spam")),
    ]


_cases("check_extract_answer")(_extract_cases)
_cases("check_graded_reward")(_graded_reward_cases)
_cases("check_reward_hacking")(_reward_hacking_cases)


def check_extract_answer(extract_answer: Callable[[str], int | None]) -> CheckResult:
    """Exercise 01: extract_answer(text) -> int | None, against minigrpo.tasks.arithmetic.extract_answer."""
    return run_check("check_extract_answer", extract_answer)


def check_graded_reward(graded_reward: Callable) -> CheckResult:
    """Exercise 01: the 2/1/0 reward with TRL's signature, against minigrpo.tasks.arithmetic.graded_reward."""
    return run_check("check_graded_reward", graded_reward)


def check_reward_hacking(graded_reward: Callable) -> CheckResult:
    """Exercise 01: hedging (several tags) and spam must not be rewarded; the honest answer still gets 2."""
    return run_check("check_reward_hacking", graded_reward)


# =====================================================================================
# 02 group-relative advantages
# =====================================================================================
WORKED_EXAMPLE_REWARDS = [2.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 1.0]


def _advantage_mistakes(grouped: torch.Tensor, eps: float) -> list[tuple[str, torch.Tensor]]:
    centred = grouped - grouped.mean(1, keepdim=True)  # (B, G)
    constant = (grouped.max(1).values == grouped.min(1).values).unsqueeze(1)  # (B, 1)
    fix = lambda a: torch.where(constant, torch.zeros_like(a), a)  # noqa: E731
    return [
        (
            "you used the population std (ddof=0, numpy's default); GRPO's std is Bessel-corrected: "
            "torch.std(..., correction=1), torch's default.",
            fix(centred / (grouped.std(1, keepdim=True, correction=0) + eps)),
        ),
        ("add eps to the std: (r - mean) / (std + eps).", fix(centred / grouped.std(1, keepdim=True))),
        (
            "you divided by the std of the whole batch; GRPO uses each group's own std (dim=1, keepdim=True).",
            fix(centred / (grouped.std() + eps)),
        ),
        (
            "you subtracted the mean of the whole batch; the baseline is each group's own mean.",
            fix((grouped - grouped.mean()) / (grouped.std(1, keepdim=True) + eps)),
        ),
    ]


def _advantage_cases() -> list[Case]:
    from minigrpo.advantages import group_relative_advantages as reference

    def compare(grouped: torch.Tensor, eps: float, atol: float = 1e-5):
        def run(learner):
            got = learner(grouped.clone(), eps=eps)
            want = reference(grouped, "group", "mean", 1, eps)
            expect_close(
                got,
                want,
                atol=atol,
                what=f"advantages of {tuple(grouped.shape)} rewards",
                hint="A = (r - mean(r)) / (std(r) + eps) within each row (group).",
                mistakes=_advantage_mistakes(grouped, eps),
            )

        return run

    def worked_example(learner):
        got = learner(torch.tensor([WORKED_EXAMPLE_REWARDS]), eps=1e-4)
        a2, a1, a0 = 1.347914, 0.149768, -1.048378  # hand-computed: std = 0.834523 (Bessel)
        want = torch.tensor([[a2, a1, a0, a2, a0, a1, a0, a1]])
        grouped = torch.tensor([WORKED_EXAMPLE_REWARDS])
        expect_close(
            got,
            want,
            atol=1e-5,
            what="advantages of the worked example",
            hint="A = (r - mean(r)) / (std(r) + eps).",
            mistakes=_advantage_mistakes(grouped, 1e-4),
        )

    g = _seeded(2)
    random_groups = torch.randint(0, 3, (6, 8), generator=g).float()  # (B, G) = (6, 8)
    random_groups[0] = torch.rand(8, generator=g)
    constant = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    pairs = torch.randn(3, 2, generator=_seeded(3))  # G = 2
    return [
        Case("the worked example (rewards 2/1/0, hand-computed)", 1, worked_example),
        Case("random groups, B=6 G=8 (seed 2)", 1, compare(random_groups, 1e-4)),
        Case("groups whose rewards are all equal get 0, not NaN (eps=0)", 1, compare(constant, 0.0)),
        Case("G=2, eps=1e-2 (seed 3)", 1, compare(pairs, 1e-2)),
    ]


def _rloo_cases() -> list[Case]:
    from minigrpo.advantages import group_baseline

    def compare(grouped: torch.Tensor, what: str):
        def run(learner):
            got = learner(grouped.clone())
            want = grouped - group_baseline(grouped, "rloo")
            wrong = [
                (
                    "that is the GRPO mean baseline; RLOO leaves r_i out of its own baseline.",
                    grouped - grouped.mean(1, keepdim=True),
                )
            ]
            hint = "A_i = r_i - mean of the other G - 1 rewards = r_i - (sum(r) - r_i) / (G - 1)."
            expect_close(got, want, atol=1e-5, what=what, hint=hint, mistakes=wrong)

        return run

    return [
        Case(
            "the worked example", 1, compare(torch.tensor([WORKED_EXAMPLE_REWARDS]), "RLOO advantages (worked example)")
        ),
        Case("random groups, B=5 G=4 (seed 4)", 1, compare(torch.randn(5, 4, generator=_seeded(4)), "RLOO advantages")),
    ]


_cases("check_group_relative_advantages")(_advantage_cases)
_cases("check_rloo_advantages")(_rloo_cases)


def check_group_relative_advantages(group_relative_advantages: Callable) -> CheckResult:
    """Exercise 02: group_relative_advantages(grouped_rewards (B, G), eps) -> (B, G)."""
    return run_check("check_group_relative_advantages", group_relative_advantages)


def check_rloo_advantages(rloo_advantages: Callable) -> CheckResult:
    """Exercise 02: rloo_advantages(grouped_rewards (B, G)) -> (B, G)."""
    return run_check("check_rloo_advantages", rloo_advantages)


# =====================================================================================
# 03 masked mean and per-token log-probs
# =====================================================================================
def _masked_mean_cases() -> list[Case]:
    from minigrpo.logprobs import masked_mean as reference

    def mistakes(values, mask, dim):
        total = (lambda x: x.sum()) if dim is None else (lambda x: x.sum(dim))  # noqa: E731
        selected = torch.where(mask.bool(), values, torch.zeros_like(values))
        count = total(mask.float())
        return [
            (
                "divide by the number of 1s in the mask, not by T: padding must not count.",
                total(selected) / (values.numel() if dim is None else values.shape[dim]),
            ),
            (
                "values * mask is NaN where a masked value is NaN or inf (0 * inf = NaN): select with "
                "torch.where(mask.bool(), values, 0) instead of multiplying.",
                total(values * mask) / count.clamp(min=1),
            ),
            ("a row with an empty mask must give 0, not NaN: clamp the count to at least 1.", total(selected) / count),
        ]

    def compare(values, mask, dims, what):
        def run(learner):
            for dim in dims:
                got = (
                    learner(values.clone(), mask.clone())
                    if dim is None
                    else learner(values.clone(), mask.clone(), dim=dim)
                )
                want = reference(values, mask, dim)
                hint = "sum over mask == 1 divided by the count of 1s (per row for dim=1)."
                expect_close(
                    got, want, atol=1e-6, what=f"{what}, dim={dim}", hint=hint, mistakes=mistakes(values, mask, dim)
                )

        return run

    def hand(learner):
        values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
        expect_close(
            learner(values, mask),
            torch.tensor(7 / 3),
            atol=1e-6,
            what="masked_mean over everything",
            hint="(1 + 2 + 4) / 3.",
        )
        expect_close(
            learner(values, mask, dim=1),
            torch.tensor([1.5, 4.0]),
            atol=1e-6,
            what="masked_mean, dim=1",
            hint="row means over the mask: [1.5, 4.0].",
        )

    g = _seeded(5)
    values = torch.randn(6, 7, generator=g)
    mask = _random_mask(6, 7, g)
    nasty = torch.randn(4, 5, generator=g)
    nasty_mask = _random_mask(4, 5, g)
    nasty_mask[2] = 0  # an empty row
    nasty[nasty_mask == 0] = float("nan")
    nasty[0, -1], nasty_mask[0, -1] = float("inf"), 0
    return [
        Case("hand-made: (1 + 2 + 4) / 3 and row means", 1, hand),
        Case(
            "random (6, 7) values, right-padded mask (seed 5), dim None / 1",
            1,
            compare(values, mask, [None, 1], "random"),
        ),
        Case(
            "NaN and inf under the mask are ignored; an empty row gives 0",
            1,
            compare(nasty, nasty_mask, [None, 1], "padding full of NaN"),
        ),
    ]


def _logps_reference(logits: torch.Tensor, input_ids: torch.Tensor, T: int) -> torch.Tensor:
    """log softmax(logits at position t - 1)[token t] for the last T tokens. (N, L, V), (N, L) -> (N, T)."""
    log_probs = torch.log_softmax(logits[:, -T - 1 : -1].double(), dim=-1)  # (N, T, V)
    return log_probs.gather(-1, input_ids[:, -T:].unsqueeze(-1)).squeeze(-1)  # (N, T)


def _logps_mistakes(logits, input_ids, T):
    labels = input_ids[:, -T:].unsqueeze(-1)  # (N, T, 1)
    same_position = torch.log_softmax(logits[:, -T:].double(), -1).gather(-1, labels).squeeze(-1)
    return [
        (
            "off by one: the logits at position t predict token t + 1, so completion token t is scored by "
            "logits[:, P - 1 + t], i.e. logits[:, -T - 1 : -1], not logits[:, -T:].",
            same_position,
        ),
        (
            "you gathered raw logits: apply log_softmax over the vocabulary first.",
            logits[:, -T - 1 : -1].double().gather(-1, labels).squeeze(-1),
        ),
        (
            "you returned probabilities, not log-probabilities: use log_softmax, not softmax.",
            torch.softmax(logits[:, -T - 1 : -1].double(), -1).gather(-1, labels).squeeze(-1),
        ),
    ]


def _logps_cases() -> list[Case]:
    def compare(N, L, V, T, seed, what):
        def run(learner):
            g = _seeded(seed)
            logits = torch.randn(N, L, V, generator=g) * 3
            input_ids = torch.randint(0, V, (N, L), generator=g)
            got = learner(logits.clone(), input_ids.clone(), T)
            hint = "gather log_softmax(logits[:, -T - 1 : -1]) at input_ids[:, -T:]."
            want = _logps_reference(logits, input_ids, T)
            expect_close(got, want, atol=1e-5, what=what, hint=hint, mistakes=_logps_mistakes(logits, input_ids, T))

        return run

    def gradient(learner):
        g = _seeded(8)
        logits = (torch.randn(3, 6, 5, generator=g) * 2).requires_grad_()
        input_ids = torch.randint(0, 5, (3, 6), generator=g)
        got = learner(logits, input_ids, 4)
        if not isinstance(got, torch.Tensor) or not got.requires_grad:
            raise Mismatch("the result carries no gradient: do not call .detach(), .item() or torch.no_grad() inside.")
        (got_grad,) = torch.autograd.grad(got.sum(), logits)
        reference_logits = logits.detach().requires_grad_()
        (want_grad,) = torch.autograd.grad(_logps_reference(reference_logits, input_ids, 4).sum(), reference_logits)
        expect_close(
            got_grad,
            want_grad,
            atol=1e-5,
            what="d sum(logps) / d logits",
            hint="the gradient must reach exactly the positions that score each token.",
        )

    return [
        Case("hand-sized: N=1, L=3, V=3, T=2 (seed 6)", 1, compare(1, 3, 3, 2, 6, "log-probs (N=1, L=3, T=2)")),
        Case("random: N=4, L=9, V=11, T=5 (seed 7)", 2, compare(4, 9, 11, 5, 7, "log-probs (N=4, L=9, T=5)")),
        Case("gradients flow to the right logits (seed 8)", 1, gradient),
    ]


_cases("check_masked_mean")(_masked_mean_cases)
_cases("check_per_token_logps")(_logps_cases)


def check_masked_mean(masked_mean: Callable) -> CheckResult:
    """Exercise 03: masked_mean(values (N, T), mask (N, T), dim=None) -> scalar or (N,)."""
    return run_check("check_masked_mean", masked_mean)


def check_per_token_logps(per_token_logps_from_logits: Callable) -> CheckResult:
    """Exercise 03: per_token_logps_from_logits(logits (N, L, V), input_ids (N, L), T) -> (N, T)."""
    return run_check("check_per_token_logps", per_token_logps_from_logits)


# =====================================================================================
# 04 the clipped surrogate
# =====================================================================================
def _surrogate_mistakes(ratio, advantages, low, high):
    A = advantages.unsqueeze(1)  # (N, 1)
    clipped = torch.clamp(ratio, 1 - low, 1 + high) * A
    return [
        ("use min(rho * A, clip(rho) * A), not max: the surrogate is pessimistic.", torch.max(ratio * A, clipped)),
        ("you returned only the clipped term; take the min with the unclipped rho * A.", clipped),
        ("you returned only rho * A: clip the ratio to [1 - epsilon_low, 1 + epsilon_high].", ratio * A),
        (
            "epsilon_low and epsilon_high are swapped: the ratio is clipped to [1 - low, 1 + high].",
            torch.min(ratio * A, torch.clamp(ratio, 1 - high, 1 + low) * A),
        ),
        (
            "the surrogate is maximised: return +min(...), the loss adds the minus sign later.",
            -torch.min(ratio * A, clipped),
        ),
    ]


def _surrogate_cases() -> list[Case]:
    from minigrpo.losses import clipped_surrogate as reference

    def compare(ratio, advantages, low, high, what):
        def run(learner):
            got = learner(ratio.clone(), advantages.clone(), low, high)
            want = reference(ratio, advantages, low, high)
            hint = "min(rho * A, clip(rho, 1 - epsilon_low, 1 + epsilon_high) * A), with A (N,) broadcast over T."
            expect_close(
                got, want, atol=1e-6, what=what, hint=hint, mistakes=_surrogate_mistakes(ratio, advantages, low, high)
            )

        return run

    def hand(learner):
        ratio = torch.tensor([[0.5, 0.9, 1.0, 1.1, 1.5], [0.5, 0.9, 1.0, 1.1, 1.5]])  # (N, T) = (2, 5)
        advantages = torch.tensor([1.0, -1.0])
        want = torch.tensor([[0.5, 0.9, 1.0, 1.1, 1.2], [-0.8, -0.9, -1.0, -1.1, -1.5]])  # by hand, eps = 0.2
        got = learner(ratio, advantages, 0.2, 0.2)
        expect_close(
            got,
            want,
            atol=1e-6,
            what="surrogate of the hand-made table",
            hint="A > 0: capped at (1 + eps) A; A < 0: capped at (1 - eps) A.",
            mistakes=_surrogate_mistakes(ratio, advantages, 0.2, 0.2),
        )

    def gradient(learner):
        g = _seeded(10)
        ratio = torch.exp(torch.randn(4, 6, generator=g) * 0.3).requires_grad_()
        advantages = torch.randn(4, generator=g)
        got = learner(ratio, advantages, 0.2, 0.28)
        if not isinstance(got, torch.Tensor) or not got.requires_grad:
            raise Mismatch("the surrogate carries no gradient: keep it a differentiable function of the ratio.")
        (got_grad,) = torch.autograd.grad(got.sum(), ratio)
        r = ratio.detach().requires_grad_()
        (want_grad,) = torch.autograd.grad(reference(r, advantages, 0.2, 0.28).sum(), r)
        expect_close(
            got_grad,
            want_grad,
            atol=1e-6,
            what="d surrogate / d ratio",
            hint="the gradient is A where the min picks rho * A and 0 where the clipped term wins.",
        )

    g = _seeded(9)
    ratio = torch.exp(torch.randn(5, 7, generator=g) * 0.4)
    advantages = torch.randn(5, generator=g)
    return [
        Case("hand-made table: rho in 0.5..1.5, A = +1 / -1, eps 0.2", 1, hand),
        Case(
            "random (5, 7) ratios, symmetric eps 0.2 (seed 9)",
            1,
            compare(ratio, advantages, 0.2, 0.2, "surrogate, eps 0.2"),
        ),
        Case(
            "clip-higher: eps_low 0.2, eps_high 0.28 (seed 9)",
            1,
            compare(ratio, advantages, 0.2, 0.28, "surrogate, eps 0.2 / 0.28"),
        ),
        Case("gradient is 0 exactly where the clip is active (seed 10)", 1, gradient),
    ]


_cases("check_clipped_surrogate")(_surrogate_cases)


def check_clipped_surrogate(clipped_surrogate: Callable) -> CheckResult:
    """Exercise 04: clipped_surrogate(ratio (N, T), advantages (N,), epsilon_low, epsilon_high) -> (N, T)."""
    return run_check("check_clipped_surrogate", clipped_surrogate)


# =====================================================================================
# 05 the k3 KL estimator
# =====================================================================================
def _kl_mistakes(logps, ref):
    log_r = ref - logps
    return [
        ("the ratio is pi_ref / pi_theta (log_r = ref - logp), not pi_theta / pi_ref.", torch.exp(-log_r) + log_r - 1),
        ("that is k1 = -log_r; k3 = exp(log_r) - log_r - 1.", -log_r),
        ("that is k2 = log_r^2 / 2; k3 = exp(log_r) - log_r - 1.", 0.5 * log_r**2),
        ("you forgot the - 1: k3 is 0 when pi_theta == pi_ref.", torch.exp(log_r) - log_r),
    ]


def _kl_cases() -> list[Case]:
    from minigrpo.losses import kl_penalty

    def hand(learner):
        logps = torch.log(torch.tensor([[0.5, 0.5, 0.25]]))
        ref = torch.log(torch.tensor([[0.5, 0.25, 0.5]]))
        want = torch.tensor([[0.0, 0.5 - math.log(0.5) - 1, 2.0 - math.log(2.0) - 1]])  # 0, 0.193147, 0.306853
        expect_close(
            learner(logps, ref),
            want,
            atol=1e-6,
            what="k3 of the hand-made tokens",
            hint="k3 = r - log r - 1 with r = pi_ref / pi_theta.",
            mistakes=_kl_mistakes(logps, ref),
        )

    def random_case(learner):
        g = _seeded(11)
        logps, ref = -torch.rand(6, 9, generator=g) * 4, -torch.rand(6, 9, generator=g) * 4
        want = kl_penalty(logps, ref, "k3")
        expect_close(
            learner(logps.clone(), ref.clone()),
            want,
            atol=1e-5,
            what="k3 of random log-probs",
            hint="k3 = exp(log_r) - log_r - 1, log_r = ref - logp.",
            mistakes=_kl_mistakes(logps, ref),
        )

    def gradient(learner):
        g = _seeded(12)
        logps = (-torch.rand(3, 5, generator=g) * 3).requires_grad_()
        ref = -torch.rand(3, 5, generator=g) * 3
        got = learner(logps, ref)
        if not isinstance(got, torch.Tensor) or not got.requires_grad:
            raise Mismatch("the KL carries no gradient: keep it a differentiable function of per_token_logps.")
        (got_grad,) = torch.autograd.grad(got.sum(), logps)
        want_grad = 1 - torch.exp(ref - logps.detach())  # d/dlogp [exp(ref - logp) - (ref - logp) - 1]
        expect_close(
            got_grad, want_grad, atol=1e-5, what="d k3 / d logp", hint="d k3 / d logp = 1 - pi_ref / pi_theta."
        )

    return [
        Case("hand-made: equal -> 0; r = 1/2 -> 0.193147; r = 2 -> 0.306853", 1, hand),
        Case("random (6, 9) log-probs vs the reference (seed 11)", 1, random_case),
        Case("gradient 1 - pi_ref / pi_theta (seed 12)", 1, gradient),
    ]


_cases("check_kl_k3")(_kl_cases)


def check_kl_k3(kl_k3: Callable) -> CheckResult:
    """Exercise 05: kl_k3(per_token_logps (N, T), ref_per_token_logps (N, T)) -> (N, T)."""
    return run_check("check_kl_k3", kl_k3)


# =====================================================================================
# 06 loss aggregation
# =====================================================================================
_AGGREGATION_HINTS = {
    "grpo": "grpo: average each sequence over its own tokens first, then average over the N sequences.",
    "dapo": "dapo: one token-level mean, sum over all unmasked tokens / their number.",
    "dr_grpo": "dr_grpo: sum over all unmasked tokens / the constant N * max_completion_length.",
}


def _aggregation_mistakes(loss, mask, Tmax):
    selected = torch.where(mask.bool(), loss, torch.zeros_like(loss))
    return [
        (
            "that is the token-level mean (DAPO / BNPO); GRPO averages each sequence first, then the sequences.",
            selected.sum() / mask.sum(),
        ),
        (
            "that is the per-sequence mean (GRPO); DAPO is one mean over all the batch's tokens.",
            (selected.sum(1) / mask.sum(1)).mean(),
        ),
        (
            "Dr. GRPO's normaliser is the constant N * max_completion_length, not the number of tokens.",
            selected.sum() / mask.sum(),
        ),
        ("the padding counted: use only tokens where completion_mask == 1.", loss.mean()),
        (
            "the padding counted in the per-sequence means: divide each row by its own mask sum.",
            (selected.sum(1) / loss.shape[1]).mean(),
        ),
        ("Dr. GRPO divides by N * max_completion_length, not by N * T of this batch.", selected.sum() / loss.numel()),
    ]


def _aggregation_cases() -> list[Case]:
    from minigrpo.losses import aggregate_loss

    def compare(loss, mask, loss_type, Tmax, want=None, what=""):
        def run(learner):
            got = learner(loss.clone(), mask.clone(), loss_type, Tmax)
            expected = aggregate_loss(loss, mask, loss_type, Tmax) if want is None else want
            expect_close(
                got,
                expected,
                atol=1e-6,
                what=f"{loss_type} loss {what}".strip(),
                hint=_AGGREGATION_HINTS[loss_type],
                mistakes=_aggregation_mistakes(loss, mask, Tmax),
            )

        return run

    hand_loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 100.0, 100.0, 100.0]])  # 100 = padding garbage
    hand_mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    g = _seeded(13)
    loss = torch.randn(6, 8, generator=g)
    mask = _random_mask(6, 8, g)
    cases = []
    for loss_type, want in (("grpo", 2.5), ("dapo", 1.6), ("dr_grpo", 1.0)):
        cases.append(
            Case(
                f"{loss_type}: hand-made, lengths 4 and 1 -> {want}",
                1,
                compare(hand_loss, hand_mask, loss_type, 4, torch.tensor(want), "(hand-made)"),
            )
        )
        cases.append(
            Case(
                f"{loss_type}: random (6, 8), max_completion_length 10 (seed 13)",
                1,
                compare(loss, mask, loss_type, 10, None, "(random)"),
            )
        )
    return cases


_cases("check_aggregate_loss")(_aggregation_cases)


def check_aggregate_loss(aggregate_loss: Callable) -> CheckResult:
    """Exercise 06: aggregate_loss(per_token_loss (N, T), completion_mask (N, T), loss_type, max_completion_length)."""
    return run_check("check_aggregate_loss", aggregate_loss)


# =====================================================================================
# 07 GAE for PPO
# =====================================================================================
def _gae_mistakes(rewards, values, mask, gamma, lam):
    from minigrpo.ppo import compute_gae

    N, T = values.shape
    advantages = torch.zeros_like(values)
    running = torch.zeros(N, dtype=values.dtype)
    for t in reversed(range(T)):  # the value after the last token taken from the padding
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros(N, dtype=values.dtype)
        running = (rewards[:, t] * mask[:, t] + gamma * next_value - values[:, t]) + gamma * lam * running
        advantages[:, t] = running
    leak = advantages * mask
    no_lam = compute_gae(rewards, values, mask, gamma, 1.0)
    td = compute_gae(rewards, values, mask, gamma, 0.0)
    return [
        (
            "the state after the last real token is terminal: its value must be 0 (zero the padding's values first).",
            leak,
        ),
        ("you left lam out: A_t = delta_t + gamma * lam * A_{t+1}.", no_lam[0]),
        (
            "that is only the one-step TD error delta_t; accumulate A_t = delta_t + gamma * lam * A_{t+1} backwards.",
            td[0],
        ),
    ]


def _gae_cases() -> list[Case]:
    from minigrpo.ppo import compute_gae

    def hand(learner):
        rewards, values, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3)
        advantages, returns = learner(rewards, values, mask, gamma=1.0, lam=0.95)
        # delta = [0.1, 0.1, 0.3]; A_2 = 0.3, A_1 = 0.1 + 0.95 * 0.3, A_0 = 0.1 + 0.95 * A_1
        want = torch.tensor([[0.46575, 0.385, 0.3]])
        expect_close(
            advantages,
            want,
            atol=1e-6,
            what="advantages (hand-made)",
            hint="A_t = delta_t + gamma * lam * A_{t+1}, from the end backwards.",
            mistakes=_gae_mistakes(rewards, values, mask, 1.0, 0.95),
        )
        expect_close(
            returns,
            want + values,
            atol=1e-6,
            what="returns (hand-made)",
            hint="returns R_t = A_t + V(s_t), the critic's target.",
        )

    def compare(seed, gamma, lam, what):
        def run(learner):
            g = _seeded(seed)
            rewards, values = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
            mask = _random_mask(5, 7, g)
            got_a, got_r = learner(rewards.clone(), values.clone(), mask.clone(), gamma=gamma, lam=lam)
            want_a, want_r = compute_gae(rewards, values, mask, gamma=gamma, lam=lam)
            hint = "zero the padding, set V after the last real token to 0, then A_t = delta_t + gamma lam A_{t+1}."
            expect_close(
                got_a,
                want_a,
                atol=1e-5,
                what=f"advantages ({what})",
                hint=hint,
                mistakes=_gae_mistakes(rewards, values, mask, gamma, lam),
            )
            expect_close(
                got_r, want_r, atol=1e-5, what=f"returns ({what})", hint="returns = advantages + values, 0 on padding."
            )

        return run

    def limits(learner):
        g = _seeded(16)
        rewards, values = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
        mask = torch.ones(3, 4)
        monte_carlo = rewards.flip(1).cumsum(1).flip(1) - values  # lam = 1, gamma = 1: sum of future rewards - V
        expect_close(
            learner(rewards, values, mask, gamma=1.0, lam=1.0)[0],
            monte_carlo,
            atol=1e-5,
            what="advantages at lam = 1",
            hint="lam = 1 gives the Monte-Carlo return minus V.",
        )
        td = rewards + torch.cat([values[:, 1:], torch.zeros(3, 1)], 1) - values  # lam = 0: one-step TD error
        expect_close(
            learner(rewards, values, mask, gamma=1.0, lam=0.0)[0],
            td,
            atol=1e-5,
            what="advantages at lam = 0",
            hint="lam = 0 gives the TD error r_t + V(s_{t+1}) - V(s_t).",
        )

    return [
        Case("hand-made: one completion of 3 tokens, gamma 1, lam 0.95", 2, hand),
        Case("random right-padded batch, gamma 1, lam 0.95 (seed 14)", 1, compare(14, 1.0, 0.95, "gamma 1, lam 0.95")),
        Case("random right-padded batch, gamma 0.9, lam 0.8 (seed 15)", 1, compare(15, 0.9, 0.8, "gamma 0.9, lam 0.8")),
        Case("limits: lam = 1 is Monte-Carlo, lam = 0 is TD(0) (seed 16)", 1, limits),
    ]


_cases("check_compute_gae")(_gae_cases)


def check_compute_gae(compute_gae: Callable) -> CheckResult:
    """Exercise 07: compute_gae(rewards, values, mask, gamma, lam) -> (advantages, returns), all (N, T)."""
    return run_check("check_compute_gae", compute_gae)


@contextlib.contextmanager
def single_thread():
    """torch on one thread for the tiny model: its ops are too small to gain from threads, and threads spin
    badly when the CPUs are shared (a notebook, a test suite and a grader at once)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# =====================================================================================
# 08 one full GRPO step on the tiny model
# =====================================================================================
_TINY_CACHE: dict = {}


def tiny_model_and_tokenizer():
    """A fresh copy of the bundled tiny Qwen (loaded once per process, then deep-copied)."""
    from minigrpo.models import load_model_and_tokenizer

    if "model" not in _TINY_CACHE:
        _TINY_CACHE["model"], _TINY_CACHE["tokenizer"] = load_model_and_tokenizer("tiny", device="cpu")
    return copy.deepcopy(_TINY_CACHE["model"]), _TINY_CACHE["tokenizer"]


def small_grpo_config(output_dir: str, **overrides):
    """4 prompts x G=4 on the tiny Qwen, one micro-batch: a GRPO step in a fraction of a second."""
    from minigrpo.config import GRPOConfig

    preset = dict(
        prompts_per_step=4,
        num_generations=4,
        per_device_train_batch_size=16,
        max_steps=1,
        eval_steps=0,
        save_steps=0,
        reward_weights=[1.0, 0.1],
        output_dir=output_dir,
    )
    return GRPOConfig.tiny_cpu(**{**preset, **overrides})


def reference_grpo_steps(model, tokenizer, batches: list[dict], config, seeds: list[int]) -> tuple[list[dict], object]:
    """The package's GRPO step (GRPOTrainer.optimize) on each batch in turn; returns its metrics and the trainer."""
    from minigrpo.models import make_reference_model
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset
    from minigrpo.trainer import GRPOTrainer

    ref_model = make_reference_model(model) if config.beta != 0 else None
    dataset = make_arithmetic_dataset(16, "train", seed=0)
    trainer = GRPOTrainer(model, tokenizer, [correctness_reward, format_reward], dataset, config, ref_model=ref_model)
    results = []
    for batch, seed in zip(batches, seeds, strict=True):
        rollout, rewards = _seeded_rollout(model, tokenizer, batch, config, ref_model, seed)
        metrics = trainer.optimize(rollout, rewards)
        results.append({"loss": metrics["loss"], "reward": rewards.mean().item(), "grad_norm": metrics["grad_norm"]})
    return results, trainer


def _seeded_rollout(model, tokenizer, batch, config, ref_model, seed):
    from minigrpo.rewards import compute_rewards
    from minigrpo.rollout import repeat_for_group, sample_group_rollout
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward

    torch.manual_seed(seed)
    rollout = sample_group_rollout(model, tokenizer, batch["prompt"], config, ref_model)
    G = config.num_generations
    columns = {k: repeat_for_group(v, G) for k, v in batch.items() if k != "prompt"}
    _, rewards = compute_rewards(
        [correctness_reward, format_reward],
        repeat_for_group(batch["prompt"], G),
        rollout.completions,
        rollout.completion_id_lists(),
        columns,
        config.reward_weights,
    )
    return rollout, rewards


def _grpo_step_cases() -> list[Case]:
    from minigrpo.models import make_reference_model
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset

    def compare(overrides: dict, seeds: list[int]):
        def run(learner):
            with tempfile.TemporaryDirectory() as tmp, single_thread():
                config = small_grpo_config(tmp, **overrides)
                data = make_arithmetic_dataset(4 * len(seeds), "train", seed=7)
                batches = [data[4 * i : 4 * i + 4] for i in range(len(seeds))]
                base, tokenizer = tiny_model_and_tokenizer()
                reference_model = copy.deepcopy(base)
                want, trainer = reference_grpo_steps(reference_model, tokenizer, batches, config, seeds)
                model = copy.deepcopy(base)
                ref_model = make_reference_model(base) if config.beta != 0 else None
                optimizer = torch.optim.AdamW(
                    model.parameters(),
                    lr=config.learning_rate,
                    betas=(config.adam_beta1, config.adam_beta2),
                    weight_decay=config.weight_decay,
                )
                results = []
                for step, (batch, seed, expected) in enumerate(zip(batches, seeds, want, strict=True), start=1):
                    torch.manual_seed(seed)
                    got = learner(
                        model, ref_model, tokenizer, optimizer, batch, [correctness_reward, format_reward], config
                    )
                    if not isinstance(got, dict) or not {"loss", "reward", "grad_norm"} <= set(got):
                        raise Mismatch(f"step {step}: return a dict with 'loss', 'reward' and 'grad_norm', got {got!r}")
                    _compare_step(got, expected, step)
                    results.append(got)
                _compare_gradients(model, reference_model)
                for step, (got, expected) in enumerate(zip(results, want, strict=True), start=1):
                    _compare_grad_norm(got, expected, step)
                _compare_parameters(model, reference_model)

        return run

    return [
        Case("beta 0.04, loss_type grpo, 4 prompts x G=4 (seed 0)", 2, compare({}, [0]), timeout=120),
        Case(
            "beta 0, loss_type dapo, epsilon_high 0.28 (seed 1)",
            2,
            compare({"beta": 0.0, "loss_type": "dapo", "epsilon_high": 0.28}, [1]),
            timeout=120,
        ),
        Case("two steps in a row share the optimizer state (seeds 2, 3)", 1, compare({}, [2, 3]), timeout=120),
    ]


def _compare_step(got: dict, expected: dict, step: int) -> None:
    """Reward, then loss, of one step."""
    expect_close(
        torch.tensor(float(got["reward"])),
        torch.tensor(expected["reward"]),
        atol=1e-6,
        what=f"step {step}: mean reward",
        hint="sample once with sample_group_rollout(model, tokenizer, batch['prompt'], config, ref_model) before "
        "anything else random, then score with compute_rewards (each column repeated G times).",
    )
    expect_close(
        torch.tensor(float(got["loss"])),
        torch.tensor(expected["loss"]),
        atol=1e-5,
        what=f"step {step}: loss",
        hint=_COMPOSITION_HINT,
    )


_COMPOSITION_HINT = (
    "advantages = group_relative_advantages(rewards.view(B, G), config.scale_rewards, config.baseline, "
    "config.std_ddof, config.advantage_epsilon).flatten(); logps from per_token_logps(model, rollout.input_ids, "
    "rollout.attention_mask, T, config.temperature); then grpo_loss(logps, rollout.old_per_token_logps, "
    "rollout.ref_per_token_logps, advantages, rollout.completion_mask, config)."
)


def _compare_gradients(model, reference_model) -> None:
    """The last step's (clipped) gradients: the loss's value at step 1 is about 0 whatever the advantages."""
    for (name, p), (_, q) in zip(model.named_parameters(), reference_model.named_parameters(), strict=True):
        if p.grad is not None and q.grad is not None:
            expect_close(
                p.grad,
                q.grad,
                atol=1e-5,
                what=f"gradient of {name}",
                hint="the loss matches but its gradient does not (at step 1 the loss is about 0 whatever the "
                "advantages), and the gradients must be zeroed before each backward. " + _COMPOSITION_HINT,
            )


def _compare_grad_norm(got: dict, expected: dict, step: int) -> None:
    expect_close(
        torch.tensor(float(got["grad_norm"])),
        torch.tensor(expected["grad_norm"]),
        atol=1e-4,
        what=f"step {step}: grad_norm",
        hint="return the value of torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm), called "
        "after loss.backward() (the norm before clipping).",
    )


def _compare_parameters(model, reference_model) -> None:
    """The updated weights agree with the reference's (to 1e-6) on at least 99% of the elements.

    Not all of them: Adam moves an element by about lr * sign(g) even when g is rounding noise, so a gradient
    that differs from the reference's by 1e-9 can flip a few tiny elements by 2 lr.
    """
    differ = total = 0
    for p, q in zip(model.parameters(), reference_model.parameters(), strict=True):
        differ += int(((p.detach() - q.detach()).abs() > 1e-6).sum())
        total += q.numel()
    if differ > 0.01 * total:
        raise Mismatch(
            f"{differ} of {total} weights after the step differ from the reference's: call optimizer.zero_grad(), "
            "loss.backward(), clip the gradient norm, then optimizer.step(), once per step."
        )


_cases("check_grpo_step")(_grpo_step_cases)


def check_grpo_step(grpo_step: Callable) -> CheckResult:
    """Exercise 08: grpo_step(model, ref_model, tokenizer, optimizer, batch, reward_funcs, config) -> dict."""
    return run_check("check_grpo_step", grpo_step)


# =====================================================================================
# 09 why is the loss 0 at step 1?
# =====================================================================================
WORKED_EXAMPLE_LENGTHS = [20, 20, 3, 36, 26, 20, 25, 20]
"""Token lengths |o_i| of the worked example's 8 completions (the tiny model's characters, + 1 for EOS)."""


def step_one_loss(advantages: torch.Tensor, lengths: torch.Tensor, loss_type: str, max_completion_length: int) -> float:
    """The loss at step 1 (ratio 1, KL 0): -sum_i w_i A_i, where w_i is the weight of completion i's tokens."""
    advantages, lengths = advantages.double(), lengths.double()
    if loss_type == "grpo":
        return -advantages.mean().item()  # each sequence weighs 1/N: -mean_i A_i = 0 (groups are centred)
    if loss_type == "dapo":
        return -(advantages * lengths).sum().item() / lengths.sum().item()  # each token weighs 1/sum|o|
    if loss_type == "dr_grpo":
        return -(advantages * lengths).sum().item() / (len(lengths) * max_completion_length)
    raise ValueError(f"loss_type={loss_type!r}: use 'grpo', 'dapo' or 'dr_grpo'.")


def _step_one_hint(loss_type: str) -> str:
    return {
        "grpo": "at step 1 rho = 1 and KL = 0, so each completion contributes -A_i, averaged over the N completions.",
        "dapo": "at step 1 each token of completion i contributes -A_i; dapo averages over all tokens: "
        "-sum_i |o_i| A_i / sum_i |o_i|.",
        "dr_grpo": "-sum_i |o_i| A_i / (N * max_completion_length).",
    }[loss_type]


def _step_one_cases() -> list[Case]:
    from minigrpo.advantages import group_relative_advantages

    def compare(advantages, lengths, loss_type, Tmax, what):
        def run(learner):
            got = learner(advantages.clone(), lengths.clone(), loss_type, Tmax)
            want = step_one_loss(advantages, lengths, loss_type, Tmax)
            wrong = [("the loss is minus the objective: flip the sign.", torch.tensor(-want))]
            expect_close(
                torch.tensor(float(got)),
                torch.tensor(want),
                atol=1e-6,
                what=what,
                hint=_step_one_hint(loss_type),
                mistakes=wrong if want else [],
            )

        return run

    worked = group_relative_advantages(torch.tensor([WORKED_EXAMPLE_REWARDS])).flatten()  # (8,)
    worked_lengths = torch.tensor(WORKED_EXAMPLE_LENGTHS)
    g = _seeded(17)
    advantages = group_relative_advantages(torch.randint(0, 3, (3, 4), generator=g).float()).flatten()  # (12,)
    lengths = torch.randint(1, 25, (12,), generator=g)

    def observed(learner):
        with tempfile.TemporaryDirectory() as tmp, single_thread():
            from minigrpo.tasks.arithmetic import make_arithmetic_dataset

            batch = make_arithmetic_dataset(4, "train", seed=5)[:4]
            for loss_type in ("grpo", "dapo", "dr_grpo"):
                config = small_grpo_config(tmp, loss_type=loss_type)
                model, tokenizer = tiny_model_and_tokenizer()
                rollout, rewards = _seeded_rollout(model, tokenizer, batch, config, copy.deepcopy(model), seed=3)
                grouped = rewards.view(-1, config.num_generations)  # (B, G)
                adv = group_relative_advantages(
                    grouped, config.scale_rewards, config.baseline, config.std_ddof, config.advantage_epsilon
                ).flatten()
                lengths = rollout.completion_mask.sum(1)  # (N,)
                (metrics,), _ = reference_grpo_steps(model, tokenizer, [batch], config, [3])
                got = learner(adv, lengths, loss_type, config.max_completion_length)
                expect_close(
                    torch.tensor(float(got)),
                    torch.tensor(metrics["loss"]),
                    atol=1e-5,
                    what=f"predicted vs observed {loss_type} loss at step 1",
                    hint=_step_one_hint(loss_type),
                )

    return [
        Case(
            "grpo on the worked example: the loss is exactly 0",
            1,
            compare(worked, worked_lengths, "grpo", 64, "grpo loss (worked example)"),
        ),
        Case("dapo on random groups and lengths (seed 17)", 1, compare(advantages, lengths, "dapo", 32, "dapo loss")),
        Case(
            "dr_grpo on random groups and lengths (seed 17)",
            1,
            compare(advantages, lengths, "dr_grpo", 32, "dr_grpo loss"),
        ),
        Case(
            "matches the trainer's observed step-1 loss on the tiny model, all 3 loss types", 1, observed, timeout=120
        ),
    ]


def _worked_step_one_cases() -> list[Case]:
    from minigrpo.advantages import group_relative_advantages

    def run(learner):
        advantages = group_relative_advantages(torch.tensor([WORKED_EXAMPLE_REWARDS])).flatten()  # (8,)
        want = step_one_loss(advantages, torch.tensor(WORKED_EXAMPLE_LENGTHS), "dapo", 64)
        got = learner()
        expect_close(
            torch.tensor(float(got)),
            torch.tensor(want),
            atol=1e-4,
            what="the worked example's dapo loss at step 1",
            hint=_step_one_hint("dapo"),
            mistakes=[("flip the sign: the loss is -J.", torch.tensor(-want))],
        )

    return [Case("your number for the worked example's dapo loss at step 1 (tolerance 1e-4)", 2, run)]


_cases("check_step_one_loss")(_step_one_cases)
_cases("check_worked_example_step_one_loss")(_worked_step_one_cases)


def check_step_one_loss(predicted_step_one_loss: Callable) -> CheckResult:
    """Exercise 09: predicted_step_one_loss(advantages (N,), lengths (N,), loss_type, max_completion_length)."""
    return run_check("check_step_one_loss", predicted_step_one_loss)


def check_worked_example_step_one_loss(worked_example_dapo_loss: Callable[[], float]) -> CheckResult:
    """Exercise 09: a number, the dapo loss at step 1 of the worked example (lengths WORKED_EXAMPLE_LENGTHS)."""
    return run_check("check_worked_example_step_one_loss", worked_example_dapo_loss)


# =====================================================================================
# 10 failure modes: a training run with a planted silent bug
# =====================================================================================
BUGS = {
    "shifted_logps": "log-probs shifted by one: completion token t is scored by the logits at position t, not t - 1",
    "prompt_in_mask": "prompt tokens inside the loss mask: the loss also trains on the prompt",
    "batch_std": "advantages scaled by the std of the whole batch instead of each group's std",
    "wrong_detach": "the wrong tensor detached: the current log-probs, so the ratio carries no gradient",
}
_MYSTERY_RUNS = dict(zip("ABCD", ("batch_std", "shifted_logps", "wrong_detach", "prompt_in_mask"), strict=True))


def _make_planted_bug_trainer():
    from minigrpo.advantages import group_relative_advantages, group_rewards
    from minigrpo.logprobs import completion_position_ids, masked_mean
    from minigrpo.losses import aggregate_loss, clipped_surrogate, importance_ratio, kl_penalty
    from minigrpo.trainer import GRPOTrainer

    class PlantedBugTrainer(GRPOTrainer):
        """GRPOTrainer with one planted bug (or none), logging diagnostics/* metrics. One micro-batch per step."""

        bug: str | None = None

        def token_logps(self, model, rollout):
            """(N, T') log-probs and entropies of the tokens the loss sees, and their mask (T' = T, or P + T - 1)."""
            input_ids, attention_mask = rollout.input_ids, rollout.attention_mask  # (N, L)
            L, T = input_ids.shape[1], rollout.completion_ids.shape[1]
            logits = (
                model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=completion_position_ids(attention_mask),
                    use_cache=False,
                ).logits.float()
                / self.config.temperature
            )  # (N, L, V)
            if self.bug == "prompt_in_mask":
                scores, labels, mask = logits[:, :-1], input_ids[:, 1:], attention_mask[:, 1:]  # every real token
            elif self.bug == "shifted_logps":
                scores, labels, mask = logits[:, L - T :], input_ids[:, L - T :], rollout.completion_mask  # off by one
            else:
                scores, labels, mask = logits[:, L - T - 1 : -1], input_ids[:, L - T :], rollout.completion_mask
            log_probs = torch.log_softmax(scores, dim=-1)  # (N, T', V)
            logps = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (N, T')
            entropy = -(log_probs.exp() * log_probs).sum(-1)  # (N, T')
            return logps, entropy, mask

        def optimize(self, rollout, rewards):
            config = self.config
            grouped = group_rewards(rewards, config.num_generations)  # (B, G)
            scale = "batch" if self.bug == "batch_std" else config.scale_rewards
            grouped_advantages = group_relative_advantages(
                grouped, scale, config.baseline, config.std_ddof, config.advantage_epsilon
            )
            advantages = grouped_advantages.flatten()  # (N,)
            self.optimizer.zero_grad(set_to_none=True)
            logps, entropy, mask = self.token_logps(self.model, rollout)
            with torch.no_grad():
                ref_logps = self.token_logps(self.ref_model, rollout)[0] if config.beta else None
            current = logps.detach() if self.bug == "wrong_detach" else logps
            ratio = importance_ratio(current, logps.detach(), mask)  # (N, T')
            per_token_loss = -clipped_surrogate(ratio, advantages, config.epsilon_low, config.clip_epsilon_high)
            metrics = {}
            if config.beta:
                kl = kl_penalty(logps, ref_logps, config.kl_estimator)  # (N, T')
                per_token_loss = per_token_loss + config.beta * kl
                metrics["kl"] = masked_mean(kl.detach(), mask).item()
            loss = aggregate_loss(per_token_loss, mask, config.loss_type, config.max_completion_length)
            if loss.requires_grad:
                loss.backward()
            varied = grouped.std(1) > 0  # (B,) groups that carry a signal
            metrics.update(
                {
                    "loss": loss.item(),
                    "entropy": masked_mean(entropy.detach(), mask).item(),
                    "grad_norm": self.clip_and_step(),
                    "diagnostics/nll_minus_entropy": (
                        masked_mean(-logps.detach(), mask) - masked_mean(entropy.detach(), mask)
                    ).item(),
                    "diagnostics/loss_tokens_per_completion": mask.sum().item() / mask.shape[0],
                    "diagnostics/advantage_std_in_group": grouped_advantages[varied].std(1).mean().item()
                    if varied.any()
                    else float("nan"),
                }
            )
            self.scheduler.step()
            return metrics

    return PlantedBugTrainer


DIAGNOSTICS = [
    ("reward", "reward"),
    ("loss", "loss"),
    ("grad_norm", "grad_norm"),
    ("kl", "kl"),
    ("nll-H", "diagnostics/nll_minus_entropy"),
    ("loss tok/compl", "diagnostics/loss_tokens_per_completion"),
    ("compl length", "completions/mean_length"),
    ("adv std in grp", "diagnostics/advantage_std_in_group"),
]


def planted_bug_run(run: str, max_steps: int, seed: int = 0) -> list[dict]:
    """Train the tiny Qwen for `max_steps` steps: run "healthy" (no bug) or a mystery run "A".."D".

    Returns the metric history (one dict per step) with the diagnostics/* metrics
    the exercise reads: nll_minus_entropy (mean -log p of the sampled tokens
    minus the mean entropy: about 0 on-policy), loss_tokens_per_completion and
    advantage_std_in_group (about 1 when each group is scaled by its own std).
    """
    from minigrpo.models import make_reference_model
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset

    if run != "healthy" and run not in _MYSTERY_RUNS:
        raise ValueError(f"run={run!r}: use 'healthy' or one of {sorted(_MYSTERY_RUNS)}.")
    trainer_class = _make_planted_bug_trainer()
    model, tokenizer = tiny_model_and_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        config = small_grpo_config(
            tmp,
            prompts_per_step=4,
            num_generations=8,
            per_device_train_batch_size=32,
            max_steps=max_steps,
            seed=seed,
            save_steps=10**9,
        )
        trainer = trainer_class(
            model,
            tokenizer,
            [correctness_reward, format_reward],
            make_arithmetic_dataset(500, "train", seed=seed),
            config,
            ref_model=make_reference_model(model),
        )
        trainer.bug = None if run == "healthy" else _MYSTERY_RUNS[run]
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull), single_thread():
            return trainer.train()  # no progress bar in the notebook


def diagnostics_table(histories: dict[str, list[dict]], steps: Sequence[int] | None = None) -> str:
    """A text table of the diagnostics of several runs, at the given steps (default: first and last)."""
    header = f"{'run':>8} {'step':>4} " + " ".join(f"{label:>14}" for label, _ in DIAGNOSTICS)
    lines = [header, "-" * len(header)]
    for name, history in histories.items():
        chosen = sorted({0, len(history) - 1}) if steps is None else [s - 1 for s in steps if s <= len(history)]
        for index in chosen:
            metrics = history[index]
            cells = " ".join(f"{metrics.get(key, float('nan')):>14.4f}" for _, key in DIAGNOSTICS)
            lines.append(f"{name:>8} {metrics['step']:>4} {cells}")
    return "\n".join(lines)


def _failure_mode_cases() -> list[Case]:
    signatures = {
        "shifted_logps": "on-policy, -log p of the sampled tokens should match the entropy (nll-H near 0)",
        "prompt_in_mask": "compare the tokens the loss sees per completion with the completion length",
        "batch_std": "within a group, GRPO's advantages have std about 1",
        "wrong_detach": "look at grad_norm and kl: does the policy move at all?",
    }

    def diagnosis(run: str):
        def check(learner):
            answers = learner()
            if not isinstance(answers, dict):
                raise Mismatch(f"return a dict like {{'A': 'batch_std', ...}}, got {type(answers).__name__}")
            answer = answers.get(run)
            if answer not in BUGS:
                raise Mismatch(f"run {run}: {answer!r} is not one of {sorted(BUGS)}")
            if answer != _MYSTERY_RUNS[run]:
                raise Mismatch(f"run {run}: not {answer!r}. Hint: {signatures[_MYSTERY_RUNS[run]]}.")

        return check

    return [Case(f"mystery run {run}", 1, diagnosis(run)) for run in _MYSTERY_RUNS]


_cases("check_failure_modes")(_failure_mode_cases)


def check_failure_modes(diagnose: Callable[[], dict]) -> CheckResult:
    """Exercise 10: diagnose() -> {'A': bug, 'B': bug, 'C': bug, 'D': bug}, bugs from BUGS."""
    return run_check("check_failure_modes", diagnose)


# =====================================================================================
# the grader: python -m minigrpo grade PATH [--json] [--timeout S]
# =====================================================================================
_CHECK_CALL_RE = re.compile(r"\b(check_\w+)\s*\(")


@dataclass
class NotebookReport:
    """The grade of one notebook: one CheckResult-like dict per check, and how the run went."""

    path: str
    checks: list[dict] = field(default_factory=list)
    status: str = "ok"  # ok | timeout | kernel died
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def exercise(self) -> str:
        return Path(self.path).stem

    @property
    def points(self) -> float:
        return sum(c["points"] for c in self.checks)

    @property
    def max_points(self) -> float:
        return sum(c["max_points"] for c in self.checks)

    def to_dict(self) -> dict:
        return {
            "exercise": self.exercise,
            "path": self.path,
            "points": self.points,
            "max_points": self.max_points,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "errors": self.errors,
            "checks": self.checks,
        }


class GradingError(RuntimeError):
    """Grading itself could not run (no kernel, unreadable notebook): exit code 1."""


def find_notebooks(path: str | Path) -> list[Path]:
    """A .ipynb file, or every .ipynb under a folder (sorted, checkpoints skipped)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a .ipynb file or a folder of them.")
    if path.is_file():
        if path.suffix != ".ipynb":
            raise FileNotFoundError(f"{path} is not a notebook (.ipynb).")
        return [path]
    notebooks = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not notebooks:
        raise FileNotFoundError(f"no .ipynb notebooks under {path}.")
    return notebooks


def expected_checks(nb) -> list[str]:
    """The checks a notebook's code cells call, in order of first appearance."""
    names: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            names += [n for n in _CHECK_CALL_RE.findall(cell.source) if n in CASES and n not in names]
    return names


def _cell_error(nb, check: str) -> str | None:
    """'NameError: ...' from the first cell that calls `check` and failed, if any."""
    for cell in nb.cells:
        if cell.cell_type == "code" and check in cell.source:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    return f"{output['ename']}: {output['evalue']}"
    return None


def collect(nb, record_file: Path, report: NotebookReport) -> None:
    """Fill report.checks from the records the checks wrote; checks that never reported get 0."""
    recorded: dict[str, dict] = {}
    if record_file.exists():
        for line in record_file.read_text().splitlines():
            if line.strip():
                result = json.loads(line)
                recorded[result["check"]] = result  # the last run of a check wins
    for name in expected_checks(nb) + [n for n in recorded if n not in expected_checks(nb)]:
        if name in recorded:
            report.checks.append(recorded[name])
            continue
        reason = _cell_error(nb, name) or (
            f"the notebook {report.status}" if report.status != "ok" else "the check was never called"
        )
        report.checks.append(
            {"check": name, "points": 0.0, "max_points": max_points(name), "cases": [], "not_run": reason}
        )


def _kernel_manager(kernel_dir: Path):
    """A kernel of the Python running the grader (not whatever 'python' is on PATH)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = kernel_dir / "kernels" / "minigrpo-grader"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minigrpo grader",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(kernel_dir / "kernels")])
    return AsyncKernelManager(kernel_name="minigrpo-grader", kernel_spec_manager=specs)


def _kernel_env(record_file: Path, jobs: int) -> dict:
    import minigrpo

    env = dict(os.environ)
    env[GRADE_FILE_ENV] = str(record_file)
    env.setdefault("MINIGRPO_QUICK", "1")
    package_root = str(Path(minigrpo.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, _cpu_count() // jobs))
    return env


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


async def _grade_notebook(path: Path, timeout: float, jobs: int, workdir: Path) -> NotebookReport:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    report = NotebookReport(str(path))
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as error:
        raise GradingError(f"cannot read {path}: {last_traceback_line(error)}") from error
    record_file = workdir / f"{path.stem}-{abs(hash(str(path)))}.jsonl"
    record_file.unlink(missing_ok=True)
    client = NotebookClient(
        nb,
        timeout=int(timeout),
        allow_errors=True,
        km=_kernel_manager(workdir / f"kernel-{abs(hash(str(path)))}"),
        resources={"metadata": {"path": str(path.parent.resolve())}},
        extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no start-up warnings on the grader's stderr
    )
    started = time.monotonic()
    try:
        async with client.async_setup_kernel(env=_kernel_env(record_file, jobs)):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = timeout - (time.monotonic() - started)
                if remaining <= 0:
                    raise CellTimeoutError("the notebook ran out of time")
                client.timeout = max(1, int(math.ceil(remaining)))
                await client.async_execute_cell(cell, index)
    except CellTimeoutError:
        report.status = "timed out"
        report.errors.append(f"the notebook ran longer than --timeout {timeout:g} s; later cells did not run")
    except DeadKernelError as error:
        report.status = "kernel died"
        report.errors.append(f"the kernel died: {last_traceback_line(error)}")
    except RuntimeError as error:
        if client.kc is None:  # the kernel never started: grading could not run
            raise GradingError(f"could not start a kernel for {path}: {last_traceback_line(error)}") from error
        raise
    report.seconds = time.monotonic() - started
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error" and output["ename"] != "NotImplementedError":
                report.errors.append(f"{output['ename']}: {output['evalue']}")
    collect(nb, record_file, report)
    return report


async def _grade_all(notebooks: list[Path], timeout: float, jobs: int, workdir: Path, progress) -> list[NotebookReport]:
    gate = asyncio.Semaphore(jobs)

    async def one(path: Path) -> NotebookReport:
        async with gate:
            report = await _grade_notebook(path, timeout, jobs, workdir)
            progress(report)
            return report

    return list(await asyncio.gather(*(one(p) for p in notebooks)))


def grade_notebooks(
    paths: Sequence[str | Path], timeout: float = 600, jobs: int | None = None, progress=None
) -> list[NotebookReport]:
    """Execute each notebook in its own kernel (`jobs` at a time) and collect its checks."""
    notebooks = [Path(p) for p in paths]
    if jobs is None:
        jobs = int(os.environ.get("MINIGRPO_GRADE_JOBS", "0")) or min(len(notebooks), _cpu_count(), 4)
    jobs = max(1, jobs)
    with tempfile.TemporaryDirectory(prefix="minigrpo-grade-") as tmp:
        return asyncio.run(_grade_all(notebooks, timeout, jobs, Path(tmp), progress or (lambda report: None)))


def format_scores(reports: list[NotebookReport]) -> str:
    """The score table: exercise, check, points, max; then a total and what failed."""
    width = max([len("exercise")] + [len(r.exercise) for r in reports])
    check_width = max([len("check")] + [len(c["check"]) for r in reports for c in r.checks])
    lines = [f"{'exercise':<{width}}  {'check':<{check_width}}  {'points':>6}  {'max':>4}"]
    lines.append("-" * len(lines[0]))
    for report in reports:
        rows = report.checks or [{"check": "(no checks)", "points": 0, "max_points": 0}]
        for check in rows:
            lines.append(
                f"{report.exercise:<{width}}  {check['check']:<{check_width}}  "
                f"{_fmt(check['points']):>6}  {_fmt(check['max_points']):>4}"
            )
    lines.append("-" * len(lines[0]))
    total, most = sum(r.points for r in reports), sum(r.max_points for r in reports)
    lines.append(f"{'total':<{width}}  {'':<{check_width}}  {_fmt(total):>6}  {_fmt(most):>4}")
    details = []
    for report in reports:
        if report.status != "ok":
            details.append(f"{report.exercise}: {report.status}")
        for check in report.checks:
            if "not_run" in check:
                details.append(f"{report.exercise} / {check['check']}: did not run ({check['not_run']})")
            for case in check.get("cases", []):
                if not case["passed"]:
                    details.append(f"{report.exercise} / {check['check']} / {case['name']}: {case['message']}")
    if details:
        lines += ["", "what lost points:"] + [f"  {d}" for d in details]
    return "\n".join(lines)


def grade_command(path: str, as_json: bool = False, timeout: float = 600) -> int:
    """`python -m minigrpo grade PATH`: 0 whatever the score; 2 for a bad PATH, 1 when grading could not run."""
    try:
        notebooks = find_notebooks(path)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def progress(report: NotebookReport) -> None:
        print(
            f"graded {report.path}: {_fmt(report.points)}/{_fmt(report.max_points)} in {report.seconds:.1f} s"
            + ("" if report.status == "ok" else f" ({report.status})"),
            file=sys.stderr,
        )

    started = time.monotonic()
    try:
        reports = grade_notebooks(notebooks, timeout=timeout, progress=progress)
    except GradingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    total, most = sum(r.points for r in reports), sum(r.max_points for r in reports)
    if as_json:
        summary = {
            "path": str(path),
            "points": total,
            "max_points": most,
            "seconds": round(time.monotonic() - started, 2),
        }
        print(json.dumps({**summary, "notebooks": [r.to_dict() for r in reports]}, indent=1))
    else:
        print(format_scores(reports))
    return 0

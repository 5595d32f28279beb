"""Exercise 14: name the planted bug of each mystery run, or "none", from its diagnostics (the runs are in labs.py)."""

from __future__ import annotations

from collections.abc import Callable

from minigrpo.grading.checks.labs import BUGS, MYSTERY_RUNS, NO_BUG
from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, Mismatch, cases, check, run_check

ANSWERS = (*BUGS, NO_BUG)
"""What diagnose() may name for a run: one of the planted bugs, or NO_BUG for a healthy run."""
SIGNATURES = {
    "shifted_logps": "on-policy, -log p of the sampled tokens should match the entropy (nll-H near 0)",
    "prompt_in_mask": "compare the tokens the loss sees per completion with the completion length: far more than "
    "even the longest completion has",
    "padding_in_mask": "the loss sees more tokens per completion than the completions have on average, exactly as many "
    "as the longest one: every row counts up to the padded width",
    "batch_std": "within a group, GRPO's advantages have std about 1 (0.999 with advantage_epsilon)",
    "wrong_detach": "look at grad_norm and kl: does the policy move at all?",
    NO_BUG: "a run can be healthy: check each diagnostic against the healthy run's (nll-H near 0, loss tok/compl "
    "equal to compl length, adv std in grp about 1, grad_norm > 0)",
}
"""The hint a wrong answer gets: where the run's true answer shows (one per entry of ANSWERS)."""


@cases("check_failure_modes", references=[MYSTERY_RUNS])
def _failure_mode_cases() -> list[Case]:
    def diagnosis(run: str):
        def check(learner):
            answers = learner()
            if not isinstance(answers, dict):
                raise Mismatch(f"return a dict like {{'A': 'batch_std', ...}}, got {type(answers).__name__}")
            answer = answers.get(run)
            if answer not in ANSWERS:
                raise Mismatch(f"run {run}: {answer!r} is not one of {sorted(ANSWERS)}")
            if answer != MYSTERY_RUNS[run]:
                raise Mismatch(f"run {run}: not {answer!r}. Hint: {SIGNATURES[MYSTERY_RUNS[run]]}.")

        return check

    return [Case(f"mystery run {run}", 1, diagnosis(run)) for run in MYSTERY_RUNS]


@check
def check_failure_modes(diagnose: Callable[[], dict]) -> CheckResult:
    """Exercise 14: diagnose() -> {'A': answer, ..., 'E': answer}, each a key of BUGS or "none" (NO_BUG)."""
    return run_check("check_failure_modes", diagnose)


EXERCISE = exercise("14_failure_modes", [check_failure_modes], solution_seconds=95, formerly="10_failure_modes")

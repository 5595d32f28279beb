"""Exercise 10: name the planted bug of each mystery run from its diagnostics (runs in minigrpo.grading.labs)."""

from __future__ import annotations

from collections.abc import Callable

from minigrpo.grading.framework import Case, CheckResult, Mismatch, cases, run_check
from minigrpo.grading.labs import BUGS, MYSTERY_RUNS


@cases("check_failure_modes", references=[MYSTERY_RUNS])
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
            if answer != MYSTERY_RUNS[run]:
                raise Mismatch(f"run {run}: not {answer!r}. Hint: {signatures[MYSTERY_RUNS[run]]}.")

        return check

    return [Case(f"mystery run {run}", 1, diagnosis(run)) for run in MYSTERY_RUNS]


def check_failure_modes(diagnose: Callable[[], dict]) -> CheckResult:
    """Exercise 10: diagnose() -> {'A': bug, 'B': bug, 'C': bug, 'D': bug}, bugs from BUGS."""
    return run_check("check_failure_modes", diagnose)

"""Exercise 06: the k3 KL estimator pi_ref / pi_theta - log(pi_ref / pi_theta) - 1, and its gradient."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import (
    Case,
    CheckResult,
    Mismatch,
    cases,
    check,
    expect_close,
    run_check,
    seeded,
    value_and_gradient,
)
from minigrpo.losses import kl_penalty


def _kl_mistakes(logps, ref):
    log_r = ref - logps
    return [
        ("the ratio is pi_ref / pi_theta (log_r = ref - logp), not pi_theta / pi_ref.", torch.exp(-log_r) + log_r - 1),
        ("that is k1 = -log_r; k3 = exp(log_r) - log_r - 1.", -log_r),
        ("that is k2 = log_r^2 / 2; k3 = exp(log_r) - log_r - 1.", 0.5 * log_r**2),
        ("you forgot the - 1: k3 is 0 when pi_theta == pi_ref.", torch.exp(log_r) - log_r),
    ]


@cases("check_kl_k3", references=[kl_penalty])
def _kl_cases() -> list[Case]:
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
        g = seeded(11)
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
        g = seeded(12)
        logps = (-torch.rand(3, 5, generator=g) * 3).requires_grad_()
        ref = -torch.rand(3, 5, generator=g) * 3
        got, got_grad = value_and_gradient(learner, 0, logps, ref)
        if not isinstance(got, torch.Tensor) or got_grad is None:
            raise Mismatch("the KL carries no gradient: keep it a differentiable function of per_token_logps.")
        want_grad = 1 - torch.exp(ref - logps.detach())  # d/dlogp [exp(ref - logp) - (ref - logp) - 1]
        expect_close(
            got_grad, want_grad, atol=1e-5, what="d k3 / d logp", hint="d k3 / d logp = 1 - pi_ref / pi_theta."
        )

    return [
        Case("hand-made: equal -> 0; r = 1/2 -> 0.193147; r = 2 -> 0.306853", 1, hand),
        Case("random (6, 9) log-probs vs the reference (seed 11)", 1, random_case),
        Case("gradient 1 - pi_ref / pi_theta (seed 12)", 1, gradient),
    ]


@check
def check_kl_k3(kl_k3: Callable) -> CheckResult:
    """Exercise 06: kl_k3(per_token_logps (N, T), ref_per_token_logps (N, T)) -> (N, T)."""
    return run_check("check_kl_k3", kl_k3)


EXERCISE = exercise("06_kl_k3_estimator", [check_kl_k3], solution_seconds=60, formerly="05_kl_k3_estimator")

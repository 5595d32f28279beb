"""Exercise 05: PPO's clipped surrogate min(rho A, clip(rho) A), with clip-higher (epsilon_low != epsilon_high)."""

from __future__ import annotations

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
from minigrpo.losses import clipped_surrogate as reference


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


@cases("check_clipped_surrogate", references=[reference])
def _surrogate_cases() -> list[Case]:
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
        g = seeded(10)
        ratio = torch.exp(torch.randn(4, 6, generator=g) * 0.3).requires_grad_()
        advantages = torch.randn(4, generator=g)
        got, got_grad = value_and_gradient(learner, 0, ratio, advantages, 0.2, 0.28)
        if not isinstance(got, torch.Tensor) or got_grad is None:
            raise Mismatch("the surrogate carries no gradient: keep it a differentiable function of the ratio.")
        r = ratio.detach().requires_grad_()
        (want_grad,) = torch.autograd.grad(reference(r, advantages, 0.2, 0.28).sum(), r)
        expect_close(
            got_grad,
            want_grad,
            atol=1e-6,
            what="d surrogate / d ratio",
            hint="the gradient is A where the min picks rho * A and 0 where the clipped term wins.",
        )

    g = seeded(9)
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


@check
def check_clipped_surrogate(clipped_surrogate: Callable) -> CheckResult:
    """Exercise 05: clipped_surrogate(ratio (N, T), advantages (N,), epsilon_low, epsilon_high) -> (N, T)."""
    return run_check("check_clipped_surrogate", clipped_surrogate)


EXERCISE = exercise(
    "05_clipped_surrogate", [check_clipped_surrogate], solution_seconds=50, formerly="04_clipped_surrogate"
)

"""Exercise 09: the expected gradient of each KL estimator used as a loss, and which KL direction it follows."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from minigrpo.course.kl_gradients import (
    KL_DIRECTIONS,
    KL_LOSSES,
    exact_kl_gradients,
    expected_kl_loss_gradient,
    per_sample_kl_losses,
)
from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, Mismatch, cases, check, expect_close, run_check, seeded

# pi_theta = (1/2, 1/2), pi_ref = (1/4, 3/4): lesson 04's hand example
HALVES = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
QUARTERS = torch.log(torch.tensor([0.25, 0.75], dtype=torch.float64))
REVERSE = torch.tensor([1.0, -1.0], dtype=torch.float64) * 0.25 * math.log(3.0)  # (+0.274653, -0.274653)
FORWARD = torch.tensor([0.25, -0.25], dtype=torch.float64)  # pi_theta - pi_ref
BY_HAND = {"k1": torch.zeros(2, dtype=torch.float64), "k2": REVERSE, "k3": FORWARD, "rho_k3": REVERSE}
HINTS = {
    "k1": "the k1 loss's gradient at a sampled x is g(x) = grad log pi_theta(x); average it over x ~ pi_theta.",
    "k2": "the k2 loss's gradient is -log r * g(x) = (log pi_theta(x) - log pi_ref(x)) g(x); average it.",
    "k3": "the k3 loss's gradient is (1 - r) g(x), r = pi_ref(x) / pi_theta(x); average over x ~ pi_theta.",
    "rho_k3": "product rule: grad(rho k3) = rho grad k3 + k3 grad rho with rho = 1 in value and grad rho = g(x).",
}
SCORE = "with pi = softmax(logits), g(x) = d log pi(x) / d logits = onehot(x) - pi."


def _gradient_of_the_value(estimator: str, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """The classic mistake: differentiate E[k] = sum_x pi(x) k(x), the sampling weights included."""
    logits = logits.detach().double().requires_grad_()
    weights = torch.softmax(logits, dim=0)  # not detached: that is the mistake
    (gradient,) = torch.autograd.grad((weights * per_sample_kl_losses(estimator, logits, ref_logits)).sum(), logits)
    return gradient


def _without_the_softmax_term(estimator: str, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """sum_x pi(x) c(x) onehot(x) = pi * c: the score taken as onehot(x), its - pi forgotten."""
    logp, ref_logp = torch.log_softmax(logits.double(), 0), torch.log_softmax(ref_logits.double(), 0)
    log_r = ref_logp - logp  # (V,)
    coefficient = {"k1": torch.ones_like(log_r), "k2": -log_r, "k3": 1 - log_r.exp(), "rho_k3": -log_r}[estimator]
    return logp.exp() * coefficient


def _mistakes(estimator: str, logits: torch.Tensor, ref_logits: torch.Tensor, want: torch.Tensor):
    """(hint, what a known wrong answer returns), the more specific hints first."""
    exact = exact_kl_gradients(logits, ref_logits)
    mistakes = []
    if estimator == "k3":
        reverse_hint = (
            "that is the reverse KL's gradient (what differentiating E[k3] = KL(pi_theta || pi_ref) gives). The loss "
            "differentiates only log pi_theta(x): (1 - r) g(x), whose average is the forward KL(pi_ref || pi_theta)'s."
        )
        mistakes.append((reverse_hint, exact["reverse"]))
    if estimator == "rho_k3":
        mistakes.append(
            ("that is plain k3's gradient: rho is 1 in value, but grad rho = g(x) adds k3 g(x).", exact["forward"])
        )
    if estimator in ("k1", "k2"):
        mistakes.append(("that is the forward KL's gradient (k3's), not this loss's.", exact["forward"]))
    value_hint = (
        "you differentiated the expected value sum_x pi(x) k(x), weights included. The sampled token is data: only "
        "log pi_theta(x) (and the ratio) carries gradient, so weigh each x's gradient by a detached pi(x)."
    )
    mistakes += [
        (value_hint, _gradient_of_the_value(estimator, logits, ref_logits)),
        ("the sign is flipped: return the gradient of the loss itself (a loss is minimised).", -want),
        (f"you dropped the softmax's - pi: {SCORE}", _without_the_softmax_term(estimator, logits, ref_logits)),
    ]
    return mistakes


@cases("check_kl_loss_gradient", references=[expected_kl_loss_gradient, per_sample_kl_losses, exact_kl_gradients])
def _kl_loss_gradient_cases() -> list[Case]:
    def expect_gradient(learner, estimator, logits, ref_logits, want, where: str, hint: str = ""):
        expect_close(
            learner(estimator, logits.clone(), ref_logits.clone()),
            want,
            atol=1e-6,
            what=f"E[grad {estimator}] for {where}",
            hint=f"{HINTS[estimator]} {SCORE}{hint}",
            mistakes=_mistakes(estimator, logits, ref_logits, want),
        )

    def hand(estimator: str):
        def run(learner):
            where = "pi_theta = (1/2, 1/2), pi_ref = (1/4, 3/4)"
            expect_gradient(learner, estimator, HALVES, QUARTERS, BY_HAND[estimator], where)

        return run

    def random_case(learner):
        g = seeded(13)
        logits = torch.randn(6, generator=g, dtype=torch.float64) * 1.5  # any logits, not log-probabilities
        ref_logits = torch.randn(6, generator=g, dtype=torch.float64) * 1.5
        for estimator in KL_LOSSES:
            want = expected_kl_loss_gradient(estimator, logits, ref_logits)
            hint = " The logits need not be normalised: take log_softmax first."
            expect_gradient(learner, estimator, logits, ref_logits, want, "random logits (V = 6)", hint)

    values = {"k1": "0, 0", "k2": "+0.274653, -0.274653", "k3": "+0.25, -0.25", "rho_k3": "+0.274653, -0.274653"}
    return [Case(f"hand-made {name}: ({values[name]})", 0.5, hand(name)) for name in KL_LOSSES] + [
        Case("random logits, V = 6, all four losses (seed 13)", 3, random_case)
    ]


@check
def check_kl_loss_gradient(kl_loss_gradient: Callable) -> CheckResult:
    """Exercise 09: kl_loss_gradient(estimator, logits (V,), ref_logits (V,)) -> E_{x ~ pi_theta}[grad loss(x)] (V,)."""
    return run_check("check_kl_loss_gradient", kl_loss_gradient)


DIRECTION_HINTS = {
    "k1": "average g(x) = grad log pi_theta(x) over x ~ pi_theta: what is sum_x grad pi_theta(x)?",
    "k2": "compare E[-log r * g] with the gradient of sum_x pi_theta log(pi_theta / pi_ref) (its second term is 0).",
    "k3": "(1 - r) g = g - (pi_ref / pi_theta) g: the second term averages over pi_ref, not pi_theta.",
    "rho_k3": "its per-sample gradient equals one of the other three losses' exactly.",
}


@cases("check_kl_directions", references=[KL_DIRECTIONS])
def _kl_direction_cases() -> list[Case]:
    def direction(estimator: str):
        def run(learner):
            answers = learner()
            if not isinstance(answers, dict):
                raise Mismatch(f"return a dict like {{'k1': 'none', ...}}, got {type(answers).__name__}")
            answer = answers.get(estimator)
            if answer not in ("reverse", "forward", "none"):
                raise Mismatch(f"{estimator}: {answer!r} is not one of 'reverse', 'forward', 'none'")
            if answer != KL_DIRECTIONS[estimator]:
                raise Mismatch(f"{estimator}: not {answer!r}. Hint: {DIRECTION_HINTS[estimator]}")

        return run

    return [Case(f"which KL the {name} loss follows", 0.5, direction(name)) for name in KL_LOSSES]


@check
def check_kl_directions(kl_directions: Callable[[], dict]) -> CheckResult:
    """Exercise 09: kl_directions() -> {'k1': d, 'k2': d, 'k3': d, 'rho_k3': d}, d: 'reverse', 'forward' or 'none'."""
    return run_check("check_kl_directions", kl_directions)


EXERCISE = exercise(
    "09_kl_gradient",
    [
        check_kl_loss_gradient,
        check_kl_directions,
    ],
    solution_seconds=45,
    formerly="13_kl_gradient",
)

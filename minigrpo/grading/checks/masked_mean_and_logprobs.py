"""Exercise 01: the masked mean over completion tokens, and per-token log-probs from logits (the off-by-one)."""

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
    random_mask,
    run_check,
    seeded,
    value_and_gradient,
)
from minigrpo.logprobs import masked_mean as reference
from minigrpo.logprobs import selective_log_softmax


@cases("check_masked_mean", references=[reference])
def _masked_mean_cases() -> list[Case]:
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

    g = seeded(5)
    values = torch.randn(6, 7, generator=g)
    mask = random_mask(6, 7, g)
    nasty = torch.randn(4, 5, generator=g)
    nasty_mask = random_mask(4, 5, g)
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


def logps_reference(logits: torch.Tensor, input_ids: torch.Tensor, T: int) -> torch.Tensor:
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


@cases("check_per_token_logps", references=[logps_reference, selective_log_softmax])
def _logps_cases() -> list[Case]:
    def compare(N, L, V, T, seed, what):
        def run(learner):
            g = seeded(seed)
            logits = torch.randn(N, L, V, generator=g) * 3
            input_ids = torch.randint(0, V, (N, L), generator=g)
            got = learner(logits.clone(), input_ids.clone(), T)
            hint = "gather log_softmax(logits[:, -T - 1 : -1]) at input_ids[:, -T:]."
            want = logps_reference(logits, input_ids, T)
            expect_close(got, want, atol=1e-5, what=what, hint=hint, mistakes=_logps_mistakes(logits, input_ids, T))

        return run

    def gradient(learner):
        g = seeded(8)
        logits = (torch.randn(3, 6, 5, generator=g) * 2).requires_grad_()
        input_ids = torch.randint(0, 5, (3, 6), generator=g)
        got, got_grad = value_and_gradient(learner, 0, logits, input_ids, 4)
        if not isinstance(got, torch.Tensor) or got_grad is None:
            raise Mismatch("the result carries no gradient: do not call .detach(), .item() or torch.no_grad() inside.")
        reference_logits = logits.detach().requires_grad_()
        (want_grad,) = torch.autograd.grad(logps_reference(reference_logits, input_ids, 4).sum(), reference_logits)
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


@check
def check_masked_mean(masked_mean: Callable) -> CheckResult:
    """Exercise 01: masked_mean(values (N, T), mask (N, T), dim=None) -> scalar or (N,)."""
    return run_check("check_masked_mean", masked_mean)


@check
def check_per_token_logps(per_token_logps_from_logits: Callable) -> CheckResult:
    """Exercise 01: per_token_logps_from_logits(logits (N, L, V), input_ids (N, L), T) -> (N, T)."""
    return run_check("check_per_token_logps", per_token_logps_from_logits)


EXERCISE = exercise(
    "01_masked_mean_and_logprobs",
    [
        check_masked_mean,
        check_per_token_logps,
    ],
    solution_seconds=50,
    formerly="03_masked_mean_and_logprobs",
)

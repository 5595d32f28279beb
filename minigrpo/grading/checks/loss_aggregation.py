"""Exercise 07: aggregating the per-token loss: grpo (per sequence), dapo (per token), dr_grpo (constant)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, cases, check, expect_close, random_mask, run_check, seeded
from minigrpo.losses import aggregate_loss as reference

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


@cases("check_aggregate_loss", references=[reference])
def _aggregation_cases() -> list[Case]:
    def compare(loss, mask, loss_type, Tmax, want=None, what=""):
        def run(learner):
            got = learner(loss.clone(), mask.clone(), loss_type, Tmax)
            expected = reference(loss, mask, loss_type, Tmax) if want is None else want
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
    g = seeded(13)
    loss = torch.randn(6, 8, generator=g)
    mask = random_mask(6, 8, g)
    cases = []
    for loss_type, want in (("grpo", 2.5), ("dapo", 1.6), ("dr_grpo", 1.0)):
        cases.append(
            Case(
                f"{loss_type}: hand-made, lengths 4 and 1 -> {want}",
                0.5,
                compare(hand_loss, hand_mask, loss_type, 4, torch.tensor(want), "(hand-made)"),
            )
        )
        cases.append(
            Case(
                f"{loss_type}: random (6, 8), max_completion_length 10 (seed 13)",
                1.5,
                compare(loss, mask, loss_type, 10, None, "(random)"),
            )
        )
    return cases


@check
def check_aggregate_loss(aggregate_loss: Callable) -> CheckResult:
    """Exercise 07: aggregate_loss(per_token_loss (N, T), completion_mask (N, T), loss_type, max_completion_length)."""
    return run_check("check_aggregate_loss", aggregate_loss)


EXERCISE = exercise("07_loss_aggregation", [check_aggregate_loss], solution_seconds=60, formerly="06_loss_aggregation")

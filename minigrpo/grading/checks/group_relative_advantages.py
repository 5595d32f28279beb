"""Exercise 04: group-relative advantages (GRPO's mean / std baseline) and RLOO's leave-one-out baseline."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minigrpo import advantages as reference
from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, cases, check, expect_close, run_check, seeded
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_REWARDS


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


@cases("check_group_relative_advantages", references=[reference.group_relative_advantages])
def _advantage_cases() -> list[Case]:
    def compare(grouped: torch.Tensor, eps: float, atol: float = 1e-5):
        def run(learner):
            got = learner(grouped.clone(), eps=eps)
            want = reference.group_relative_advantages(grouped, "group", "mean", 1, eps)
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

    g = seeded(2)
    random_groups = torch.randint(0, 3, (6, 8), generator=g).float()  # (B, G) = (6, 8)
    random_groups[0] = torch.rand(8, generator=g)
    constant = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    pairs = torch.randn(3, 2, generator=seeded(3))  # G = 2
    return [
        Case("the worked example (rewards 2/1/0, hand-computed)", 1, worked_example),
        Case("random groups, B=6 G=8 (seed 2)", 1.5, compare(random_groups, 1e-4)),
        Case("groups whose rewards are all equal get 0, not NaN (eps=0)", 0.5, compare(constant, 0.0)),
        Case("G=2, eps=1e-2 (seed 3)", 1, compare(pairs, 1e-2)),
    ]


@cases("check_rloo_advantages", references=[reference.group_baseline, reference.group_relative_advantages])
def _rloo_cases() -> list[Case]:
    def compare(grouped: torch.Tensor, what: str):
        def run(learner):
            got = learner(grouped.clone())
            want = grouped - reference.group_baseline(grouped, "rloo")
            wrong = [
                (
                    "that is the GRPO mean baseline; RLOO leaves r_i out of its own baseline.",
                    grouped - grouped.mean(1, keepdim=True),
                )
            ]
            hint = "A_i = r_i - mean of the other G - 1 rewards = r_i - (sum(r) - r_i) / (G - 1)."
            expect_close(got, want, atol=1e-5, what=what, hint=hint, mistakes=wrong)

        return run

    worked = torch.tensor([WORKED_EXAMPLE_REWARDS])  # (1, 8)
    random_groups = torch.randn(5, 4, generator=seeded(4))  # (B, G) = (5, 4)
    return [
        Case("the worked example", 0.5, compare(worked, "RLOO advantages (worked example)")),
        Case("random groups, B=5 G=4 (seed 4)", 1.5, compare(random_groups, "RLOO advantages")),
    ]


@check
def check_group_relative_advantages(group_relative_advantages: Callable) -> CheckResult:
    """Exercise 04: group_relative_advantages(grouped_rewards (B, G), eps) -> (B, G)."""
    return run_check("check_group_relative_advantages", group_relative_advantages)


@check
def check_rloo_advantages(rloo_advantages: Callable) -> CheckResult:
    """Exercise 04: rloo_advantages(grouped_rewards (B, G)) -> (B, G)."""
    return run_check("check_rloo_advantages", rloo_advantages)


EXERCISE = exercise(
    "04_group_relative_advantages",
    [
        check_group_relative_advantages,
        check_rloo_advantages,
    ],
    solution_seconds=60,
    formerly="02_group_relative_advantages",
)

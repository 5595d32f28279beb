"""Exercise 13: generalised advantage estimation (GAE) for PPO, over right-padded completions."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, cases, check, expect_close, random_mask, run_check, seeded
from minigrpo.ppo import compute_gae as reference


def _gae_mistakes(rewards, values, mask, gamma, lam):
    N, T = values.shape
    advantages = torch.zeros_like(values)
    running = torch.zeros(N, dtype=values.dtype)
    for t in reversed(range(T)):  # the value after the last token taken from the padding
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros(N, dtype=values.dtype)
        running = (rewards[:, t] * mask[:, t] + gamma * next_value - values[:, t]) + gamma * lam * running
        advantages[:, t] = running
    leak = advantages * mask
    no_lam = reference(rewards, values, mask, gamma, 1.0)
    td = reference(rewards, values, mask, gamma, 0.0)
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


@cases("check_compute_gae", references=[reference])
def _gae_cases() -> list[Case]:
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
            g = seeded(seed)
            rewards, values = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
            mask = random_mask(5, 7, g)
            got_a, got_r = learner(rewards.clone(), values.clone(), mask.clone(), gamma=gamma, lam=lam)
            want_a, want_r = reference(rewards, values, mask, gamma=gamma, lam=lam)
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
        g = seeded(16)
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


@check
def check_compute_gae(compute_gae: Callable) -> CheckResult:
    """Exercise 13: compute_gae(rewards, values, mask, gamma, lam) -> (advantages, returns), all (N, T)."""
    return run_check("check_compute_gae", compute_gae)


EXERCISE = exercise("13_gae_for_ppo", [check_compute_gae], solution_seconds=50, formerly="07_gae_for_ppo")

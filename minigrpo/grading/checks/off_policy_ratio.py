"""Exercise 11: the off-policy ratio rho = exp(log pi_theta - log pi_old) and TRL's clip_ratio/* fractions.

The clip fractions are TRL's (GRPOTrainer._compute_loss, TRL 1.16), for a token-level ratio:

    low    = (rho < 1 - epsilon_low)  & (A < 0)     the clip switched the gradient off from below
    high   = (rho > 1 + epsilon_high) & (A > 0)     ... from above
    region = low | high
    clip_ratio/<x>_mean = sum(x * mask) / sum(mask)  a mean over the completion tokens of the batch
"""

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
from minigrpo.logprobs import masked_mean
from minigrpo.losses import clip_fractions, grpo_loss, importance_ratio

CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


# --- the ratio --------------------------------------------------------------------------------
def _ratio_mistakes(logps: torch.Tensor, old: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    return [
        ("the ratio is pi_theta / pi_old: exp(logp - old_logp), not exp(old_logp - logp).", torch.exp(old - logps)),
        ("that is the log-ratio: take its exp.", logps - old),
        ("log-probs do not divide: rho = exp(logp - old_logp) = pi_theta / pi_old.", logps / old),
    ]


def _ratio_reference(logps: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return importance_ratio(logps, old, torch.ones_like(logps), "token")  # (N, T)


@cases("check_importance_ratio", references=[importance_ratio])
def _ratio_cases() -> list[Case]:
    hint = "rho = pi_theta / pi_old = exp(per_token_logps - old_per_token_logps), per token: (N, T)."

    def hand(learner):
        logps = torch.log(torch.tensor([[0.5, 0.25, 0.3], [0.1, 0.2, 0.4]]))  # (2, 3)
        old = torch.log(torch.tensor([[0.25, 0.5, 0.3], [0.2, 0.1, 0.5]]))
        want = torch.tensor([[2.0, 0.5, 1.0], [0.5, 2.0, 0.8]])  # pi_theta / pi_old by hand
        expect_close(
            learner(logps, old),
            want,
            atol=1e-6,
            what="rho of the hand-made tokens",
            hint=hint,
            mistakes=_ratio_mistakes(logps, old),
        )

    def on_policy(learner):
        g = seeded(21)
        logps = (-torch.rand(3, 5, generator=g) * 4).requires_grad_()
        got, got_grad = value_and_gradient(learner, 0, logps, logps.detach())
        expect_close(
            got,
            torch.ones(3, 5),
            atol=0,
            what="rho with old = current log-probs detached (num_iterations = 1)",
            hint="on-policy the ratio is exactly 1 in value.",
        )
        if got_grad is None:
            raise Mismatch("rho carries no gradient: keep it a function of per_token_logps (do not detach them).")
        expect_close(
            got_grad,
            torch.ones(3, 5),
            atol=1e-6,
            what="d rho / d logp at rho = 1",
            hint="d rho / d logp = rho: 1 on-policy, so the surrogate's gradient is A grad log pi (REINFORCE).",
        )

    def random_case(learner):
        g = seeded(22)
        old = -torch.rand(4, 7, generator=g) * 4
        logps = (old + 0.3 * torch.randn(4, 7, generator=g)).requires_grad_()  # a policy one update away
        got, got_grad = value_and_gradient(learner, 0, logps, old)
        want = _ratio_reference(logps.detach(), old)
        expect_close(
            got, want, atol=1e-5, what="rho of random log-probs", hint=hint, mistakes=_ratio_mistakes(logps, old)
        )
        if got_grad is None:
            raise Mismatch("rho carries no gradient: keep it a function of per_token_logps (do not detach them).")
        expect_close(got_grad, want, atol=1e-5, what="d rho / d logp", hint="d rho / d logp = rho.")

    return [
        Case("hand-made: pi_theta / pi_old = 2, 1/2, 1, 0.8", 0.5, hand),
        Case("on-policy (old = logp.detach()): rho == 1, gradient 1 (seed 21)", 0.5, on_policy),
        Case("random (4, 7) log-probs, value and gradient (seed 22)", 2, random_case),
    ]


# --- the clip fractions -----------------------------------------------------------------------
def _as_fractions(answer, what: str) -> torch.Tensor:
    """The learner's dict -> tensor([low, high, region]); a clear Mismatch when it is not such a dict."""
    if not isinstance(answer, dict) or any(key not in answer for key in CLIP_KEYS):
        got = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
        raise Mismatch(f"{what}: return a dict with the keys {list(CLIP_KEYS)} (floats), got {got}")
    try:
        return torch.tensor([float(answer[key]) for key in CLIP_KEYS], dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise Mismatch(f"{what}: each value must be a number (a float or a 0-dim tensor)") from None


def _fractions(low: torch.Tensor, high: torch.Tensor, mean) -> torch.Tensor:
    return torch.stack([mean(low.float()), mean(high.float()), mean((low | high).float())]).double()  # (3,)


def _clip_mistakes(ratio, advantages, mask, eps_low, eps_high) -> list[tuple[str, torch.Tensor]]:
    A = advantages.unsqueeze(1)  # (N, 1)
    low, high = (ratio < 1 - eps_low) & (A < 0), (ratio > 1 + eps_high) & (A > 0)  # (N, T)
    token_mean = lambda x: masked_mean(x, mask)  # noqa: E731
    return [
        (
            "a token counts only where the clip switched its gradient off: low needs A < 0, high needs A > 0 "
            "(rho < 1 - eps with A > 0 still gets its gradient: the min picks rho * A).",
            _fractions((ratio < 1 - eps_low).expand_as(mask), (ratio > 1 + eps_high).expand_as(mask), token_mean),
        ),
        (
            "padding is not a completion token: average over the tokens where completion_mask is 1.",
            _fractions(low.expand_as(mask), high.expand_as(mask), lambda x: x.mean()),
        ),
        (
            "TRL averages over all completion tokens of the batch (sum(x * mask) / sum(mask)), not per completion "
            "and then over completions.",
            _fractions(low.expand_as(mask), high.expand_as(mask), lambda x: masked_mean(x, mask, dim=1).mean()),
        ),
        (
            "the upper bound is 1 + epsilon_high (DAPO's clip-higher), the lower 1 - epsilon_low.",
            _fractions(low, (ratio > 1 + eps_low) & (A > 0), token_mean),
        ),
        (
            "epsilon_low and epsilon_high are swapped: low is rho < 1 - epsilon_low, high is rho > 1 + epsilon_high.",
            _fractions((ratio < 1 - eps_high) & (A < 0), (ratio > 1 + eps_low) & (A > 0), token_mean),
        ),
    ]


@cases("check_clip_fractions", references=[clip_fractions, grpo_loss])
def _clip_cases() -> list[Case]:
    hint = (
        "low = (rho < 1 - eps_low) & (A < 0), high = (rho > 1 + eps_high) & (A > 0), region = low | high, each "
        "averaged over the completion tokens: sum(x * mask) / sum(mask)."
    )

    def compare(ratio, advantages, mask, eps_low, eps_high, what, want=None):
        def run(learner):
            answer = learner(ratio.clone(), advantages.clone(), mask.clone(), eps_low, eps_high)
            got = _as_fractions(answer, what)
            if want is None:
                reference = clip_fractions(ratio, advantages, mask, eps_low, eps_high)
                expected = torch.tensor([reference[key] for key in CLIP_KEYS], dtype=torch.float64)
            else:  # computed by hand
                expected = torch.tensor(want, dtype=torch.float64)
            mistakes = _clip_mistakes(ratio, advantages, mask, eps_low, eps_high)
            expect_close(got, expected, atol=1e-6, what=what, hint=hint, mistakes=mistakes)

        return run

    # by hand: A = +1 / -1, eps 0.2 / 0.28 (clip-higher), the last two tokens of row 1 are padding
    hand_ratio = torch.tensor([[1.3, 1.25, 0.7, 1.0], [0.75, 1.3, 0.5, 0.5]])  # (2, 4)
    hand_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    # row 0 (A > 0): 1.3 > 1.28 is high-clipped; 1.25 is not (< 1.28); 0.7 is not (A > 0 keeps its gradient)
    # row 1 (A < 0): 0.75 < 0.8 is low-clipped (though above 1 - 0.28); 1.3 is not (A < 0 keeps its gradient);
    # the padding does not count
    hand = compare(
        hand_ratio,
        torch.tensor([1.0, -1.0]),
        hand_mask,
        0.2,
        0.28,
        "fractions of the hand-made table",
        want=[1 / 6, 1 / 6, 2 / 6],
    )

    # padding on either side holds ratios that would count; and an empty mask gives 0, not NaN
    padded_ratio = torch.tensor([[0.5, 0.5, 0.7, 1.0, 1.1], [0.5, 1.1, 0.9, 0.6, 0.5]])  # (2, 5)
    padded_mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    padded = compare(
        padded_ratio,
        torch.tensor([-0.5, -2.0]),
        padded_mask,
        0.2,
        0.2,
        "fractions with padding",
        want=[2 / 6, 0.0, 2 / 6],
    )
    empty = compare(
        padded_ratio,
        torch.tensor([-0.5, -2.0]),
        torch.zeros(2, 5),
        0.2,
        0.2,
        "fractions of an all-padding batch",
        want=[0.0, 0.0, 0.0],
    )

    # all advantages positive: a ratio far below 1 - eps is never low-clipped
    positive_ratio = torch.tensor([[0.3, 0.6, 1.5], [0.5, 1.1, 1.4]])  # (2, 3)
    positive = compare(
        positive_ratio,
        torch.tensor([0.5, 1.5]),
        torch.ones(2, 3),
        0.2,
        0.2,
        "fractions with every A > 0",
        want=[0.0, 2 / 6, 2 / 6],
    )

    # a long and a short completion: each token weighs the same (the long one counts 4 times as much)
    long_ratio = torch.tensor([[1.5, 1.5, 1.5, 1.5], [1.0, 0.0, 0.0, 0.0]])  # (2, 4)
    long_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    lengths = compare(
        long_ratio,
        torch.tensor([1.0, 1.0]),
        long_mask,
        0.2,
        0.2,
        "fractions of unequal lengths",
        want=[0.0, 4 / 5, 4 / 5],
    )

    g = seeded(23)
    ratio = torch.exp(0.3 * torch.randn(6, 9, generator=g))  # (6, 9) one update away from pi_old
    advantages = torch.randn(6, generator=g)
    advantages[2] = 0.0  # a group with equal rewards: A = 0 is clipped neither way
    mask = random_mask(6, 9, g)
    random_case = compare(ratio, advantages, mask, 0.2, 0.28, "fractions of random ratios")

    return [
        Case("hand-made: A = +1 / -1, eps 0.2 / 0.28 -> 1/6, 1/6, 1/3", 0.5, hand),
        Case("padding on the left and the right is not counted -> 1/3, 0, 1/3", 0.5, padded),
        Case("an all-padding batch gives 0, not NaN", 0.5, empty),
        Case("every advantage positive: nothing is low-clipped -> 0, 1/3, 1/3", 0.5, positive),
        Case("a 4-token and a 1-token completion: a token mean, 4/5", 0.5, lengths),
        Case("random (6, 9) ratios, a zero advantage, eps 0.2 / 0.28, right padding (seed 23)", 3.5, random_case),
    ]


@check
def check_importance_ratio(importance_ratio: Callable) -> CheckResult:
    """Exercise 11: importance_ratio(per_token_logps (N, T), old_per_token_logps (N, T)) -> (N, T)."""
    return run_check("check_importance_ratio", importance_ratio)


@check
def check_clip_fractions(clip_fractions: Callable) -> CheckResult:
    """Exercise 11: clip_fractions(ratio (N, T), advantages (N,), completion_mask (N, T), epsilon_low, epsilon_high)
    -> {"clip_ratio/low_mean": float, "clip_ratio/high_mean": float, "clip_ratio/region_mean": float}."""
    return run_check("check_clip_fractions", clip_fractions)


EXERCISE = exercise(
    "11_off_policy_ratio",
    [
        check_importance_ratio,
        check_clip_fractions,
    ],
    solution_seconds=50,
    formerly="12_off_policy_ratio",
)

"""Exercise 15: DAPO's dynamic sampling: the filter (groups whose rewards are not all equal) and the refill loop."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minigrpo.advantages import zero_std_groups
from minigrpo.dynamic_sampling import fill_batch, informative_groups
from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, Mismatch, cases, check, run_check, seeded

# the worked example, all right, all wrong, one lucky success (G = 8)
FOUR_GROUPS = [[2.0, 1, 0, 2, 0, 1, 0, 1], [2.0] * 8, [0.0] * 8, [1.0] * 7 + [2.0]]
FILTERS = [informative_groups, zero_std_groups]  # the package's filter, and the test it negates


# --- the filter ---------------------------------------------------------------------------
def _filter_mistakes(grouped: torch.Tensor) -> list[tuple[str, list[bool]]]:
    G = grouped.shape[1]
    all_distinct = torch.tensor([len(set(row)) == G for row in grouped.tolist()])
    return [
        (
            "that keeps the groups DAPO drops: keep a group when its rewards are NOT all equal.",
            zero_std_groups(grouped),
        ),
        (
            "a group with some equal rewards still has signal: drop it only when ALL its rewards are equal "
            "(max == min).",
            all_distinct,
        ),
        ("nothing was dropped: a group whose rewards are all equal must give False.", torch.ones(len(grouped))),
        (
            "a group with one different reward has a small std but still signal: compare max and min, not the std "
            "with a threshold.",
            grouped.std(dim=1) > 0.5,
        ),
    ]


def _expect_mask(got, grouped: torch.Tensor, what: str) -> None:
    if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != (grouped.shape[0],):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        dtype = getattr(got, "dtype", "")
        raise Mismatch(
            f"{what}: expected a bool tensor of shape ({grouped.shape[0]},), one entry per group, got {shape} {dtype}."
        )
    want = ~zero_std_groups(grouped)
    if torch.equal(got, want):
        return
    for hint, wrong in _filter_mistakes(grouped):
        if got.tolist() == torch.as_tensor(wrong).bool().tolist():
            raise Mismatch(f"{what}: expected {want.tolist()}, got {got.tolist()}. {hint}")
    raise Mismatch(f"{what}: expected {want.tolist()}, got {got.tolist()}. Keep group b when max(r_b) != min(r_b).")


@cases("check_informative_groups", references=FILTERS)
def _filter_cases() -> list[Case]:
    def hand(learner):
        grouped = torch.tensor(FOUR_GROUPS)
        _expect_mask(learner(grouped.clone()), grouped, "the four groups of the lesson")

    def pairs(learner):
        grouped = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, -0.5]])
        _expect_mask(learner(grouped.clone()), grouped, "G = 2 groups")

    def random_case(learner):
        grouped = torch.randint(0, 2, (40, 4), generator=seeded(14)).float()  # many constant groups at G = 4
        _expect_mask(learner(grouped.clone()), grouped, "random 0/1 rewards (40, 4)")

    return [
        Case("hand-made: the worked example, all right, all wrong, one lucky success", 0.5, hand),
        Case("G = 2: a pair is kept exactly when its rewards differ", 0.5, pairs),
        Case("random 0/1 rewards, 40 groups of 4 (seed 14)", 2, random_case),
    ]


@check
def check_informative_groups(informative_groups: Callable) -> CheckResult:
    """Exercise 15: informative_groups(grouped_rewards (B, G)) -> (B,) bool."""
    return run_check("check_informative_groups", informative_groups)


# --- the refill loop ----------------------------------------------------------------------
class ScriptedRounds:
    """A generate_round() for the cases: returns the scripted (B, G) rewards of each round in turn, and refuses a
    call past `enough` (the rounds the reference needs), so that a loop that samples once too often fails."""

    def __init__(self, rounds: list, enough: int):
        self.rounds, self.enough, self.calls = rounds, enough, 0

    def __call__(self) -> torch.Tensor:
        if self.calls >= self.enough:
            raise RuntimeError(
                f"generate_round() was called {self.calls + 1} times, but {self.enough} round(s) were enough here: "
                "stop as soon as num_groups_wanted groups are kept, and never go past max_rounds"
            )
        self.calls += 1
        return torch.tensor(self.rounds[self.calls - 1], dtype=torch.float32)


def _reference(rounds: list, wanted: int, max_rounds: int) -> tuple[list[tuple[int, int]], int]:
    return fill_batch(ScriptedRounds(rounds, len(rounds)), wanted, max_rounds)


def _as_answer(got) -> tuple[list[tuple[int, int]], int]:
    try:
        kept, rounds = got
        return [(int(r), int(g)) for r, g in kept], int(rounds)
    except (TypeError, ValueError):
        raise Mismatch(
            f"expected (kept, rounds): a list of (round, group) pairs and the number of rounds, got {got!r}."
        ) from None


def _expect_batch(learner, rounds: list, wanted: int, max_rounds: int, what: str) -> None:
    want_kept, want_rounds = _reference(rounds, wanted, max_rounds)
    got_kept, got_rounds = _as_answer(learner(ScriptedRounds(rounds, want_rounds), wanted, max_rounds))
    if (got_kept, got_rounds) == (want_kept, want_rounds):
        return
    everything = [
        (r, g) for r in range(want_rounds) for g in informative_groups(torch.tensor(rounds[r])).nonzero()[:, 0].tolist()
    ]
    if got_kept == everything and len(everything) > wanted:
        hint = f"keep exactly num_groups_wanted={wanted}: drop the extra groups of the last round."
    elif got_kept == [(r + 1, g) for r, g in want_kept]:
        hint = "number the rounds from 0 (the first round is round 0)."
    elif got_rounds != want_rounds and got_kept == want_kept:
        hint = "rounds is the number of times generate_round() was called."
    else:
        hint = "keep the informative groups of each round, in order, as (round, group) pairs, until you have enough."
    raise Mismatch(f"{what}: expected ({want_kept}, {want_rounds}), got ({got_kept}, {got_rounds}). {hint}")


ROUND_TWO = [[0.0] * 8, [1.0] + [0.0] * 7, [0.0, 1] * 4, [1.0] * 8]  # groups 1 and 2 carry signal


@cases("check_fill_batch", references=[fill_batch, *FILTERS])
def _fill_cases() -> list[Case]:
    def refill(learner):
        _expect_batch(learner, [FOUR_GROUPS, ROUND_TWO], 3, 10, "want 3 groups, 2 + 2 informative in two rounds")

    def full_at_once(learner):
        _expect_batch(learner, [[[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]]], 2, 5, "G = 2, the first round is enough")

    def rounds_run_out(learner):
        _expect_batch(learner, [FOUR_GROUPS] * 2, 5, 2, "want 5 groups, 2 per round, max_rounds=2")

    def nothing_to_keep(learner):
        _expect_batch(learner, [[[1.0, 1.0], [0.0, 0.0]]] * 3, 2, 3, "every group constant, max_rounds=3")

    def random_case(learner):
        g = seeded(41)
        # 8 rounds of 8 groups, G = 4, a reward 1 with probability 0.15: about half the groups carry signal, so the
        # kept pairs differ from draw to draw (at p = 0.5, half of all draws keep round 0's five groups: one answer)
        rounds = torch.bernoulli(torch.full((8, 8, 4), 0.15), generator=g).tolist()
        _expect_batch(learner, rounds, 6, 8, "random 0/1 rewards, want 6 groups of 4, max_rounds=8 (seed 41)")

    return [
        Case("refill: two rounds, the extra group of the last one dropped", 1, refill),
        Case("G = 2: one round fills the batch, no second round", 0.5, full_at_once),
        Case("max_rounds reached: train on what was kept", 0.5, rounds_run_out),
        Case("all groups constant: nothing kept after max_rounds", 0.5, nothing_to_keep),
        Case("random rounds (seed 41)", 3.5, random_case),
    ]


@check
def check_fill_batch(fill_batch: Callable) -> CheckResult:
    """Exercise 15: fill_batch(generate_round, num_groups_wanted, max_rounds) -> (kept [(round, group)], rounds)."""
    return run_check("check_fill_batch", fill_batch)


EXERCISE = exercise(
    "15_dynamic_sampling",
    [
        check_informative_groups,
        check_fill_batch,
    ],
    solution_seconds=45,
    formerly="14_dynamic_sampling",
)

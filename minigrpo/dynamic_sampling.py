"""DAPO's dynamic sampling: over-sample, keep the groups that carry signal, refill the batch.

A group whose G rewards are all equal has advantages exactly 0 (advantages.py):
it costs a rollout and teaches nothing. DAPO (Yu et al., 2025, arXiv 2503.14476,
section 3.2 and Algorithm 1) therefore keeps sampling until the batch holds B
groups whose rewards are *not* all equal:

    kept = []
    for round in 1 .. max_num_gen_batches:
        sample the next B prompts' groups, score them
        kept += the groups whose rewards are not all equal
        if len(kept) >= B: break
    train on kept[:B]            (on all of kept when the rounds ran out first)

``GRPOConfig(dynamic_sampling=True, max_num_gen_batches=...)`` turns this on in
GRPOTrainer (verl, DAPO's reference implementation, calls it
``algorithm.filter_groups`` with the same ``max_num_gen_batches``; TRL 1.16 has
no such option). The pieces, each a small pure function:

- ``informative_groups``: (B, G) rewards -> (B,) bool, the filter.
- ``fill_batch``: the refill loop above, on any function that generates a round.
- ``kept_rows``: the kept groups' rows, as indices into the rounds' rollouts
  joined by ``Rollout.concat`` (padded to a common width); ``Rollout.select``
  takes them.

The trainer composes them: ``GRPOTrainer.collect_informative_rollout`` hands
``fill_batch`` a function that samples and scores one round.

Notation: B prompts (groups) per round, G completions per prompt, N = B * G,
P prompt tokens, T completion tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minigrpo.advantages import zero_std_groups


def informative_groups(grouped_rewards: torch.Tensor) -> torch.Tensor:
    """(B, G) rewards -> (B,) bool: True for the groups DAPO keeps, those whose rewards are not all equal.

    Equal means exactly equal (max == min), the same test that gives a group
    advantages of exactly 0. A group with two equal rewards out of G is kept:
    it still has a non-zero advantage for its other answers.
    """
    assert grouped_rewards.dim() == 2, f"grouped_rewards must be (B, G), got {tuple(grouped_rewards.shape)}"
    return ~zero_std_groups(grouped_rewards)  # (B,)


def fill_batch(
    generate_round: Callable[[], torch.Tensor], num_groups_wanted: int, max_rounds: int
) -> tuple[list[tuple[int, int]], int]:
    """DAPO's refill loop: call `generate_round()` until `num_groups_wanted` informative groups are kept.

    generate_round() samples and scores one round of groups and returns their
    rewards, (B_r, G). Rounds are numbered 0, 1, ...; a kept group is named
    (round, index of the group in its round), in the order generated.

    Stops as soon as `num_groups_wanted` groups are kept, or after `max_rounds`
    rounds, whichever comes first (never a round more). Returns
    (kept, rounds): kept holds at most `num_groups_wanted` groups (the first
    ones: the extra groups of the last round are dropped, as verl does), fewer
    when the rounds ran out; rounds is the number of rounds generated.
    """
    if num_groups_wanted < 1 or max_rounds < 1:
        raise ValueError(f"num_groups_wanted={num_groups_wanted}, max_rounds={max_rounds}: both must be >= 1.")
    kept: list[tuple[int, int]] = []
    rounds = 0
    while len(kept) < num_groups_wanted and rounds < max_rounds:
        keep = informative_groups(generate_round())  # (B_r,)
        kept += [(rounds, group) for group in keep.nonzero().flatten().tolist()]
        rounds += 1
    return kept[:num_groups_wanted], rounds


def kept_rows(kept: list[tuple[int, int]], num_groups: int, num_generations: int) -> torch.Tensor:
    """(n,) int64: the rows of the kept groups' completions in the rounds' rollouts joined, in the order kept.

    Round r's group b holds rows (r * B + b) * G ... (r * B + b) * G + G - 1 (group-major, B groups a round), so
    one index selects the rollout's rows, the rewards and every logged column alike."""
    groups = torch.tensor([r * num_groups + b for r, b in kept], dtype=torch.long)  # (n_groups,)
    return (groups.unsqueeze(1) * num_generations + torch.arange(num_generations)).flatten()  # (n_groups * G,)

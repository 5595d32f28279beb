"""Exercise 02: the completion mask from generated ids: 1 up to and including the first EOS, 0 after.

The learner writes `completion_mask(completion_ids, eos_token_ids, pad_token_id) -> (N, T)`; any dtype whose
values are 0 and 1 (bool, int, float) is accepted, as the package's masked means accept any. The cases cover
what generation really produces: EOS then padding, an EOS at position 0 (an empty completion), no EOS (truncated
at max_completion_length), tokens after the first EOS, a pad token that is an EOS (Qwen's <|endoftext|>; many
tokenizers set pad = eos), and two EOS ids (Qwen2.5 stops on <|im_end|> and <|endoftext|>).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, cases, check, expect_close, run_check, seeded
from minigrpo.rollout import completion_mask_from_eos

IM_END, ENDOFTEXT = 151645, 151643
"""Qwen2.5's <|im_end|> (the chat EOS) and <|endoftext|> (its pad token, and an EOS in its generation config)."""


def reference(completion_ids: torch.Tensor, eos_token_ids: list[int], pad_token_id: int) -> torch.Tensor:
    """The package's mask, (N, T) long: the exercise's answer key."""
    return completion_mask_from_eos(completion_ids, eos_token_ids)[0]


def _up_to(position: torch.Tensor, T: int, inclusive: bool = True) -> torch.Tensor:
    """(N,) positions -> (N, T) mask that is 1 at columns <= position (< position when not inclusive)."""
    columns = torch.arange(T).unsqueeze(0)  # (1, T)
    return (columns <= position.unsqueeze(1) if inclusive else columns < position.unsqueeze(1)).long()  # (N, T)


MISTAKES = {
    "argmax": "a row with no EOS (cut at max_completion_length) keeps every token: argmax of an all-False row is 0, "
    "so guard it with is_eos.any(dim=1).",
    "truncated_empty": "a row with no EOS was cut at max_completion_length: it keeps all T tokens, not none.",
    "ids_not_pad": "`ids != pad_token_id` drops the EOS when the pad token is an EOS (Qwen's <|endoftext|>; many "
    "tokenizers set pad = eos): find the first EOS position instead.",
    "excludes_eos": "include the EOS token itself: the model must learn to stop, so the mask is 1 up to AND "
    "including the first EOS (an empty completion keeps exactly its EOS).",
    "last_eos": "the FIRST EOS ends the completion: whatever follows it was never part of the answer.",
    "first_id_only": "every id in eos_token_ids ends a completion (Qwen2.5 stops on <|im_end|> and <|endoftext|>), "
    "not only eos_token_ids[0].",
}


def _mistakes(ids: torch.Tensor, eos_token_ids: list[int], pad_token_id: int, order: list[str]):
    """What each known wrong implementation returns on `ids`, with its hint, in the order this case asks them."""
    N, T = ids.shape
    is_eos = torch.isin(ids, torch.tensor(eos_token_ids))  # (N, T)
    has_eos = is_eos.any(dim=1)  # (N,)
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full((N,), T))  # (N,)
    last = torch.where(has_eos, T - 1 - is_eos.flip(1).int().argmax(dim=1), torch.full((N,), T))  # (N,)
    wrong = {
        "argmax": _up_to(is_eos.int().argmax(dim=1), T),
        "truncated_empty": _up_to(torch.where(has_eos, first, torch.full((N,), -1)), T),
        "ids_not_pad": (ids != pad_token_id).long(),
        "excludes_eos": _up_to(first, T, inclusive=False),
        "last_eos": _up_to(last, T),
        "first_id_only": reference(ids, eos_token_ids[:1], pad_token_id),
    }
    return [(MISTAKES[name], wrong[name]) for name in order]


def _compare(ids: torch.Tensor, eos_token_ids: list[int], pad_token_id: int, what: str, hint: str, order: list[str]):
    def run(learner):
        got = learner(ids.clone(), list(eos_token_ids), pad_token_id)
        want = reference(ids, eos_token_ids, pad_token_id)
        mistakes = _mistakes(ids, eos_token_ids, pad_token_id, order)
        expect_close(got, want, atol=0, what=what, hint=hint, mistakes=mistakes)

    return run


def _random_batch(generator: torch.Generator, N: int = 8, T: int = 12) -> torch.Tensor:
    """(N, T) ids as `generate` leaves them: text tokens 5..29, one of EOS 2 / 3 at a random place, then pad 0;
    row 0 ends at position 0 (an empty completion), row 1 has no EOS (truncated)."""
    ids = torch.randint(5, 30, (N, T), generator=generator)  # (N, T)
    ends = torch.randint(0, T + 1, (N,), generator=generator)  # (N,): T means no EOS
    ends[0], ends[1] = 0, T
    eos = torch.randint(2, 4, (N,), generator=generator)  # (N,)
    for row, end in enumerate(ends.tolist()):
        if end < T:
            ids[row, end] = eos[row]
            ids[row, end + 1 :] = 0
    return ids


@cases("check_completion_mask", references=[completion_mask_from_eos, reference])
def _completion_mask_cases() -> list[Case]:
    EOS, PAD = 2, 0
    return [
        Case(
            "EOS then padding; an EOS at position 0 keeps exactly that token",
            0.5,
            _compare(
                torch.tensor([[7, 8, EOS, PAD, PAD], [EOS, PAD, PAD, PAD, PAD], [9, EOS, PAD, PAD, PAD]]),
                [EOS],
                PAD,
                "mask of [7 8 EOS pad pad], [EOS pad pad pad pad], [9 EOS pad pad pad]",
                "expected [1 1 1 0 0], [1 0 0 0 0], [1 1 0 0 0].",
                ["excludes_eos", "argmax"],
            ),
        ),
        Case(
            "no EOS: a truncated completion keeps every token",
            0.5,
            _compare(
                torch.tensor([[5, 6, 7, 8], [6, EOS, PAD, PAD]]),
                [EOS],
                PAD,
                "mask of [5 6 7 8] (truncated) and [6 EOS pad pad]",
                "expected [1 1 1 1] and [1 1 0 0].",
                ["argmax", "truncated_empty", "excludes_eos"],
            ),
        ),
        Case(
            "tokens after the first EOS (even another EOS) are not part of the completion",
            0.5,
            _compare(
                torch.tensor([[5, EOS, 6, 7, EOS], [EOS, 7, EOS, PAD, PAD]]),
                [EOS],
                PAD,
                "mask of [5 EOS 6 7 EOS] and [EOS 7 EOS pad pad]",
                "expected [1 1 0 0 0] and [1 0 0 0 0].",
                ["last_eos", "ids_not_pad", "excludes_eos", "argmax"],
            ),
        ),
        Case(
            "pad == EOS (pad_token = eos_token): the EOS still counts, the padding does not",
            0.5,
            _compare(
                torch.tensor([[5, 6, EOS, EOS, EOS], [5, EOS, EOS, EOS, EOS], [EOS, EOS, EOS, EOS, EOS]]),
                [EOS],
                EOS,
                "mask with pad_token_id == EOS",
                "expected [1 1 1 0 0], [1 1 0 0 0], [1 0 0 0 0].",
                ["ids_not_pad", "excludes_eos", "last_eos", "argmax"],
            ),
        ),
        Case(
            "Qwen2.5: EOS ids <|im_end|> and <|endoftext|>, pad <|endoftext|>",
            0.5,
            _compare(
                torch.tensor([[40, 41, IM_END, ENDOFTEXT, ENDOFTEXT], [40, ENDOFTEXT] + [ENDOFTEXT] * 3, [40] * 5]),
                [IM_END, ENDOFTEXT],
                ENDOFTEXT,
                "mask of Qwen ids (eos_token_ids = [151645, 151643], pad 151643)",
                "expected [1 1 1 0 0], [1 1 0 0 0], [1 1 1 1 1].",
                ["first_id_only", "ids_not_pad", "excludes_eos", "argmax", "last_eos"],
            ),
        ),
        Case(
            "random (8, 12) batch, EOS ids 2 and 3, pad 0 (seed 13), vs the reference",
            3.5,
            _compare(
                _random_batch(seeded(13)),
                [2, 3],
                0,
                "mask of a random batch",
                "1 up to and including the first EOS (any of eos_token_ids), 0 after; all 1 without an EOS.",
                ["argmax", "excludes_eos", "first_id_only", "truncated_empty", "last_eos"],
            ),
        ),
    ]


@check
def check_completion_mask(completion_mask: Callable) -> CheckResult:
    """Exercise 02: completion_mask(completion_ids (N, T), eos_token_ids list[int], pad_token_id int) -> (N, T) 0/1."""
    return run_check("check_completion_mask", completion_mask)


EXERCISE = exercise("02_completion_mask", [check_completion_mask], solution_seconds=55, formerly="11_completion_mask")

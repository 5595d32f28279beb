"""Rewards that can be gamed (lessons 02c and 07): reward hacking and length growth.

Each has TRL's reward signature, ``(prompts, completions, completion_ids,
**dataset columns) -> list[float]``, so it plugs into GRPOTrainer like the
honest rewards of ``tasks.arithmetic``. Each looks reasonable and pays for
something other than a right answer; a policy under GRPO finds that out.

- ``number_anywhere_reward``: pays for hedging (several guesses in the tag).
- ``at_least_reward``: a verifier with ``>=`` where ``==`` was meant.
- ``make_length_bonus``: pays for not stopping.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from minigrpo.tasks.arithmetic import completion_text, extract_answer

_ANY_NUMBER = re.compile(r"-?\d{1,30}")


def number_anywhere_reward(prompts, completions, completion_ids=None, *, answer, **columns) -> list[float]:
    """A naive reward: 1.0 when the right number appears *anywhere* in the completion.

    It looks reasonable and it is wrong: "<answer>18 19 20</answer>" scores 1,
    so a policy that lists several guesses is paid for hedging. Use it to see
    reward hacking; the honest reward is tasks.arithmetic.correctness_reward.
    """
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else str(completion[-1]["content"])
        scores.append(float(str(expected).strip() in _ANY_NUMBER.findall(text)))
    return scores


def at_least_reward(prompts, completions, completion_ids=None, *, answer, **columns) -> list[float]:
    """A verifier with a one-character bug: 1.0 when the answer is >= the right one (`>=` where `==` was meant).

    Every wrong answer that is too big is paid as if it were right, and the
    policy finds that quickly: it only has to make its numbers bigger.
    """
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        predicted = extract_answer(completion_text(completion))
        scores.append(float(predicted is not None and predicted >= int(expected)))
    return scores


def make_length_bonus(max_completion_length: int) -> Callable:
    """A reward for "thoroughness": |o_i| / max_completion_length, from 0 (empty) to 1 (hit the limit).

    Added to the correctness reward it looks harmless, but a completion that
    never stops earns the full bonus, and a policy can learn not to stop much
    more easily than it can learn to add.
    """
    if max_completion_length < 1:
        raise ValueError(f"max_completion_length={max_completion_length}: it must be >= 1.")

    def length_bonus(prompts, completions, completion_ids, **columns) -> list[float]:
        return [min(len(ids), max_completion_length) / max_completion_length for ids in completion_ids]

    return length_bonus

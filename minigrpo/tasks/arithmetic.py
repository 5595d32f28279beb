"""The arithmetic task: seeded problems, the prompt, answer parsing and rewards.

A problem is "12 + 7"; the model is asked to put its final answer in
``<answer></answer>`` tags. The reward functions have TRL's signature

    f(prompts, completions, completion_ids, **columns) -> list[float]

so the same functions plug into minigrpo's trainer and into TRL's GRPOTrainer.
``columns`` carries the dataset's other columns; here the one that matters is
``answer``.

Model output is parsed with regular expressions into an int. It is never
passed to ``eval()``: a completion is untrusted text (``"__import__('os')"``).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from datasets import Dataset

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
FORMAT_INSTRUCTION = "Give the answer in <answer></answer> tags."
# The training reward of `python -m minigrpo train`, the lessons and the benches: [correctness_reward,
# format_reward] weighted 1 and 0.1 (a right sum is worth 1, the <answer> format a small 0.1 bonus).
REWARD_WEIGHTS = (1.0, 0.1)

# A number: optional minus sign, then digits. Bounded repetition keeps the
# regex linear-time on any input (no nested quantifiers).
_NUMBER = r"-?\d{1,30}"
_TAG_RE = re.compile(rf"<answer>\s{{0,10}}({_NUMBER})\s{{0,10}}</answer>")
_LAST_NUMBER_RE = re.compile(_NUMBER)
_WELL_FORMED_RE = re.compile(rf"<answer>\s{{0,10}}{_NUMBER}\s{{0,10}}</answer>\s*")


# --- problems ---------------------------------------------------------------------
def is_test_problem(a: int, op: str, b: int, test_fraction: float = 0.1) -> bool:
    """Deterministic train/test split by a hash of the problem, so no test problem is ever trained on."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < test_fraction


def make_question(a: int, op: str, b: int) -> str:
    """The user's message: 'What is 12 + 7? Give the answer in <answer></answer> tags.'"""
    return f"What is {a} {op} {b}? {FORMAT_INSTRUCTION}"


def make_arithmetic_dataset(
    n: int = 2000,
    split: str = "train",
    seed: int = 0,
    min_operand: int = 0,
    max_operand: int = 99,
    operators: Sequence[str] = ("+",),
    system_prompt: str | None = None,
) -> Dataset:
    """Seeded arithmetic problems as a `datasets.Dataset`.

    Columns: ``prompt`` (chat messages, ready for ``apply_chat_template``),
    ``answer`` (the exact result as a string), ``question`` (the bare "12 + 7").
    Difficulty knobs: the operand range and the operators ("+", "-", "*").
    ``split`` picks from disjoint halves of problem space ("train" / "test").
    """
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r}: use 'train' or 'test'.")
    unknown = [op for op in operators if op not in OPERATORS]
    if unknown or not operators:
        raise ValueError(f"operators={list(operators)}: choose from {list(OPERATORS)}.")
    if min_operand > max_operand:
        raise ValueError(f"min_operand={min_operand} > max_operand={max_operand}: swap them.")
    rng = random.Random(f"{seed}-{split}")
    rows = {"prompt": [], "answer": [], "question": []}
    for _ in range(n):
        a, op, b = _sample_problem(rng, min_operand, max_operand, operators, want_test=split == "test")
        messages = [{"role": "user", "content": make_question(a, op, b)}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        rows["prompt"].append(messages)
        rows["answer"].append(str(OPERATORS[op](a, b)))
        rows["question"].append(f"{a} {op} {b}")
    return Dataset.from_dict(rows)


def _sample_problem(rng: random.Random, lo: int, hi: int, operators: Sequence[str], want_test: bool):
    for _ in range(10_000):
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(list(operators))
        if is_test_problem(a, op, b) == want_test:
            return a, op, b
    raise ValueError(f"operand range [{lo}, {hi}] is too small to split into train and test: widen it.")


# --- parsing ----------------------------------------------------------------------
def completion_text(completion) -> str:
    """A completion as text: TRL passes strings, or [{'role': 'assistant', 'content': ...}] for chats."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def extract_answer(text: str, require_tag: bool = False) -> int | None:
    """The model's final answer as an int, or None when there is none.

    The number in the last ``<answer>...</answer>`` tag if there is one;
    otherwise (unless ``require_tag``) the last number in the text. Pure regex:
    never eval() model output.
    """
    tags = _TAG_RE.findall(text)
    if tags:
        return int(tags[-1])
    if require_tag:
        return None
    numbers = _LAST_NUMBER_RE.findall(text)
    return int(numbers[-1]) if numbers else None


def is_well_formed(text: str) -> bool:
    """Exactly one <answer>N</answer> tag, and nothing after it but whitespace."""
    return (
        text.count("<answer>") == 1 and _WELL_FORMED_RE.search(text) is not None and text.rstrip().endswith("</answer>")
    )


def _answers_match(predicted: int | None, answer) -> bool:
    try:
        return predicted is not None and predicted == int(str(answer).strip())
    except ValueError:
        return False


# --- rewards (TRL signature) ------------------------------------------------------
def correctness_reward(prompts, completions, completion_ids=None, *, answer, **columns) -> list[float]:
    """1.0 when the final number (tagged, or else the last one) equals the answer, else 0.0."""
    texts = [completion_text(c) for c in completions]
    return [float(_answers_match(extract_answer(t), a)) for t, a in zip(texts, answer, strict=True)]


def format_reward(prompts, completions, completion_ids=None, **columns) -> list[float]:
    """1.0 when the completion ends in exactly one well-formed <answer>N</answer> tag, else 0.0."""
    return [float(is_well_formed(completion_text(c))) for c in completions]


def graded_reward(prompts, completions, completion_ids=None, *, answer, **columns) -> list[float]:
    """The course's worked example: 2 correct and well-formed, 1 well-formed but wrong, 0 otherwise."""
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion_text(completion)
        if not is_well_formed(text):
            scores.append(0.0)
        elif _answers_match(extract_answer(text, require_tag=True), expected):
            scores.append(2.0)
        else:
            scores.append(1.0)
    return scores


# --- the course's worked example ------------------------------------------------------
# Eight answers to "What is 12 + 7?", scored by graded_reward: 2 / 1 / 0.
# Rewards [2, 1, 0, 2, 0, 1, 0, 1], mean 7 / 8 = 0.875. Lessons, exercises and
# tests all use this one group.
WORKED_EXAMPLE_PROMPT = [{"role": "user", "content": make_question(12, "+", 7)}]
WORKED_EXAMPLE_ANSWER = "19"
WORKED_EXAMPLE_COMPLETIONS = [
    "<answer>19</answer>",  # correct and well-formed: 2
    "<answer>18</answer>",  # well-formed, wrong: 1
    "19",  # right number, no tag: 0
    "12 + 7 = 19, so <answer>19</answer>",  # correct and well-formed: 2
    "<answer>nineteen</answer>",  # not a number: 0
    "<answer>17</answer>",  # well-formed, wrong: 1
    "The answer is <answer>19",  # unclosed tag: 0
    "<answer>21</answer>",  # well-formed, wrong: 1
]
WORKED_EXAMPLE_REWARDS = (2.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 1.0)  # graded_reward of WORKED_EXAMPLE_COMPLETIONS

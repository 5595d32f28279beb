r"""The arithmetic task: seeded problems, the prompt, answer parsing and rewards.

A problem is "12 + 7"; the model is asked to put its final answer in
``<answer></answer>`` tags. The reward functions have TRL's signature

    f(prompts, completions, completion_ids, **columns) -> list[float]

so the same functions plug into minigrpo's trainer and into TRL's GRPOTrainer.
``columns`` carries the dataset's other columns; here the one that matters is
``answer``.

Model output is parsed with regular expressions into an int. It is never
passed to ``eval()``: a completion is untrusted text (``"__import__('os')"``).

What counts as an answer (one rule for extraction and for the format reward):

* An answer is an ASCII integer, ``-?[0-9]{1,18}`` (at most MAX_ANSWER_DIGITS
  digits, so it always fits in an int64), standing alone as a number-like token.
* A number-like token is a run of digits with its sign, separators and
  exponent: ``19``, ``-4``, ``5.0``, ``19.5``, ``.5``, ``1,000``, ``1e309``,
  ``１９`` (full-width), ``١٩`` (Arabic-Indic). Only the first two are integers;
  every other token is read as "not an integer", so the answer is None. It is
  never cut down to the integer hiding inside it ("19.5" is not 5, "1,000" is
  not 0, "1e309" is not 309, a 31-digit number ending in 19 is not 19).
* "5.0" is None too, not 5: the task asks for an integer, and "no integer"
  is the simpler honest reading than deciding which decimals are whole.
* A final full stop or comma is punctuation, not a decimal: "It is 19." is 19
  and "19, so" is 19 (a separator counts only with a digit after it).
* The last token decides: "12 + 7 = 19.5" is None, not 7. ``12-5`` is read
  as the tokens 12 and -5 (the minus sign belongs to the number after it).

Why so strict: Python's ``\d`` matches every Unicode digit, and an unanchored
``-?\d+`` finds an integer inside any longer number; both let a completion
that never wrote the right integer earn the reward.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from datasets import Dataset

from minigrpo.rewards import completion_text

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
FORMAT_INSTRUCTION = "Give the answer in <answer></answer> tags."
# The training reward of `python -m minigrpo train`, the lessons and the benches: [correctness_reward,
# format_reward] weighted 1 and 0.1 (a right sum is worth 1, the <answer> format a small 0.1 bonus).
REWARD_WEIGHTS = (1.0, 0.1)

MAX_ANSWER_DIGITS = 18  # the longest integer an answer may have: 18 digits always fit in an int64

# A number-like token (see the module docstring). \d here is deliberately Unicode, so "１９" is one token that
# then fails the ASCII check. Each separator needs a digit after it, so the pattern is unambiguous: linear time.
# The lookbehinds stop a token starting inside a longer number ("1e5e3" must not yield 3).
_NUMBER_LIKE = r"(?<!\d[eE])(?<!\d[eE][+-])-?\.?\d+(?:[.,]\d+)*(?:[eE][+-]?\d+)?"
_INTEGER = rf"-?[0-9]{{1,{MAX_ANSWER_DIGITS}}}"
_NUMBER_LIKE_RE = re.compile(_NUMBER_LIKE)
_INTEGER_RE = re.compile(_INTEGER)
_TAG_RE = re.compile(rf"<answer>\s{{0,10}}({_NUMBER_LIKE})\s{{0,10}}</answer>")
# The format reward: the tag holds an integer and ends the text. `search` starts only at "<answer>", so \s*\Z is
# tried once per tag.
_WELL_FORMED_RE = re.compile(rf"<answer>\s{{0,10}}{_INTEGER}\s{{0,10}}</answer>\s*\Z")


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
def parse_integer(token: str) -> int | None:
    """A number-like token as an int when it is an ASCII integer of at most MAX_ANSWER_DIGITS digits, else None.

    parse_integer("-4") == -4; "5.0", "1,000", "1e309", "１９" and a 19-digit number give None.
    """
    return int(token) if _INTEGER_RE.fullmatch(token) else None


def extract_answer(text: str, require_tag: bool = False) -> int | None:
    """The model's final answer as an int, or None when there is none.

    The number in the last ``<answer>...</answer>`` tag if there is one;
    otherwise (unless ``require_tag``) the last number-like token in the text.
    Either way it must be an integer (module docstring): "<answer>19.5</answer>"
    is None, not 5. Pure regex: never eval() model output.
    """
    tags = _TAG_RE.findall(text)
    if tags:
        return parse_integer(tags[-1])
    if require_tag:
        return None
    tokens = _NUMBER_LIKE_RE.findall(text)
    return parse_integer(tokens[-1]) if tokens else None


def is_well_formed(text: str) -> bool:
    """Exactly one <answer>N</answer> tag holding an integer (module docstring), then nothing but whitespace."""
    return text.count("<answer>") == 1 and _WELL_FORMED_RE.search(text) is not None


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

"""The calculator task: 3-digit x 3-digit multiplication, with a calculator tool the model may call.

A problem is "What is 123 * 456?" and the tools model (``load_model_and_tokenizer("tiny-tools")``) may answer
in one of two ways:

* call the tool: ``<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>``,
  read its result in the ``<tool_response>`` turn, then answer ``<answer>56088</answer>``;
* guess: answer ``<answer>N</answer>`` at once.

Why multiplication: the tiny model cannot multiply two 3-digit numbers in its head (a 5- or 6-digit product it
never sees computed), so a direct answer is almost always wrong, while copying the question's expression into the
call and the tool's result into the answer is something it can do. The reward is right only through the tool:
GRPO has to raise the rate of calling it, and the gain shows as accuracy.

The reward is the arithmetic task's ``correctness_reward``: it reads the last message of a completion
(``rewards.completion_text``), which for a conversation ``[assistant with tool_calls, tool, assistant]`` is the
final answer. Problems are split into train and test by arithmetic's hash (``is_test_problem``).

The tool never calls ``eval()`` on model output: it walks the expression's syntax tree and allows integers,
``+ - *``, unary minus and parentheses only, with bounds on the text's length and on every intermediate result,
so that a model's call can neither run code nor make the tool hang.
"""

from __future__ import annotations

import ast
import random

from datasets import Dataset

from minigrpo.tasks.arithmetic import correctness_reward, is_test_problem

__all__ = ["calculator", "make_calculator_dataset", "CALCULATOR_REWARD_FUNCS", "CALCULATOR_REWARD_WEIGHTS"]

MAX_EXPRESSION_CHARS = 100
MAX_ABS_VALUE = 10**18  # every intermediate result stays below this in absolute value (it fits an int64)
MIN_OPERAND, MAX_OPERAND = 100, 999  # 3-digit operands

# The training reward: a right final answer is worth 1. No format bonus: the answer tag is learnt in pretraining,
# and the tool call is rewarded only through the answer it leads to.
CALCULATOR_REWARD_FUNCS = (correctness_reward,)
CALCULATOR_REWARD_WEIGHTS = (1.0,)

_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
_ALLOWED = "integers, + - *, unary minus and parentheses"


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: The expression to evaluate, with integers, +, -, * and parentheses, e.g. "123 * 456".

    Returns:
        The exact integer result, as a string.
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, not {type(expression).__name__}.")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression has {len(expression)} characters: at most {MAX_EXPRESSION_CHARS} are allowed.")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"cannot parse {expression!r}: only {_ALLOWED} are allowed.") from error
    return str(_evaluate(tree.body))


def _evaluate(node: ast.AST) -> int:
    """The value of one node of the syntax tree; anything but the allowed nodes is a ValueError."""
    if isinstance(node, ast.Constant) and type(node.value) is int:  # not bool, float, str
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = -_evaluate(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    else:
        raise ValueError(f"{type(node).__name__} is not allowed: only {_ALLOWED} are.")
    if abs(value) >= MAX_ABS_VALUE:
        raise ValueError(f"a result reaches {MAX_ABS_VALUE:.0e} in absolute value: too large for the calculator.")
    return value


def make_calculator_dataset(n: int = 2000, split: str = "train", seed: int = 0) -> Dataset:
    """Seeded 3-digit x 3-digit multiplications as a `datasets.Dataset`.

    Columns: ``prompt`` ([{"role": "user", "content": "What is 123 * 456?"}]: no format instruction, the tools
    model learnt the format in pretraining), ``answer`` (the product as a string), ``question`` ("123 * 456").
    ``split`` picks from disjoint halves of problem space ("train" / "test"), by arithmetic's hash.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r}: use 'train' or 'test'.")
    rng = random.Random(f"calculator-{seed}-{split}")
    rows = {"prompt": [], "answer": [], "question": []}
    while len(rows["answer"]) < n:
        a, b = rng.randint(MIN_OPERAND, MAX_OPERAND), rng.randint(MIN_OPERAND, MAX_OPERAND)
        if is_test_problem(a, "*", b) != (split == "test"):
            continue
        rows["prompt"].append([{"role": "user", "content": f"What is {a} * {b}?"}])
        rows["answer"].append(str(a * b))
        rows["question"].append(f"{a} * {b}")
    return Dataset.from_dict(rows)

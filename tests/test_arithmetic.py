"""The arithmetic task: dataset, answer parsing (fuzzed), reward functions."""

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.tasks import arithmetic
from minigrpo.tasks.arithmetic import (
    MAX_ANSWER_DIGITS,
    WORKED_EXAMPLE_ANSWER,
    WORKED_EXAMPLE_COMPLETIONS,
    correctness_reward,
    extract_answer,
    format_reward,
    graded_reward,
    is_test_problem,
    is_well_formed,
    make_arithmetic_dataset,
    parse_integer,
)


def test_dataset_columns_and_prompt_format():
    data = make_arithmetic_dataset(n=20, seed=3)
    assert data.column_names == ["prompt", "answer", "question"]
    first = data[0]
    assert first["prompt"][-1]["role"] == "user"
    assert first["question"] in first["prompt"][-1]["content"]
    a, op, b = first["question"].split()
    assert int(first["answer"]) == int(a) + int(b)


def test_dataset_is_seeded_and_splits_are_disjoint():
    assert make_arithmetic_dataset(n=50, seed=1)["question"] == make_arithmetic_dataset(n=50, seed=1)["question"]
    assert make_arithmetic_dataset(n=50, seed=1)["question"] != make_arithmetic_dataset(n=50, seed=2)["question"]
    train = set(make_arithmetic_dataset(n=2000, split="train")["question"])
    test = set(make_arithmetic_dataset(n=300, split="test")["question"])
    assert not train & test


def test_difficulty_knobs():
    data = make_arithmetic_dataset(n=200, min_operand=10, max_operand=20, operators=("-", "*"))
    for question, answer in zip(data["question"], data["answer"], strict=False):
        a, op, b = question.split()
        assert op in "-*" and 10 <= int(a) <= 20 and 10 <= int(b) <= 20
        assert int(answer) == (int(a) - int(b) if op == "-" else int(a) * int(b))


def test_bad_dataset_options_are_clear():
    with pytest.raises(ValueError, match="operators"):
        make_arithmetic_dataset(n=1, operators=("/",))
    with pytest.raises(ValueError, match="swap"):
        make_arithmetic_dataset(n=1, min_operand=5, max_operand=1)


@pytest.mark.parametrize(
    "text, lenient, strict",
    [
        ("<answer>19</answer>", 19, 19),
        ("12 + 7 = 19", 19, None),
        ("first 3 then <answer> -4 </answer>", -4, -4),
        ("<answer>1</answer> no, <answer>2</answer>", 2, 2),
        ("no number here", None, None),
        ("<answer>nineteen</answer>", None, None),
        ("", None, None),
        ("__import__('os').system('echo hi')", None, None),
    ],
)
def test_extract_answer(text, lenient, strict):
    assert extract_answer(text) == lenient
    assert extract_answer(text, require_tag=True) == strict


LONG_NUMBER_ENDING_IN_19 = "1" * 31 + "19"


@pytest.mark.parametrize(
    "text, lenient, strict",
    [
        # Not integers: the whole token is rejected, never cut down to the integer inside it.
        ("5.0", None, None),
        ("19.5", None, None),
        ("12 + 7 = 19.5", None, None),  # the last token decides: not 7
        (".5", None, None),
        ("1,000", None, None),
        ("1e309", None, None),
        ("1e-5", None, None),
        ("1E+3", None, None),
        ("1e5e3", None, None),
        (LONG_NUMBER_ENDING_IN_19, None, None),
        ("9" * (MAX_ANSWER_DIGITS + 1), None, None),
        ("\uff11\uff19", None, None),  # full-width 19
        ("\u0661\u0669", None, None),  # Arabic-Indic 19
        ("1\u0669", None, None),  # ASCII 1 then an Arabic-Indic 9
        ("<answer>19.5</answer>", None, None),
        ("<answer>5.0</answer> 4", None, None),  # a tag decides, even when it holds no integer
        (f"<answer>{LONG_NUMBER_ENDING_IN_19}</answer>", None, None),
        ("<answer>\uff11\uff19</answer>", None, None),
        # Integers, with punctuation around them.
        ("It is 19.", 19, None),
        ("19, so the answer", 19, None),
        ("12-5", -5, None),
        ("9" * MAX_ANSWER_DIGITS, int("9" * MAX_ANSWER_DIGITS), None),
        ("<answer>19</answer>.", 19, 19),
    ],
)
def test_only_ascii_integers_are_answers(text, lenient, strict):
    assert extract_answer(text) == lenient
    assert extract_answer(text, require_tag=True) == strict


@pytest.mark.parametrize(
    "token, value", [("19", 19), ("-4", -4), ("007", 7), ("5.0", None), ("1,000", None), ("1e3", None), ("", None)]
)
def test_parse_integer(token, value):
    assert parse_integer(token) == value


@pytest.mark.parametrize(
    "answer_text",
    ["5.0", "19.5", "1,000", "1e309", LONG_NUMBER_ENDING_IN_19, "\uff11\uff19", "\u0661\u0669", "1\u0669"],
)
def test_non_integers_earn_no_reward(answer_text):
    text = f"<answer>{answer_text}</answer>"
    assert not is_well_formed(text)
    assert format_reward([None], [text]) == [0.0]
    assert correctness_reward([None], [text], answer=["19"]) == [0.0]
    assert correctness_reward([None], [f"The answer is {answer_text}"], answer=["19"]) == [0.0]
    assert graded_reward([None], [text], answer=["19"]) == [0.0]


def test_a_stray_closing_tag_is_not_well_formed():
    assert not is_well_formed("<answer>19</answer></answer>")
    assert is_well_formed("<answer>19</answer>  \n")


def test_extract_answer_never_calls_eval(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval() must never see model output")

    monkeypatch.setattr("builtins.eval", forbidden)
    assert extract_answer("<answer>2+2</answer> 4") == 4
    tree = ast.parse(open(arithmetic.__file__).read())
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not called & {"eval", "exec", "compile"}


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parsing_arbitrary_text_never_raises(text):
    value = extract_answer(text)
    assert value is None or (isinstance(value, int) and abs(value) < 10**MAX_ANSWER_DIGITS)
    assert extract_answer(text, require_tag=True) is None or "<answer>" in text
    assert format_reward([text], [text])[0] in (0.0, 1.0)
    assert graded_reward([text], [text], answer=["7"])[0] in (0.0, 1.0, 2.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(-(10**12), 10**12), st.text(alphabet="abc <>/ \n", max_size=20))
def test_tagged_numbers_round_trip(number, noise):
    text = f"{noise}<answer>{number}</answer>"
    assert extract_answer(text, require_tag=True) == number
    assert correctness_reward([""], [text], answer=[str(number)]) == [1.0]


def test_worked_example_scores_2_1_0_with_mean_0875():
    n = len(WORKED_EXAMPLE_COMPLETIONS)
    scores = graded_reward([None] * n, WORKED_EXAMPLE_COMPLETIONS, answer=[WORKED_EXAMPLE_ANSWER] * n)
    assert scores == [2.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 1.0]
    assert sum(scores) / n == 0.875


def test_format_and_correctness_rewards():
    completions = ["<answer>19</answer>", "19", "<answer>19</answer> extra", "<answer>19</answer><answer>19</answer>"]
    assert format_reward([None] * 4, completions) == [1.0, 0.0, 0.0, 0.0]
    assert correctness_reward([None] * 4, completions, answer=["19"] * 4) == [1.0, 1.0, 1.0, 1.0]


def test_reward_hacking_repeating_many_numbers_does_not_pay():
    hack = "<answer>18</answer> <answer>19</answer> <answer>20</answer>"
    assert graded_reward([None], [hack], answer=["19"]) == [0.0]


def test_rewards_accept_trl_conversational_completions():
    chat = [[{"role": "assistant", "content": "<answer>19</answer>"}]]
    assert correctness_reward([None], chat, answer=["19"]) == [1.0]
    assert format_reward([None], chat) == [1.0]


def test_split_is_deterministic():
    assert is_test_problem(12, "+", 7) == is_test_problem(12, "+", 7)

"""The calculator task: the tool and its refusals, the problems, the reward on a tool-calling conversation, the
tools tokenizer (saved and loaded, TRL's checks) and the bundled tools model, and the SFT rows' loss mask."""

import json

import pytest
from transformers import AutoTokenizer
from transformers.utils import get_json_schema

from minigrpo.course.pretrain import calculator_call, tool_suffix, tools_sft_batch, tools_sft_pieces
from minigrpo.models import TINY_TOOLS_MODEL_DIR, load_model_and_tokenizer
from minigrpo.tasks.arithmetic import is_test_problem
from minigrpo.tasks.calculator import (
    CALCULATOR_REWARD_FUNCS,
    CALCULATOR_REWARD_WEIGHTS,
    calculator,
    make_calculator_dataset,
)
from minigrpo.tokenization import TOOLS_CHAT_TEMPLATE, TOOLS_RESPONSE_TEMPLATE, build_tiny_tokenizer, save_tokenizer
from minigrpo.tool_calling import reads_tool_calls

EPISODE = [
    {"role": "user", "content": "What is 123 * 456?"},
    calculator_call("123 * 456"),
    {"role": "tool", "name": "calculator", "content": "56088"},
    {"role": "assistant", "content": "<answer>56088</answer>"},
]


@pytest.mark.parametrize(
    "expression, result",
    [("123 * 456", "56088"), ("2+3*4", "14"), ("(2 + 3) * 4", "20"), ("-7 - -2", "-5"), (" 10 - 20 ", "-10")],
)
def test_calculator_computes(expression, result):
    assert calculator(expression) == result


@pytest.mark.parametrize(
    "expression, says",
    [
        ("__import__('os')", "Call is not allowed"),
        ("2**999999", "BinOp is not allowed"),  # ** is refused before any power is computed
        ("x * 2", "Name is not allowed"),
        ("7 / 2", "BinOp is not allowed"),
        ("1.5 * 2", "Constant is not allowed"),
        ("True + 1", "Constant is not allowed"),
        ("1 +", "cannot parse"),
        ("1" + " + 1" * 40, "at most 100"),
        ("999999999 * 999999999 * 99", "too large"),
    ],
)
def test_calculator_refuses(expression, says):
    with pytest.raises(ValueError, match=says):
        calculator(expression)


def test_calculator_schema():
    """transformers' get_json_schema reads the tool from its hints and docstring (TRL renders tools from it)."""
    function = get_json_schema(calculator)["function"]
    assert function["name"] == "calculator"
    assert function["parameters"]["properties"]["expression"]["type"] == "string"
    assert function["parameters"]["required"] == ["expression"]


def test_dataset_is_seeded_and_split():
    train, test = make_calculator_dataset(300, "train"), make_calculator_dataset(100, "test")
    assert train["question"] == make_calculator_dataset(300, "train")["question"]
    assert train["question"] != make_calculator_dataset(300, "train", seed=1)["question"]
    assert not set(train["question"]) & set(test["question"])
    for question, answer, prompt in zip(test["question"], test["answer"], test["prompt"], strict=True):
        a, b = map(int, question.split(" * "))
        assert 100 <= a <= 999 and 100 <= b <= 999 and is_test_problem(a, "*", b)
        assert answer == str(a * b) and prompt == [{"role": "user", "content": f"What is {question}?"}]


def test_reward_reads_the_final_answer_of_a_conversation():
    (reward,) = CALCULATOR_REWARD_FUNCS
    assert CALCULATOR_REWARD_WEIGHTS == (1.0,)
    right, wrong = EPISODE[1:], [*EPISODE[1:3], {"role": "assistant", "content": "<answer>56089</answer>"}]
    guess = [{"role": "assistant", "content": "<answer>56088</answer>"}]
    assert reward([EPISODE[:1]] * 3, [right, wrong, guess], answer=["56088"] * 3) == [1.0, 0.0, 1.0]


# transformers < 5.13 has no response parsing (tools= is refused there): the tools tokenizer's tests need it
needs_response_parsing = pytest.mark.skipif(
    not reads_tool_calls(build_tiny_tokenizer()), reason="transformers < 5.13: no response_template parsing"
)


@pytest.fixture(scope="module")
def tokenizer():
    if not reads_tool_calls(build_tiny_tokenizer()):
        pytest.skip("transformers < 5.13: no response_template parsing")
    return build_tiny_tokenizer(tools=True)


def test_tools_tokenizer_round_trips(tokenizer, tmp_path):
    save_tokenizer(tokenizer, tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["response_template"] == TOOLS_RESPONSE_TEMPLATE
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == TOOLS_CHAT_TEMPLATE and loaded.response_template == TOOLS_RESPONSE_TEMPLATE
    text = loaded.apply_chat_template(EPISODE, tools=[calculator], tokenize=False)
    assert text == tokenizer.apply_chat_template(EPISODE, tools=[calculator], tokenize=False)
    assert text.startswith("<|im_start|>system\nTools: calculator(expression)<|im_end|>\n")
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123 * 456"}}\n</tool_call>' in text


def test_trl_accepts_the_tools_tokenizer(tokenizer):
    pytest.importorskip("trl", reason="trl is in the test extra")
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)


def test_parse_response_reads_a_call(tokenizer):
    prompt = tokenizer.apply_chat_template(EPISODE[:1], tools=[calculator], add_generation_prompt=True)["input_ids"]
    pieces = tools_sft_pieces(tokenizer, EPISODE[:1], "123 * 456", "56088", call_tool=True)
    call = tokenizer(pieces[1][0], add_special_tokens=False)["input_ids"]
    message = tokenizer.parse_response(call, prefix=prompt)
    assert message["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "123 * 456"}}


@needs_response_parsing
def test_bundled_tools_model_loads_and_holds_an_episode():
    model, tokenizer = load_model_and_tokenizer("tiny-tools", device="cpu")
    assert tokenizer.response_template == TOOLS_RESPONSE_TEMPLATE
    episode = tokenizer.apply_chat_template(EPISODE, tools=[calculator])["input_ids"]
    assert model.config.max_position_embeddings >= len(episode) + 64
    assert (TINY_TOOLS_MODEL_DIR / "model.safetensors").stat().st_size < 4_500_000


def test_sft_rows_train_only_the_models_own_tokens(tokenizer):
    pieces = tools_sft_pieces(tokenizer, EPISODE[:1], "123 * 456", "56088", call_tool=True)
    assert "".join(text for text, _ in pieces) + "\n" == tokenizer.apply_chat_template(
        EPISODE, tools=[calculator], tokenize=False
    )  # the pieces are the rendered episode (but for the template's last newline)
    assert pieces[2] == (tool_suffix(tokenizer, "56088"), False)
    assert (
        pieces[2][0]
        == "\n<|im_start|>user\n<tool_response>\n56088\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    rows = {"prompt": [EPISODE[:1]] * 2, "question": ["123 * 456"] * 2, "answer": ["56088"] * 2}
    batch = tools_sft_batch(tokenizer, rows, [True, False])
    trained = tokenizer.decode(batch["labels"][0][batch["response_mask"][0]])
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123 * 456"}}\n</tool_call><|im_end|>'
    assert trained == call + "<answer>56088</answer><|im_end|>"
    assert tokenizer.decode(batch["labels"][1][batch["response_mask"][1]]) == "<answer>56088</answer><|im_end|>"
    prompt_length, call_length, suffix_length = (len(tokenizer(text)["input_ids"]) for text, _ in pieces[:3])
    start = prompt_length + call_length - 1  # label t is token t + 1
    suffix = slice(start, start + suffix_length)  # the tool's turn, in label positions
    assert tokenizer.decode(batch["labels"][0][suffix]) == pieces[2][0]
    assert not batch["response_mask"][0][suffix].any() and not batch["response_mask"][0][: prompt_length - 1].any()
    assert batch["response_mask"][0][prompt_length - 1 : start].all()  # the call, <|im_end|> included

"""The real Qwen2.5 tokenizer (built offline from dashscope's qwen.tiktoken) through the whole GRPO path.

Everything else in the tests runs the tiny byte-level tokenizer (256 byte tokens, no merges); this file runs
what a learner on Colab runs: a 151,665-token byte-level BPE vocabulary, Qwen2.5-Instruct's chat template with
its default system prompt, <|im_end|> as EOS, <|endoftext|> as padding, log-probs chunked over a 152k vocabulary.
"""

import math

import pytest
import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.rewards import completion_text
from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.tokenization import QWEN25_ADDED_TOKENS, qwen25_tokenizer, qwen_bpe_ranks

pytest.importorskip("dashscope", reason="the offline Qwen2.5 tokenizer needs `pip install dashscope` (test extra)")

TEXTS = [
    "What is 12 + 345? Answer: 357.",
    "Hello world!\n\n  indented  code\tx",
    "Größe 北京 café — naïve 🙂",
    "I'm here, they've gone. DON'T",
    "def f(x):\n    return x**2\r\n",
]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    """Built once per session (~10 s: merges recovered from 151,643 ranks), then loaded from its folder."""
    folder = tmp_path_factory.mktemp("qwen25-tokenizer")
    qwen25_tokenizer(folder)
    return qwen25_tokenizer(folder)


def test_vocabulary_and_special_tokens(tokenizer):
    assert len(tokenizer) == 151_665
    assert tokenizer.convert_tokens_to_ids(QWEN25_ADDED_TOKENS) == list(range(151_643, 151_665))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151_645)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151_643)
    assert tokenizer.encode("<|im_start|>user", add_special_tokens=False) == [151_644, 872]


def test_same_ids_as_tiktoken_and_lossless(tokenizer):
    tiktoken = pytest.importorskip("tiktoken")
    from minigrpo.tokenization import QWEN_PRETOKENIZE_REGEX

    reference = tiktoken.Encoding(
        "qwen", pat_str=QWEN_PRETOKENIZE_REGEX, mergeable_ranks=qwen_bpe_ranks(), special_tokens={}
    )
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text), text
        assert tokenizer.decode(ids) == text


def test_chat_template_has_the_default_system_prompt(tokenizer):
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(with_system, tokenize=False).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>"
    )


def small_qwen(tokenizer) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 with Qwen2.5's 151,936-row vocabulary; a bias on <|im_end|> makes
    completions end at different lengths (and some run to the limit), as real ones do."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = Qwen2Config(
        vocab_size=151_936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.lm_head = torch.nn.Linear(64, 151_936, bias=True)
    with torch.no_grad():
        model.lm_head.bias.zero_()
        model.lm_head.bias[eos] = math.log(151_936 / 4)  # P(<|im_end|>) ~ 0.2 per step
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=pad)
    return model


def decoded_length_reward(prompts, completions, completion_ids=None, **columns) -> list[float]:
    """Varies within a group (a random model never answers right), so that the step has a gradient."""
    return [float(len(completion_text(c))) for c in completions]  # chat prompts: TRL's message lists


def test_two_grpo_steps_with_the_real_tokenizer(tokenizer, tmp_path):
    model = small_qwen(tokenizer)
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    config = GRPOConfig(
        prompts_per_step=2,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=12,
        logprob_chunk_size=16,  # several chunks over the 152k vocabulary
        learning_rate=1e-3,
        max_steps=2,
        eval_steps=0,
        save_steps=0,
        eval_batch_size=4,
        output_dir=str(tmp_path),
    )
    train, test = make_arithmetic_dataset(n=8, seed=0), make_arithmetic_dataset(n=4, split="test", seed=0)
    rewards = [correctness_reward, format_reward, decoded_length_reward]
    trainer = GRPOTrainer(
        model, rewards, args=config, train_dataset=train, processing_class=tokenizer, eval_dataset=test
    )
    trainer.train()
    history = trainer.state.log_history
    assert len(history) == 2
    for step in history:
        assert math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"])
        assert 1 <= step["completions/min_length"] <= step["completions/max_length"] <= 12
    assert any(step["completions/clipped_ratio"] < 1 for step in history), "no completion stopped at <|im_end|>"
    assert "eval_accuracy" in history[-1]
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)


def test_qwen25_reads_its_own_tool_calls_with_the_tool_calling_loop(tokenizer):
    """tools= with Qwen2.5: its chat template writes calls as <tool_call> JSON, so check_tool_support gives the
    tokenizer TOOLS_RESPONSE_TEMPLATE (as TRL's add_response_schema gives it its own), and a call written as Qwen's
    own tokens (<tool_call> is one added token) parses into the call."""
    from minigrpo.tasks.calculator import calculator
    from minigrpo.tokenization import TOOLS_RESPONSE_TEMPLATE
    from minigrpo.tool_calling import check_tool_support, parse_turn, reads_tool_calls, tool_result_ids

    if not reads_tool_calls(tokenizer):
        pytest.skip("transformers < 5.13: tools= is refused there")

    try:
        check_tool_support(tokenizer, [calculator])
        assert tokenizer.response_template == TOOLS_RESPONSE_TEMPLATE
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2*3?"}], tools=[calculator],
                                               add_generation_prompt=True, return_dict=False)  # fmt: skip
        turn = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call><|im_end|>'
        ids = tokenizer(turn, add_special_tokens=False)["input_ids"]
        assert ids[0] == tokenizer.convert_tokens_to_ids("<tool_call>")
        call = parse_turn(tokenizer, ids, prompt, [calculator])["tool_calls"][0]["function"]
        assert call == {"name": "calculator", "arguments": {"expression": "2*3"}}
        result = tool_result_ids(tokenizer, [{"role": "tool", "name": "calculator", "content": "6"}])
        assert tokenizer.decode(result) == "\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n" + (
            "<|im_start|>assistant\n"
        )
    finally:
        tokenizer.response_template = None

"""The tiny tokenizer is a Qwen2 byte-level BPE: every Hugging Face tool loads the bundled model, a checkpoint and a
run's final folder exactly as minigrpo does (same ids, same held-out accuracy)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minigrpo import GRPOConfig, GRPOTrainer, correctness_reward, evaluate_model, make_arithmetic_dataset
from minigrpo.models import TINY_MODEL_DIR, load_model_and_tokenizer
from minigrpo.rollout import render_prompts
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_COMPLETIONS
from minigrpo.tokenization import build_tiny_tokenizer, load_tokenizer, save_tokenizer

CORPUS = [
    "What is 12 + 7? Give the answer in <answer></answer> tags.",
    "<answer>-19</answer><|im_end|>",
    "<|im_start|>user\nWhat is 3 * 4?<|im_end|>\n<|im_start|>assistant\n",
    "  12\n\n 3\t4",
    "über 日本 ١٢ ５ 🙂",  # non-ASCII: bytes, so nothing is unknown
    *WORKED_EXAMPLE_COMPLETIONS,
]


def test_byte_b_is_token_b_and_the_chat_tokens_follow():
    tokenizer = build_tiny_tokenizer()
    assert len(tokenizer) == 259
    assert tokenizer("09+<", add_special_tokens=False)["input_ids"] == [ord(c) for c in "09+<"]
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [256, 257, 258]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (256, 258)
    for text in CORPUS:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def assert_same_tokenizer(ours, theirs):
    for text in CORPUS:
        assert ours(text, add_special_tokens=False)["input_ids"] == theirs(text, add_special_tokens=False)["input_ids"]
    messages = [[{"role": "user", "content": text}] for text in CORPUS[:2]]
    assert render_prompts(ours, messages) == render_prompts(theirs, messages)
    assert (ours.eos_token_id, ours.pad_token_id) == (theirs.eos_token_id, theirs.pad_token_id)


def test_autotokenizer_reads_the_bundled_folder_as_minigrpo_does():
    assert_same_tokenizer(
        load_model_and_tokenizer("tiny", device="cpu")[1], AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    )


def test_a_trained_runs_folders_load_the_same_with_plain_transformers(tmp_path):
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    config = GRPOConfig.tiny_cpu(
        prompts_per_step=4, num_generations=4, per_device_train_batch_size=16, max_steps=2, eval_steps=0,
        save_steps=1, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    trainer = GRPOTrainer(model, [correctness_reward], config, make_arithmetic_dataset(64, "train"))
    trainer.train()
    final = trainer.save_model()
    eval_data = make_arithmetic_dataset(48, "test")
    ours = evaluate_model(model, tokenizer, eval_data, [correctness_reward], config)["eval_accuracy"]
    for folder in (final, tmp_path / "run" / "checkpoint-2"):
        plain_tokenizer = AutoTokenizer.from_pretrained(folder)
        plain_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        assert_same_tokenizer(tokenizer, plain_tokenizer)
        theirs = evaluate_model(plain_model, plain_tokenizer, eval_data, [correctness_reward], config)
        assert theirs["eval_accuracy"] == ours


def test_a_minigrpo_0_1_folder_is_a_clear_error(tmp_path):
    build_tiny_tokenizer().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "minigrpo_tiny": True}))
    with pytest.raises(ValueError, match="minigrpo 0.1"):
        load_tokenizer(tmp_path)


def test_saved_tokenizer_config_is_read_by_transformers_4_and_5(tmp_path):
    """transformers 5's save_pretrained writes "TokenizersBackend", a class transformers 4 does not have: the bundled
    model and pretrain-tiny write Qwen2.5's own names instead (scripts/lowest_versions.py loads them with 4.56)."""
    tokenizer = build_tiny_tokenizer()
    save_tokenizer(tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Qwen2Tokenizer" and "extra_special_tokens" not in config
    assert config["additional_special_tokens"] == ["<|im_start|>"]
    bundled = json.loads((TINY_MODEL_DIR / "tokenizer_config.json").read_text())
    names = ("tokenizer_class", "additional_special_tokens", "eos_token", "pad_token")
    assert {name: bundled[name] for name in names} == {name: config[name] for name in names}
    assert "extra_special_tokens" not in bundled
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"] and loaded("<|im_start|>")["input_ids"] == [257]
    assert set(loaded.all_special_tokens) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

"""The benchmarks' measuring code: memory readers, a run in a fresh process, the PPO-vs-GRPO schema and table."""

import pytest

from minigrpo.measure import (
    QWEN_SHAPE,
    format_table,
    qwen_shape_config,
    reset_peak_rss,
    rss_bytes,
    run_algorithm,
    run_in_fresh_process,
    summary,
)


def test_rss_readers_see_a_new_allocation_in_the_peak():
    reset_peak_rss()
    before = rss_bytes("VmHWM")
    block = bytearray(64 * 2**20)  # 64 MiB, touched so it is resident
    block[::4096] = b"x" * len(block[::4096])
    assert rss_bytes("VmHWM") >= before + 60 * 2**20
    assert rss_bytes("VmRSS") > 0
    del block


def test_a_fresh_process_returns_the_functions_result_and_reports_its_failure():
    results = {"device": "cpu", "model": "tiny", "algorithms": {"grpo": RESULT, "ppo": {**RESULT, "accuracy": 0.5}}}
    assert run_in_fresh_process("minigrpo.measure", "summary", {"results": results}) == summary(results)
    with pytest.raises(RuntimeError, match="minigrpo.measure.summary failed in its process"):
        run_in_fresh_process("minigrpo.measure", "summary", {"results": {}})


def test_qwen_shape_is_qwen25_05b():
    config = qwen_shape_config(eos_token_id=7)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (151_936, 896, 24)
    assert (config.num_attention_heads, config.num_key_value_heads, config.eos_token_id) == (14, 2, 7)
    assert QWEN_SHAPE == "qwen0.5b-shape"


def test_run_algorithm_returns_the_benchmark_schema(tmp_path):
    overrides = dict(max_steps=1, eval_steps=1, prompts_per_step=2, num_generations=4, per_device_train_batch_size=8)
    result = run_algorithm("ppo", "tiny", overrides, train_size=32, eval_size=8, output_dir=str(tmp_path))
    assert set(result["params"]) == {"policy", "reference", "critic"}
    assert result["params"]["critic"]["trainable"] > result["params"]["policy"]["trainable"]  # + the value head
    assert result["params"]["reference"] == {"trainable": 0, "frozen": result["params"]["policy"]["trainable"]}
    assert result["peak_memory_bytes"] > 0
    assert set(result["seconds_per_step"]) == {"rollout", "scoring", "update"}
    assert result["curve"]["completions"] == [8] and len(result["curve"]["eval/accuracy"]) == 1
    results = {"device": "cpu", "model": "tiny", "algorithms": {"grpo": result, "ppo": result}}
    assert summary(results)["peak_memory_ratio"] == 1.0
    assert "peak memory GRPO / PPO = 1.00" in format_table(results)


def test_run_algorithm_names_the_choices():
    with pytest.raises(ValueError, match="choose 'grpo' or 'ppo'"):
        run_algorithm("a2c")


RESULT = {
    "params": {"policy": {"trainable": 10, "frozen": 0}, "reference": {"trainable": 0, "frozen": 10}},
    "peak_memory_bytes": 2**20,
    "seconds_per_step": {"rollout": 1.0, "scoring": 0.1, "update": 2.0},
    "curve": {"completions": [8, 16], "reward": [0.1, 0.2], "eval/accuracy": [None, 0.3]},
    "accuracy_before": 0.2,
    "accuracy": 0.3,
    "train_seconds": 3.0,
}

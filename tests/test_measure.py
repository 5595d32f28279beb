"""The benchmarks' measuring code: memory readers, a run in a fresh process, the PPO-vs-GRPO schema."""

import json
import math
import subprocess
import sys

import pytest
import torch

from minigrpo.measuring.intervals import band, bootstrap_interval, mean_interval, t_critical_value, value_at
from minigrpo.measuring.measure import (
    QWEN_SHAPE,
    make_stop_tokens_unreachable,
    qwen_shape_config,
    run_algorithm,
    run_in_fresh_process,
    training_problems,
)
from minigrpo.measuring.study import compare_with_seeds, format_study_table, study_bands, study_headline, study_summary
from minigrpo.models import TINY_MODEL_DIR, build_tiny_model, count_parameters
from minigrpo.tasks.arithmetic import make_arithmetic_dataset
from minigrpo.tokenization import load_tokenizer


def test_rss_readers_see_a_new_allocation_in_the_peak():
    # In a fresh process: after hundreds of tests, this one's allocator may hand back pages that are already
    # resident, and the peak would not move.
    code = (
        "from minigrpo.measuring.measure import reset_peak_rss, rss_bytes\n"
        "reset_peak_rss(); before = rss_bytes('VmHWM')\n"
        "block = bytearray(64 * 2**20); block[::4096] = b'x' * len(block[::4096])  # 64 MiB, resident\n"
        "print(rss_bytes('VmHWM') - before, rss_bytes('VmRSS'))\n"
    )
    grown, rss = map(
        int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert grown >= 60 * 2**20 and rss > 0


def test_a_fresh_process_returns_the_functions_result_and_reports_its_failure():
    values = {"values": [0.25, 0.5, 0.75]}
    assert run_in_fresh_process("minigrpo.measuring.intervals", "mean_interval", values) == mean_interval(**values)
    with pytest.raises(RuntimeError, match="minigrpo.measuring.intervals.mean_interval failed in its process"):
        run_in_fresh_process("minigrpo.measuring.intervals", "mean_interval", {"values": []})


def test_qwen_shape_is_qwen25_05b():
    config = qwen_shape_config(eos_token_id=7)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (151_936, 896, 24)
    assert (config.num_attention_heads, config.num_key_value_heads, config.eos_token_id) == (14, 2, 7)
    assert QWEN_SHAPE == "qwen0.5b-shape"


@pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
def test_stop_tokens_made_unreachable_have_probability_zero_and_completions_run_to_the_limit():
    torch.manual_seed(0)
    tokenizer = load_tokenizer(TINY_MODEL_DIR)
    model = build_tiny_model(tokenizer, seed=0)
    stop = [tokenizer.pad_token_id, tokenizer.eos_token_id]  # the generation config's eos ids: 256, 258
    assert sorted(stop) == sorted(model.generation_config.eos_token_id)
    ids = torch.randint(0, len(tokenizer), (4, 48))  # (N, T), stop tokens among them
    ids[:, ::7] = tokenizer.eos_token_id
    with torch.no_grad():
        before = model(ids).logits.softmax(-1)[..., stop].sum(-1)  # (N, T)
    assert before.min() > 1e-3  # a random model of 259 tokens stops about once in 130 tokens
    parameters = count_parameters(model)
    assert make_stop_tokens_unreachable(model, stop) is model and count_parameters(model) == parameters
    with torch.no_grad():
        after = model(ids).logits.softmax(-1)  # (N, T, V)
    not_stop = ~torch.isin(ids, torch.tensor(stop))  # a stop token in the input changes only its own position
    assert after[not_stop][:, stop].max() == 0.0  # exactly 0 in fp32
    assert after[not_stop].max() < 0.5  # and the model still spreads its samples over the other tokens
    prompt = tokenizer(["What is 2 + 3?"], return_tensors="pt")
    completions = model.generate(**prompt, do_sample=True, top_k=0, max_new_tokens=64, num_return_sequences=8)
    assert completions.shape == (8, prompt["input_ids"].shape[1] + 64)
    assert not torch.isin(completions, torch.tensor(stop)).any()


def test_run_algorithm_returns_the_benchmark_schema(tmp_path):
    overrides = dict(max_steps=1, eval_steps=1, prompts_per_step=2, num_generations=4, per_device_train_batch_size=8)
    arguments = dict(algorithm="ppo", model="tiny", config_overrides=overrides, train_size=32, eval_size=8,
                     output_dir=str(tmp_path))  # fmt: skip
    # in its own process, as the benchmark runs it: in this one, earlier tests' freed memory would hide the peak
    result = run_in_fresh_process("minigrpo.measuring.measure", "run_algorithm", arguments)
    assert set(result["params"]) == {"policy", "reference", "critic"}
    assert result["params"]["critic"]["trainable"] > result["params"]["policy"]["trainable"]  # + the value head
    assert result["params"]["reference"] == {"trainable": 0, "frozen": result["params"]["policy"]["trainable"]}
    assert result["peak_memory_bytes"] > 0
    assert set(result["seconds_per_step"]) == {"rollout", "scoring", "update"}
    assert result["curve"]["completions"] == [8] and len(result["curve"]["eval_accuracy"]) == 1


def test_run_algorithm_names_the_choices():
    with pytest.raises(ValueError, match="choose 'grpo' or 'ppo'"):
        run_algorithm("a2c")


RESULT = {
    "params": {"policy": {"trainable": 10, "frozen": 0}, "reference": {"trainable": 0, "frozen": 10}},
    "peak_memory_bytes": 2**20,
    "seconds_per_step": {"rollout": 1.0, "scoring": 0.1, "update": 2.0},
    "curve": {"completions": [8, 16], "reward": [0.1, 0.2], "eval_accuracy": [None, 0.3]},
    "accuracy_before": 0.2,
    "accuracy": 0.3,
    "train_seconds": 3.0,
}


# --- intervals over seeds ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "confidence, df, expected",  # the printed t tables
    [(0.95, 1, 12.706), (0.95, 2, 4.303), (0.95, 4, 2.776), (0.95, 9, 2.262), (0.95, 30, 2.042), (0.90, 10, 1.812)],
)
def test_t_critical_value_matches_the_table(confidence, df, expected):
    assert t_critical_value(confidence, df) == pytest.approx(expected, abs=1e-3)


def test_t_critical_value_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 41):
        for confidence in (0.8, 0.95, 0.99):
            expected = stats.t.ppf((1 + confidence) / 2, df)
            assert t_critical_value(confidence, df) == pytest.approx(expected, rel=1e-9)


def test_mean_interval_by_hand():
    interval = mean_interval([0.5, 0.6, 0.7])  # mean 0.6, s = 0.1, t(0.95, 2) = 4.3027
    assert interval["mean"] == pytest.approx(0.6)
    assert interval["half_width"] == pytest.approx(4.302653 * 0.1 / 3**0.5, rel=1e-6)
    assert (interval["low"], interval["high"]) == pytest.approx((0.6 - 0.248414, 0.6 + 0.248414), abs=1e-6)
    assert mean_interval([2.0, 2.0])["half_width"] == 0.0
    one = mean_interval([0.3])
    assert one["mean"] == 0.3 and math.isnan(one["half_width"]) and one["n"] == 1
    with pytest.raises(ValueError, match="run at least one seed"):
        mean_interval([])
    with pytest.raises(ValueError, match="df >= 1"):
        t_critical_value(0.95, 0)


def test_value_at_reads_the_last_evaluation_at_or_before_x():
    xs, ys = [10, 20, 30], [None, 0.5, 0.7]
    assert [value_at(xs, ys, x, start=0.4) for x in (0, 10, 19, 20, 29, 30, 99)] == [0.4, 0.4, 0.4, 0.5, 0.5, 0.7, 0.7]


def test_band_is_the_interval_over_runs_at_each_x():
    runs = [
        {"accuracy_before": 0.2, "curve": {"seconds": [1.0, 2.0], "eval_accuracy": [0.4, 0.6]}},
        {"accuracy_before": 0.4, "curve": {"seconds": [1.5, 3.0], "eval_accuracy": [0.6, 0.8]}},
    ]
    curve = band(runs, "seconds", "eval_accuracy", [0.0, 1.0, 2.0, 3.0], "accuracy_before")
    assert curve["x"] == [0.0, 1.0, 2.0, 3.0]
    assert curve["mean"] == pytest.approx([0.3, 0.4, 0.6, 0.7])  # at 1.0: run 1 has 0.4, run 2 still its 0.4
    assert curve["high"][2] == pytest.approx(0.6) and curve["low"][2] == pytest.approx(0.6)  # equal values
    # at 3.0: 0.6 and 0.8, s = 0.1414, half-width = t(0.95, 1) * s / sqrt(2) = 12.7062 * 0.1
    assert curve["high"][3] - curve["mean"][3] == pytest.approx(1.270620, rel=1e-5)


# --- the study: validation split, summary at equal completions and equal time, table, last line ---------------
def test_training_problems_hold_back_distinct_problems_never_trained_on():
    train, validation = training_problems(300, 40)
    assert len(validation) == 40 == len(set(validation["question"]))
    assert not set(validation["question"]) & set(train["question"])
    assert len(train) + len(validation) <= 340 and len(train) >= 300 - 40  # every copy of a held-back one leaves
    assert not set(validation["question"]) & set(make_arithmetic_dataset(200, "test", seed=0)["question"])
    again, _ = training_problems(300, 40)
    assert again["question"] == train["question"]  # deterministic
    assert len(training_problems(50)[1]) == 0
    with pytest.raises(ValueError, match="validation_size=40 is more than half"):
        training_problems(30, 40)


def test_run_algorithm_validation_needs_held_back_problems():
    with pytest.raises(ValueError, match="validation_size >= 1"):
        run_algorithm("grpo", evaluate_on="validation")
    with pytest.raises(ValueError, match="choose 'test' or 'validation'"):
        run_algorithm("grpo", evaluate_on="train")


def seeded_run(accuracies, seconds, before=0.3, variance=None):
    """A run_algorithm result with evaluations at steps 1 and 2 (8 completions per step)."""
    return {
        **RESULT,
        "accuracy_before": before,
        "accuracy": accuracies[-1],
        "curve": {
            "completions": [8, 16],
            "seconds": seconds,
            "reward": [0.1, 0.2],
            "eval_accuracy": accuracies,
            "values/explained_variance": variance or [None, None],
        },
        "config": {"learning_rate": 3e-4},
    }


STUDY_RUNS = {
    "grpo": [seeded_run([0.4, 0.5], [1.0, 2.0]), seeded_run([0.5, 0.7], [1.0, 2.5])],
    "ppo": [
        seeded_run([0.45, 0.6], [3.0, 6.0], variance=[0.0, 0.1]),
        seeded_run([0.5, 0.6], [2.0, 5.0], variance=[0.2, 0.3]),
    ],
}  # fmt: skip


def test_study_summary_at_equal_completions_and_equal_time():
    summary = study_summary(STUDY_RUNS, last_steps=1)
    assert summary["faster"] == "grpo" and summary["equal_time_seconds"] == 2.5  # grpo's longest run
    grpo, ppo = summary["algorithms"]["grpo"], summary["algorithms"]["ppo"]
    assert grpo["accuracy_equal_completions"]["mean"] == pytest.approx(0.6)
    assert grpo["accuracy_equal_time"]["mean"] == pytest.approx(0.6)  # every grpo run is read at its end
    # by 2.5 s PPO seed 0 has not reached its first evaluation (3.0 s): 0.3 before; seed 1 has 0.5 (at 2.0 s)
    assert ppo["accuracy_equal_time"]["mean"] == pytest.approx(0.4)
    assert ppo["accuracy_equal_completions"]["half_width"] == 0.0
    assert ppo["explained_variance_final"]["mean"] == pytest.approx(0.2)  # last step: 0.1 and 0.3
    assert "explained_variance_final" not in grpo


def test_study_table_and_last_line():
    study = {
        "device": "cpu",
        "model": "tiny",
        "seeds": [0, 1],
        "runs": STUDY_RUNS,
        "summary": study_summary(STUDY_RUNS),
    }
    table = format_study_table(study)
    assert "test acc. @ 16 completions" in table and "0.600 +- " in table
    assert "mean +- 95% t-interval over 2 seeds" in table and "NOT comparable" not in table
    assert "NOT comparable" in format_study_table({**study, "fresh_processes": False})
    headline = study_headline(study)
    assert headline["grpo_accuracy_ci"][0] < 0.6 < headline["grpo_accuracy_ci"][1]
    assert headline["ppo_accuracy_ci"] == [0.6, 0.6]
    assert headline["critic_explained_variance_final"] == pytest.approx(0.15)  # mean of (0.0, 0.1) and (0.2, 0.3)
    json.loads(json.dumps(headline))  # one line of valid JSON


def test_study_bands_feed_the_figure():
    import matplotlib

    matplotlib.use("Agg")
    from minigrpo.course.plots import plot_curves_with_bands

    bands = study_bands(STUDY_RUNS, 2.5, points=6)
    assert bands["grpo"]["completions"]["x"] == [0, 8, 16]
    assert bands["grpo"]["completions"]["mean"] == pytest.approx([0.3, 0.45, 0.6])
    assert bands["ppo"]["explained_variance"]["mean"] == pytest.approx([0.1, 0.2])
    assert "explained_variance" not in bands["grpo"] and bands["equal_time_seconds"] == 2.5
    fig = plot_curves_with_bands({"model": "tiny", "seeds": [0, 1], "bands": bands})
    assert [ax.get_title() for ax in fig.axes][1] == "held-out accuracy at equal wall-clock"
    assert len(fig.axes[2].lines) == 2  # PPO's explained variance and the zero line


def test_compare_with_seeds_refuses_tuning_seeds_among_the_reported_ones():
    with pytest.raises(ValueError, match=r"seeds and tuning_seeds share \[0\]"):
        compare_with_seeds(seeds=[0, 1], tuning_seeds=[0])


def test_the_paired_difference_cancels_what_the_seed_does_to_both():
    summary = study_summary(STUDY_RUNS)
    difference = summary["ppo_minus_grpo"]
    # equal completions: seed 0 0.6 - 0.5 = 0.1, seed 1 0.6 - 0.7 = -0.1; equal time (2.5 s): 0.3 - 0.5, 0.5 - 0.7
    assert difference["equal_completions"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert difference["equal_time"]["mean"] == pytest.approx(-0.2)
    assert difference["equal_time"]["half_width"] == pytest.approx(0.0, abs=1e-12)  # the same gap for both seeds
    assert "PPO - GRPO, paired, equal time" in format_study_table({"device": "cpu", "model": "tiny", "seeds": [0, 1],
                                                                   "summary": summary})  # fmt: skip


def test_bootstrap_interval_over_seeds_and_problems():
    """A constant table has a zero-width interval; a table that varies only across seeds has its interval within the
    range of the seed means; a difference table of zeros is exactly 0; the resampling is seeded."""
    flat = bootstrap_interval([[0.5] * 4] * 3)
    assert (flat["mean"], flat["low"], flat["high"], flat["n_seeds"], flat["n_problems"]) == (0.5, 0.5, 0.5, 3, 4)
    by_seed = bootstrap_interval([[0.2] * 10, [0.4] * 10, [0.9] * 10])
    assert by_seed["mean"] == pytest.approx(0.5) and 0.2 <= by_seed["low"] < 0.5 < by_seed["high"] <= 0.9
    table = [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]
    assert bootstrap_interval(table) == bootstrap_interval(table)
    with pytest.raises(ValueError, match="one list per seed"):
        bootstrap_interval([1.0, 2.0])

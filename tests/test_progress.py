"""A run you can watch: the bar's fields, the summary a run ends with, transformers' bars kept off the run's bar, and
`train` and `eval` printing the same accuracy for the same saved model."""

import io
import re

import pytest
from transformers.utils import logging as transformers_logging

from minigrpo import GRPOTrainer
from minigrpo.__main__ import main
from minigrpo.run.progress import RunProgress, bar_fields, last_evaluation, library_bars_off, run_summary
from minigrpo.tasks.arithmetic import correctness_reward, format_reward
from minigrpo.tokenization import build_tiny_tokenizer
from minigrpo.tool_calling import reads_tool_calls

METRICS = {
    "reward": 0.41234,
    "rewards/correctness_reward/mean": 0.3125,
    "rewards/correctness_reward/std": 0.47,
    "rewards/format_reward/mean": 0.9875,
    "loss": 0.0,
}
HISTORY = [
    {"step": 25, "reward": 0.3, "eval_accuracy": 0.5},
    {"step": 50, "reward": 0.35, "eval_accuracy": 0.615},
    {"step": 60, "reward": 0.4},
]


@pytest.fixture
def bars_on(monkeypatch):
    """Progress bars drawn, tqdm's and transformers', as in a learner's terminal (conftest.py turns them off)."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.enable_progress_bar()
    yield
    if not was_enabled:
        transformers_logging.disable_progress_bar()


def test_bar_fields_by_hand():
    assert bar_fields(METRICS, HISTORY) == {
        "reward": "0.412",
        "correctness_reward": "0.312",  # rewards/<fn>/mean, by the function's name; not its std
        "format_reward": "0.988",
        "eval_accuracy": "0.615 (step 50)",  # the last evaluation, with the step it was measured at
    }
    assert bar_fields({"loss": 0.0}, [{"step": 1, "reward": 0.2}]) == {}  # nothing evaluated or scored yet
    assert last_evaluation(HISTORY) == HISTORY[1] and last_evaluation([]) is None


def test_the_bar_shows_the_fields():
    out = io.StringIO()
    progress = RunProgress(4, initial=0, desc="GRPO", file=out)
    progress.advance(2, METRICS, HISTORY[:1])
    progress.advance(2, METRICS, HISTORY)
    progress.close()
    last = out.getvalue().split("\r")[-1]
    assert "4/4" in last and "reward=0.412" in last and "format_reward=0.988" in last
    assert "eval_accuracy=0.615 (step 50)" in last


def test_the_summary_by_hand():
    summary = run_summary(HISTORY, 0.43, 0.6, "200 held-out problems; greedy", "runs/x", "runs/x/final", "m.jsonl")
    lines = summary.splitlines()
    assert lines[0] == "accuracy before: 0.430 after: 0.600 (200 held-out problems; greedy)"
    assert lines[1] == "best evaluation: 0.615 at step 50 (of 2 evaluations; the saved model is the last step's)"
    assert "runs/x/final" in lines[2] and "python -m minigrpo eval --model runs/x/final" in lines[2]
    assert "m.jsonl" in lines[3] and "plot_training_curves('m.jsonl')" in lines[4]
    no_evaluation = run_summary([{"step": 1}], 0.4, 0.5, "8 problems", "o", "o/final", "o/metrics.jsonl")
    assert "best evaluation" not in no_evaluation and len(no_evaluation.splitlines()) == 4


def test_library_bars_are_off_inside_and_restored_after(bars_on):
    assert transformers_logging.is_progress_bar_enabled()
    with library_bars_off():
        assert not transformers_logging.is_progress_bar_enabled()
    assert transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        with library_bars_off():
            pass
        assert not transformers_logging.is_progress_bar_enabled()  # off before: left off
    finally:
        transformers_logging.enable_progress_bar()


def test_a_run_shows_accuracy_and_rewards_and_no_checkpoint_bars(bars_on, tiny, train_dataset, eval_dataset,
                                                                 small_config, capsys):  # fmt: skip
    model, tokenizer = tiny
    config = small_config.replace(max_steps=2, eval_steps=1, save_steps=1, reward_weights=[1.0, 0.1])
    trainer = GRPOTrainer(
        model, [correctness_reward, format_reward], config, train_dataset, eval_dataset.select(range(8)),
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    bar = capsys.readouterr().err
    assert re.search(r"2/2 .*reward=\d\.\d{3}, correctness_reward=\d\.\d{3}, format_reward=\d\.\d{3}, "
                     r"eval_accuracy=\d\.\d{3} \(step 2\)", bar), bar  # fmt: skip
    assert "Writing model shards" not in bar and (trainer.output_dir / "checkpoint-2").is_dir()
    assert transformers_logging.is_progress_bar_enabled()  # restored after the run


def test_train_and_eval_print_the_same_accuracy_for_the_saved_model(tmp_path, capsys):
    """A short CLI run whose evaluation batches prompts 3 at a time and cuts completions at 16 tokens: `eval` of its
    saved model uses those settings (recorded beside the model) and prints the accuracy `train` printed."""
    run = tmp_path / "run"
    small = ["--prompts-per-step", "2", "--num-generations", "4", "--per-device-train-batch-size", "8"]
    evaluation = ["--eval-size", "10", "--eval-batch-size", "3", "--max-completion-length", "16"]
    assert main(["train", "--max-steps", "2", *small, *evaluation, "--output-dir", str(run)]) == 0
    trained = capsys.readouterr().out
    after = re.search(r"accuracy before: \d\.\d{3} after: (\d\.\d{3}) \(10 held-out problems; (.*)\)", trained)
    assert after, trained
    assert after.group(2) == "greedy, up to 16 new tokens, 3 prompts per batch, fp32"
    assert "reward = 1 x correctness_reward + 0.1 x format_reward" in trained  # the lessons' REWARD_WEIGHTS
    assert main(["eval", "--model", str(run / "final"), "--eval-size", "10"]) == 0
    evaluated = capsys.readouterr().out
    assert f"accuracy: {after.group(1)} (10 held-out problems; {after.group(2)})" in evaluated, evaluated


@pytest.mark.skipif(not reads_tool_calls(build_tiny_tokenizer()), reason="transformers < 5.13: tools= is refused")
def test_train_and_eval_on_the_calculator_task_run_episodes_with_the_tools_model(tmp_path, capsys):
    """`train --task calculator` trains the tools model ('tiny-tools', tiny_tools_cpu()) with its calculator, and
    `eval --task calculator` of the saved model prints the accuracy train printed, with the calls per answer."""
    run = tmp_path / "run"
    small = ["--prompts-per-step", "2", "--num-generations", "4", "--eval-size", "6"]
    assert main(["train", "--task", "calculator", "--max-steps", "1", *small, "--output-dir", str(run)]) == 0
    trained = capsys.readouterr().out
    for line in ("model tiny-tools", "tools: calculator", "reward = 1 x correctness_reward (the"):
        assert line in trained, trained
    after = re.search(r"after: (\d\.\d{3}) \(6 held-out problems; greedy, up to 192 new tokens", trained)
    assert after and "--task calculator)" in trained, trained
    assert main(["eval", "--task", "calculator", "--model", str(run / "final"), "--eval-size", "6"]) == 0
    evaluated = capsys.readouterr().out
    assert re.search(rf"accuracy: {after.group(1)}; \d\.\d\d tool calls per answer \(6 held-out", evaluated), evaluated

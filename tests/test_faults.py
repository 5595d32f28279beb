"""Faults and bad input around a training run, each ending in a clear error, a correct result or a documented choice:
non-finite losses and gradients, NaN metrics, broken, hostile or mismatched checkpoints, a resume with nothing to
resume, failures during evaluation, two trainers on one folder, and a run killed with kill -9."""

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import minigrpo.models
import minigrpo.trainer
from minigrpo import GRPOTrainer
from minigrpo.__main__ import main
from minigrpo.run.checkpoints import METRICS_FILE, STATE_FILE, CheckpointError, checkpoint_step, latest_checkpoint
from minigrpo.tasks.arithmetic import correctness_reward
from minigrpo.trainer import NonFiniteError


def weights(model):
    return {name: p.detach().clone() for name, p in model.state_dict().items()}


def assert_same_weights(model, expected):
    for name, value in weights(model).items():
        torch.testing.assert_close(value, expected[name], atol=0, rtol=0, msg=name)


def make(tiny, train_dataset, config, reward_funcs=(correctness_reward,), trainer_class=GRPOTrainer, **kwargs):
    model, tokenizer = tiny
    return trainer_class(model, list(reward_funcs), config, train_dataset, processing_class=tokenizer, **kwargs)


def metric_rows(output_dir) -> list[dict]:
    """metrics.jsonl read strictly: a bare NaN or Infinity (not JSON) fails the test."""

    def reject(constant):
        raise AssertionError(f"metrics.jsonl holds {constant}, which is not JSON")

    return [json.loads(line, parse_constant=reject) for line in open(Path(output_dir) / METRICS_FILE)]


# --- finite numbers ----------------------------------------------------------------------
def test_a_nan_loss_stops_the_run_before_the_update_and_saves_the_last_good_state(
    tiny, train_dataset, small_config, monkeypatch
):
    trainer = make(tiny, train_dataset, small_config.replace(save_steps=1))
    real = minigrpo.trainer.grpo_loss

    def nan_at_step_2(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return (loss * math.nan if trainer.step == 1 else loss), metrics

    monkeypatch.setattr(minigrpo.trainer, "grpo_loss", nan_at_step_2)
    with pytest.raises(NonFiniteError) as info:
        trainer.train()
    message = str(info.value)
    assert message.startswith("step 2: the loss of completions 0-7 is nan, so the update was not applied")
    assert "learning_rate=0.0003 too high" in message and "beta=0.04" in message
    assert trainer.optimizer_steps == 1  # step 2 never reached optimizer.step
    assert latest_checkpoint(small_config.output_dir).name == "checkpoint-1"
    saved = load_file(Path(small_config.output_dir) / "checkpoint-1" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
    assert [row["step"] for row in metric_rows(small_config.output_dir)] == [1]


def test_an_inf_gradient_stops_the_run_with_no_update(tiny, train_dataset, small_config):
    trainer = make(tiny, train_dataset, small_config)
    before = weights(trainer.model)
    trainer.model.model.norm.weight.register_hook(lambda grad: grad * math.inf)  # overflows in the backward pass
    with pytest.raises(NonFiniteError, match=r"^step 1: the gradient norm is (inf|nan) although the loss was finite"):
        trainer.train()
    assert trainer.optimizer_steps == 0
    assert_same_weights(trainer.model, before)
    assert latest_checkpoint(small_config.output_dir) is None  # nothing to save before step 1


def test_a_nan_metric_is_written_as_null_and_metrics_stay_json(tiny, train_dataset, small_config):
    def never_applies(prompts, completions, completion_ids, **columns):
        return [None] * len(completions)  # its mean over the batch is NaN

    trained = make(tiny, train_dataset, small_config.replace(max_steps=2), [correctness_reward, never_applies])
    trained.train()
    history = trained.state.log_history
    assert math.isnan(history[0]["rewards/never_applies/mean"])  # the returned history keeps NaN
    rows = metric_rows(small_config.output_dir)
    assert [row["step"] for row in rows] == [1, 2] and rows[0]["rewards/never_applies/mean"] is None
    state = json.loads((Path(small_config.output_dir) / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["history"][1]["rewards/never_applies/mean"] is None


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--learning-rate", "inf", "learning_rate=inf: it must be a finite number"),
        ("--beta", "nan", "beta=nan: it must be a finite number"),
        ("--epsilon", "nan", "epsilon=nan: it must be a finite number"),
        ("--save-total-limit", "0", "save_total_limit=0: keep at least 1 checkpoint"),
        ("--reward-timeout", "0", "reward_timeout=0.0: give a positive number of seconds"),
    ],
)
def test_non_finite_or_out_of_range_flags_are_one_line_before_any_model_loads(capsys, monkeypatch, flag, value, words):
    def forbidden(*args, **kwargs):
        raise AssertionError("the command loaded a model before checking its flags")

    monkeypatch.setattr(minigrpo.models, "load_model_and_tokenizer", forbidden)
    assert main(["train", "--model", "tiny", flag, value]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and words in err[0], err


# --- resume: nothing to resume, broken, hostile, another run's --------------------------------------
def test_resume_with_nothing_to_resume_seeds_a_fresh_run_and_drops_old_metrics(
    tiny, train_dataset, small_config, capsys
):
    model, _ = tiny
    initial = weights(model)
    config = small_config.replace(max_steps=1)
    make(tiny, train_dataset, config.replace(output_dir=small_config.output_dir + "-fresh")).train()
    expected = weights(model)

    model.load_state_dict(initial)
    output = Path(small_config.output_dir)
    output.mkdir(parents=True)
    (output / METRICS_FILE).write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')  # a run that died unsaved
    random.seed(12345)
    torch.manual_seed(12345)  # state left over from other work: the run must seed itself anyway
    resumed = make(tiny, train_dataset, config)
    resumed.train(resume_from_checkpoint=True)
    history = resumed.state.log_history
    assert f"no checkpoint in {output} to resume: starting a fresh run (seed 0)" in capsys.readouterr().out
    assert_same_weights(model, expected)
    assert [row["step"] for row in history] == [1]
    assert [row["step"] for row in metric_rows(output)] == [1]


def test_resume_falls_back_past_a_truncated_checkpoint_with_a_warning(tiny, train_dataset, small_config):
    model, _ = tiny
    initial = weights(model)
    config = small_config.replace(max_steps=3, save_steps=1, save_total_limit=3)
    make(tiny, train_dataset, config).train()
    expected = weights(model)
    newest = Path(config.output_dir) / "checkpoint-3" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])  # a copy cut short

    model.load_state_dict(initial)
    trainer = make(tiny, train_dataset, config)
    with pytest.warns(UserWarning, match=r"skipped checkpoint-3: .*model.safetensors is truncated or corrupt"):
        trainer.train(resume_from_checkpoint=True)
        history = trainer.state.log_history
    assert [row["step"] for row in history] == [1, 2, 3]  # step 3 was trained again, from checkpoint-2
    assert_same_weights(model, expected)


def test_an_explicit_broken_checkpoint_is_an_error_not_a_fallback(tiny, train_dataset, small_config):
    config = small_config.replace(max_steps=2, save_steps=1)
    make(tiny, train_dataset, config).train()
    path = Path(config.output_dir) / "checkpoint-2"
    (path / "trainer_state.json").write_text("garbage")
    with pytest.raises(CheckpointError, match=r"checkpoint-2/trainer_state.json is missing, truncated or not JSON"):
        make(tiny, train_dataset, config).train(resume_from_checkpoint=str(path))


def test_resume_refuses_a_crafted_checkpoint_from_the_command_line(tmp_path, capsys):
    output = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--output-dir", str(output), "--eval-size", "2", "--max-steps", "1"]
    argv += ["--prompts-per-step", "2", "--num-generations", "2", "--per-device-train-batch-size", "4"]
    assert main(argv) == 0
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('ran')",))

    torch.save({"optimizer": Payload()}, output / "checkpoint-1" / STATE_FILE)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be read safely" in err[0] and "never run" in err[0], err
    assert not marker.exists()


def test_resume_with_other_settings_is_refused_unless_allowed(tiny, train_dataset, small_config):
    config = small_config.replace(max_steps=1)
    make(tiny, train_dataset, config).train()
    changed = config.replace(max_steps=2, learning_rate=1e-4, num_generations=2, loss_type="dapo", beta=0.0)
    with pytest.raises(CheckpointError) as info:
        make(tiny, train_dataset, changed).train(resume_from_checkpoint=True)
    message = str(info.value)
    for change in ("beta: 0.04 -> 0.0", "learning_rate: 0.0003 -> 0.0001", "loss_type: 'grpo' -> 'dapo'"):
        assert change in message
    assert "num_generations: 4 -> 2" in message and "allow_config_change=True" in message

    longer = make(tiny, train_dataset, config.replace(max_steps=2, learning_rate=1e-4))
    longer.train(resume_from_checkpoint=True, allow_config_change=True)
    assert longer.step == 2 and longer.history[-1]["learning_rate"] == pytest.approx(1e-4)  # the new rate applies
    same = make(tiny, train_dataset, config.replace(max_steps=3, learning_rate=1e-4))
    assert same.train(True).global_step == same.state.log_history[-1]["step"] == 3


# --- failures around the step --------------------------------------------------------------------
def test_a_failure_while_evaluating_saves_the_step_and_resumes_exactly(tiny, train_dataset, eval_dataset, small_config):
    model, _ = tiny
    initial = weights(model)
    config = small_config.replace(max_steps=3, eval_steps=2, save_steps=0)
    make(tiny, train_dataset, config.replace(output_dir=config.output_dir + "-whole"), eval_dataset=None).train()
    expected = weights(model)

    class EvaluationFails(GRPOTrainer):
        def evaluate(self):
            raise KeyboardInterrupt  # say, a disconnect during the slow greedy evaluation

    model.load_state_dict(initial)
    with pytest.raises(KeyboardInterrupt):
        make(tiny, train_dataset, config, trainer_class=EvaluationFails, eval_dataset=eval_dataset).train()
    assert latest_checkpoint(config.output_dir).name == "checkpoint-2"
    model.load_state_dict(initial)
    resumed = make(tiny, train_dataset, config)
    resumed.train(resume_from_checkpoint=True)
    history = resumed.state.log_history
    assert [row["step"] for row in history] == [1, 2, 3]
    assert [row["step"] for row in metric_rows(config.output_dir)] == [1, 2, 3]
    assert_same_weights(model, expected)


def starts_a_second_run(second, refused: str, seen: list):
    """A reward function that, the first time the first run calls it (mid-training), starts `second`, asserts it is
    refused with a CheckpointError matching `refused` and appends the error to `seen`; then scores as usual."""

    def reward_that_starts_a_second_run(prompts, completions, completion_ids, **columns):
        if not seen:
            with pytest.raises(CheckpointError, match=refused) as e:
                second.train()
            seen.append(str(e.value))
        return correctness_reward(prompts, completions, completion_ids, **columns)

    return reward_that_starts_a_second_run


def test_a_second_trainer_on_the_same_folder_is_refused(tiny, train_dataset, small_config):
    second = make(tiny, train_dataset, small_config.replace(overwrite_output_dir=True))
    seen = []
    reward = starts_a_second_run(second, f"in use by another trainer \\(process {os.getpid()}\\)", seen)
    make(tiny, train_dataset, small_config.replace(max_steps=2), [reward]).train()
    assert seen and [row["step"] for row in metric_rows(small_config.output_dir)] == [1, 2]


def test_a_second_trainer_logging_to_the_same_folder_is_refused(tiny, train_dataset, small_config, tmp_path):
    """Two runs, each in its own output_dir, with one logging_dir: the second would append its rows to the first's
    metrics.jsonl (and its TensorBoard events beside them). It is refused as a second run in output_dir is."""
    logs = str(tmp_path / "logs")
    first = small_config.replace(output_dir=str(tmp_path / "a"), logging_dir=logs, max_steps=1)
    second = make(tiny, train_dataset, first.replace(output_dir=str(tmp_path / "b")))
    seen = []
    reward = starts_a_second_run(second, r"logging_dir .*logs is in use by another trainer", seen)
    make(tiny, train_dataset, first, [reward]).train()
    assert seen and "give this run another logging_dir" in seen[0]
    assert [row["step"] for row in metric_rows(logs)] == [1]  # the first run's row, once
    assert not (tmp_path / "b" / METRICS_FILE).exists()


def test_a_full_disk_during_a_save_leaves_no_temporary_folder(tiny, train_dataset, small_config, monkeypatch):
    import errno

    import minigrpo.run.checkpoints

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(minigrpo.run.checkpoints.torch, "save", disk_full)
    with pytest.raises(OSError, match=r"could not write checkpoint-2 in .*: No space left on device; the temporary"):
        make(tiny, train_dataset, small_config.replace(max_steps=2)).train()
    assert not [p.name for p in Path(small_config.output_dir).iterdir() if p.name.startswith(".checkpoint")]


# --- kill -9 -----------------------------------------------------------------------------------------
TRAIN = [sys.executable, "-m", "minigrpo", "train", "--model", "tiny", "--eval-size", "2", "--eval-steps", "0"]
TRAIN += ["--prompts-per-step", "2", "--num-generations", "2", "--per-device-train-batch-size", "4"]
TRAIN += ["--max-steps", "6", "--save-steps", "1", "--save-total-limit", "2"]


def test_a_run_killed_with_sigkill_resumes_to_the_same_weights(tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TQDM_DISABLE": "1",
        "PYTHONPATH": str(Path(minigrpo.__file__).parent.parent),
    }
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # Both runs start together (the import dominates on a small CPU); only the second one is killed.
    uninterrupted = subprocess.Popen([*TRAIN, "--output-dir", str(whole)], env=env, stdout=subprocess.DEVNULL)
    process = subprocess.Popen([*TRAIN, "--output-dir", str(killed)], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while latest_checkpoint(killed) is None or checkpoint_step(latest_checkpoint(killed)) < 3:
            assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)  # no handler, no cleanup: the lock and maybe a .tmp folder stay behind
        process.wait()
        assert not (killed / "final").exists()
        assert uninterrupted.wait(timeout=120) == 0
    finally:
        for child in (process, uninterrupted):
            if child.poll() is None:
                child.kill()
                child.wait()
    resumed = subprocess.run(
        [*TRAIN, "--output-dir", str(killed), "--resume"], env=env, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    expected, actual = (
        load_file(whole / "final" / "model.safetensors"),
        load_file(killed / "final" / "model.safetensors"),
    )
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert [row["step"] for row in metric_rows(killed)] == [1, 2, 3, 4, 5, 6]

"""Checkpoints: atomic save, safe load in place, fallback, rotation, RNG state, the output folder's lock; on small
modules (the trainer tests use Qwen)."""

import errno
import json
import math
import os
import random
import re
import subprocess
import sys
import time

import pytest
import torch

from minigrpo.config import GRPOConfig
from minigrpo.run import checkpoints
from minigrpo.run.checkpoints import (
    ARGS_FILE,
    HISTORY_FILE,
    STATE_FILE,
    CheckpointError,
    changed_run_fields,
    dumps,
    find_resumable,
    latest_checkpoint,
    load_checkpoint,
    load_module,
    output_dir_lock,
    read_checkpoint,
    remove_checkpoints,
    rng_state,
    rotate_checkpoints,
    set_rng_state,
    write_checkpoint,
)


class Tokenizer:
    """Stands in for a tokenizer: save_pretrained writes one file."""

    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


def trained_state(seed: int):
    torch.manual_seed(seed)
    modules = {"model": torch.nn.Linear(3, 2), "critic": torch.nn.Linear(3, 1)}
    params = [p for m in modules.values() for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=0.1)
    for _ in range(seed + 1):  # some Adam moments
        sum(p.sum() for p in params).backward()
        optimizer.step()
    return modules, optimizer


def save(tmp_path, step, modules, optimizer, history=(), args=None):
    return write_checkpoint(
        tmp_path, step, modules, Tokenizer(), optimizer, {"epoch": 1}, rng_state(), list(history), args
    )


def test_save_then_load_restores_weights_and_optimizer_and_returns_the_rest(tmp_path):
    modules, optimizer = trained_state(seed=2)
    path = save(tmp_path, 7, modules, optimizer, history=[{"step": 7, "reward": 0.5}])
    assert path == tmp_path / "checkpoint-7"
    assert {p.name for p in path.iterdir()} == {
        "model.safetensors",
        "critic",
        "tokenizer.json",
        STATE_FILE,
        HISTORY_FILE,
        ARGS_FILE,
    }
    assert not list(tmp_path.glob(".checkpoint-*"))  # the temporary folder was renamed

    fresh, fresh_optimizer = trained_state(seed=0)
    state = load_checkpoint(path, fresh, fresh_optimizer)
    for name in modules:
        for a, b in zip(modules[name].parameters(), fresh[name].parameters(), strict=True):
            assert torch.equal(a, b)
    assert str(fresh_optimizer.state_dict()) == str(optimizer.state_dict())
    assert state["step"] == 7 and state["sampler"] == {"epoch": 1} and state["history"] == [{"step": 7, "reward": 0.5}]


def test_python_rng_state_survives_json_and_the_state_file_loads_without_pickle(tmp_path):
    modules, optimizer = trained_state(seed=1)
    random.seed(123)
    torch.manual_seed(5)
    path = save(tmp_path, 1, modules, optimizer)
    expected = (random.random(), torch.rand(2))
    state = read_checkpoint(path, modules)
    set_rng_state(state["rng"])  # the state stored as JSON lists is a tuple again
    assert (random.random(), torch.rand(2))[0] == expected[0]
    tensors = torch.load(path / STATE_FILE, weights_only=True)  # tensors and plain numbers only
    assert set(tensors) == {"optimizer", "rng_torch", "rng_cuda"}  # the learning rate is a function of the step
    assert json.loads((path / HISTORY_FILE).read_text())["format"] == checkpoints.FORMAT


def test_a_crafted_state_file_is_refused_and_never_run(tmp_path):
    modules, optimizer = trained_state(seed=0)
    path = save(tmp_path, 3, modules, optimizer)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):  # what a hostile checkpoint holds: unpickling calls exec(...)
            return (exec, (f"open({str(marker)!r}, 'w').write('ran')",))

    torch.save({"optimizer": Payload()}, path / STATE_FILE)
    with pytest.raises(CheckpointError, match="cannot be read safely.*never run"):
        read_checkpoint(path, modules)
    with pytest.raises(CheckpointError, match="no checkpoint .* can be resumed"):
        find_resumable(tmp_path, modules)
    assert not marker.exists()
    torch.load(path / STATE_FILE, weights_only=False)  # the old way: the file really is hostile
    assert marker.read_text() == "ran"


def test_an_old_format_checkpoint_gets_one_error_saying_what_to_do(tmp_path):
    modules, optimizer = trained_state(seed=0)
    path = save(tmp_path, 2, modules, optimizer)
    (path / ARGS_FILE).unlink()
    old = {"step": 2, "optimizer": optimizer.state_dict(), "scheduler": {"last_epoch": 2}, "sampler": {}}
    torch.save({**old, "rng": rng_state()}, path / STATE_FILE)
    (path / HISTORY_FILE).write_text(json.dumps({"step": 2, "history": []}))
    with pytest.raises(CheckpointError, match="older minigrpo.*Start a new run from its weights"):
        read_checkpoint(path, modules)


@pytest.mark.parametrize(
    "file, damage, words",
    [
        ("model.safetensors", "truncate", "model.safetensors is truncated or corrupt"),
        ("critic/model.safetensors", "garbage", "model.safetensors is truncated or corrupt"),
        (STATE_FILE, "truncate", "trainer_state.pt cannot be read safely"),
        (HISTORY_FILE, "garbage", "trainer_state.json is missing, truncated or not JSON"),
        (HISTORY_FILE, "truncate", "trainer_state.json is missing, truncated or not JSON"),
        (ARGS_FILE, "garbage", "training_args.json is missing, truncated or not JSON"),
        (HISTORY_FILE, "empty object", "older minigrpo"),
    ],
)
def test_resume_falls_back_past_a_broken_checkpoint_and_names_it(tmp_path, file, damage, words):
    modules, optimizer = trained_state(seed=1)
    save(tmp_path, 1, modules, optimizer, history=[{"step": 1}])
    expected = {name: [p.detach().clone() for p in m.parameters()] for name, m in modules.items()}
    with torch.no_grad():
        modules["model"].weight.add_(1.0)
    broken = save(tmp_path, 2, modules, optimizer, history=[{"step": 1}, {"step": 2}])
    target = broken / file
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        target.write_bytes(b"\x00garbage" * 10)
    else:
        target.write_text("{}")
    with pytest.raises(CheckpointError, match=words):
        read_checkpoint(broken, modules)

    fresh, fresh_optimizer = trained_state(seed=0)
    path, state, problems = find_resumable(tmp_path, fresh)
    assert path.name == "checkpoint-1" and state["step"] == 1 and state["history"] == [{"step": 1}]
    assert len(problems) == 1 and problems[0].startswith("skipped checkpoint-2:") and words.split()[0] in problems[0]
    checkpoints.apply_checkpoint(state, fresh, fresh_optimizer)
    for name, params in expected.items():
        for a, b in zip(params, fresh[name].parameters(), strict=True):
            assert torch.equal(a, b)


def test_a_broken_checkpoint_changes_nothing(tmp_path):
    modules, optimizer = trained_state(seed=1)
    path = save(tmp_path, 1, modules, optimizer)
    (path / "critic" / "model.safetensors").write_bytes(b"")  # the last file read is the broken one
    fresh, fresh_optimizer = trained_state(seed=0)
    before = [p.detach().clone() for p in fresh["model"].parameters()]
    optimizer_before = str(fresh_optimizer.state_dict())
    with pytest.raises(CheckpointError):
        load_checkpoint(path, fresh, fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh["model"].parameters(), strict=True))
    assert str(fresh_optimizer.state_dict()) == optimizer_before


def test_a_full_disk_removes_the_temporary_folder_and_says_why_in_one_line(tmp_path, monkeypatch):
    modules, optimizer = trained_state(seed=0)
    save(tmp_path, 1, modules, optimizer)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoints.torch, "save", disk_full)  # the model is already written when it fails
    with pytest.raises(OSError) as info:
        save(tmp_path, 2, modules, optimizer)
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC and "\n" not in message
    assert "could not write checkpoint-2" in message and "No space left on device" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]  # no .checkpoint-2.tmp left


def test_non_finite_weights_are_never_written(tmp_path):
    modules, optimizer = trained_state(seed=0)
    with torch.no_grad():
        modules["critic"].bias.fill_(math.nan)
    with pytest.raises(CheckpointError, match="critic.bias holds NaN or inf"):
        save(tmp_path, 1, modules, optimizer)
    assert list(tmp_path.iterdir()) == []


def test_metrics_json_stays_json():
    line = dumps({"step": 1, "reward": math.nan, "kl": math.inf, "nested": [1.5, -math.inf]})
    assert json.loads(line) == {"step": 1, "reward": None, "kl": None, "nested": [1.5, None]}
    assert "NaN" not in line and "Infinity" not in line


def test_history_nan_round_trips_as_null(tmp_path):
    modules, optimizer = trained_state(seed=0)
    path = save(tmp_path, 1, modules, optimizer, history=[{"step": 1, "rewards/f/mean": math.nan}])
    assert '"rewards/f/mean": null' in (path / HISTORY_FILE).read_text()
    assert math.isnan(read_checkpoint(path, modules)["history"][0]["rewards/f/mean"])


def test_changed_run_fields_lists_what_defines_the_run():
    # max_steps is free to change under every schedule (the linear decay is recomputed: run.schedule)
    model = torch.nn.Linear(2, 2)
    saved = checkpoints.run_args(GRPOConfig.deepseekmath(prompts_per_step=16), model, ["correctness_reward"])
    assert changed_run_fields(saved, saved) == []
    free = GRPOConfig.deepseekmath(
        prompts_per_step=16,
        max_steps=500,
        save_steps=5,
        eval_steps=1,
        output_dir="elsewhere",
        per_device_train_batch_size=4,
    )
    assert changed_run_fields(saved, checkpoints.run_args(free, model, ["correctness_reward"])) == []
    other = GRPOConfig.deepseekmath(
        prompts_per_step=16, learning_rate=1e-5, num_generations=4, loss_type="dapo", seed=3
    )
    assert changed_run_fields(saved, checkpoints.run_args(other, model, ["format_reward"])) == [
        "reward_funcs: ['correctness_reward'] -> ['format_reward']",
        "generation_batch_size: 128 -> 64",  # B x G: the same 16 prompts, 4 completions each
        "learning_rate: 1e-06 -> 1e-05",
        "loss_type: 'grpo' -> 'dapo'",
        "num_generations: 8 -> 4",
        "seed: 0 -> 3",
    ]
    linear = checkpoints.run_args(GRPOConfig(lr_scheduler_type="linear", max_steps=100), model, [])
    longer = checkpoints.run_args(GRPOConfig(lr_scheduler_type="linear", max_steps=200), model, [])
    assert changed_run_fields(linear, longer) == []  # the decay is recomputed for the new max_steps, as in transformers
    # a field only one side knows is named (tests/test_run_safety_3.py: fields an older release did not record)
    unknown = changed_run_fields({**saved, "config": {**saved["config"], "a_field_from_elsewhere": 1}}, saved)
    assert unknown == ["a_field_from_elsewhere: 1 -> a field this minigrpo does not know (a newer one wrote it)"]


def test_a_resume_compares_reward_weights_but_not_the_scripts_resume_path():
    """TRL's grpo.py resumes with --resume_from_checkpoint PATH, which the first run did not have: not a change of
    the run. reward_weights sets the reward's scale, and every advantage with it: a change."""
    model = torch.nn.Linear(2, 2)
    first = checkpoints.run_args(GRPOConfig(reward_weights=[1.0, 0.5]), model, ["correctness_reward"])
    resumed = GRPOConfig(reward_weights=[1.0, 0.5], resume_from_checkpoint="runs/minigrpo/checkpoint-2")
    assert changed_run_fields(first, checkpoints.run_args(resumed, model, ["correctness_reward"])) == []
    reweighted = GRPOConfig(reward_weights=[1.0, 0.1])
    assert changed_run_fields(first, checkpoints.run_args(reweighted, model, ["correctness_reward"])) == [
        "reward_weights: [1.0, 0.5] -> [1.0, 0.1]"
    ]


def test_rng_state_round_trip_replays_the_same_draws():
    state = rng_state()
    first = (random.random(), torch.rand(3))
    set_rng_state(state)
    second = (random.random(), torch.rand(3))
    assert first[0] == second[0] and torch.equal(first[1], second[1])


def test_latest_ignores_incomplete_folders_and_rotation_keeps_the_newest(tmp_path):
    modules, optimizer = trained_state(seed=0)
    for step in (2, 10, 4):
        save(tmp_path, step, modules, optimizer)
    (tmp_path / "checkpoint-99").mkdir()  # no trainer_state.pt: a copy that never finished
    for stray in ("checkpoint-backup", "checkpoint-5-old", "checkpoint-"):  # not checkpoint-<int>: ignored
        (tmp_path / stray).mkdir()
        (tmp_path / stray / STATE_FILE).write_text("")
    (tmp_path / "checkpoint-12").write_text("a file, not a folder")
    assert latest_checkpoint(tmp_path).name == "checkpoint-10"  # by step number, not by name
    assert find_resumable(tmp_path, modules)[0].name == "checkpoint-10"  # and -99 is skipped (no state file)
    rotate_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-",
        "checkpoint-10",
        "checkpoint-12",
        "checkpoint-5-old",
        "checkpoint-99",
        "checkpoint-backup",
    ]
    with pytest.raises(ValueError, match="keep at least"):
        rotate_checkpoints(tmp_path, keep=0)
    assert remove_checkpoints(tmp_path) == 2 and latest_checkpoint(tmp_path) is None
    assert (tmp_path / "checkpoint-backup").is_dir()


def test_clear_errors_for_a_wrong_folder_or_a_wrong_model(tmp_path):
    modules, optimizer = trained_state(seed=0)
    with pytest.raises(CheckpointError, match="not a minigrpo checkpoint"):
        load_checkpoint(tmp_path, modules, optimizer)
    path = save(tmp_path, 1, modules, optimizer)
    with pytest.raises(RuntimeError, match="does not match the model"):
        load_module(torch.nn.Sequential(torch.nn.Linear(3, 1)), path / "critic")  # other names


def test_the_output_folder_is_locked_against_a_second_trainer(tmp_path):
    with output_dir_lock(tmp_path):
        assert (tmp_path / checkpoints.LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(CheckpointError, match=f"in use by another trainer \\(process {os.getpid()}\\)"):
            with output_dir_lock(tmp_path):
                pass
    with output_dir_lock(tmp_path):  # released at the end of the block
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from minigrpo.run.checkpoints import output_dir_lock\n"
         "with output_dir_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointError, match=f"process {holder.pid}"):
            with output_dir_lock(tmp_path):
                pass
    finally:
        holder.kill()  # kill -9: no cleanup runs in the holder
        holder.wait()
    assert (tmp_path / checkpoints.LOCK_FILE).read_text().strip() == str(holder.pid)  # the stale file is still there
    started = time.perf_counter()
    with output_dir_lock(tmp_path):
        assert (tmp_path / checkpoints.LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert time.perf_counter() - started < 5


def _damage_state_file(path, change):
    tensors = torch.load(path / STATE_FILE, weights_only=True)
    change(tensors)
    torch.save(tensors, path / STATE_FILE)


def _damage_json(path, change):
    plain = json.loads((path / HISTORY_FILE).read_text())
    change(plain)
    (path / HISTORY_FILE).write_text(json.dumps(plain))


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda p: _damage_json(p, lambda s: s.update(step=-100)), "step -100 is negative"),
        (lambda p: _damage_json(p, lambda s: s.update(sampler={"epoch": 0, "position": -5})), "position is -5"),
        (lambda p: _damage_json(p, lambda s: s.update(rng_python=[3, [1, 2], None])), "generator's state is malformed"),
        (lambda p: _damage_state_file(p, lambda t: t.update(rng_torch=torch.zeros(7))), "state is malformed"),
        (
            lambda p: _damage_state_file(p, lambda t: t["optimizer"]["state"][0].update(exp_avg=torch.zeros(5))),
            "of shape (5,)",
        ),  # fmt: skip
        (lambda p: _damage_state_file(p, lambda t: t["optimizer"].update(param_groups=[])), "0 parameter groups"),
        (lambda p: (p / ARGS_FILE).write_text("[1, 2]"), "training_args.json is not a dict"),
    ],
)
def test_a_state_that_cannot_be_applied_is_refused_before_anything_changes(tmp_path, damage, words):
    """Each part is checked before any is applied (weights and optimizer loaded, then a crash, was the old way)."""
    modules, optimizer = trained_state(seed=0)
    save(tmp_path, 1, modules, optimizer)
    broken = save(tmp_path, 2, modules, optimizer)
    damage(broken)
    fresh, fresh_optimizer = trained_state(seed=1)
    before = str(fresh_optimizer.state_dict()), [p.detach().clone() for p in fresh["model"].parameters()]
    with pytest.raises(CheckpointError, match=re.escape(words)):
        load_checkpoint(broken, fresh, fresh_optimizer)
    assert str(fresh_optimizer.state_dict()) == before[0]
    assert all(torch.equal(a, b) for a, b in zip(before[1], fresh["model"].parameters(), strict=True))
    path, state, problems = find_resumable(tmp_path, fresh, fresh_optimizer)
    assert path.name == "checkpoint-1" and problems[0].startswith("skipped checkpoint-2:") and words in problems[0]


def test_a_newer_checkpoint_format_is_called_newer(tmp_path):
    modules, optimizer = trained_state(seed=0)
    path = save(tmp_path, 2, modules, optimizer)
    _damage_json(path, lambda s: s.update(format=checkpoints.FORMAT + 1))
    newer = rf"written by a newer minigrpo \(checkpoint format {checkpoints.FORMAT + 1}; .*upgrade minigrpo"
    with pytest.raises(CheckpointError, match=newer):
        read_checkpoint(path, modules)


def test_a_format_2_checkpoint_still_resumes_and_its_scheduler_state_is_not_needed(tmp_path):
    """Format 2 (minigrpo 0.3) also stored a learning-rate scheduler's state; the rate is now lr_at(step), so that
    entry is ignored, even a malformed one (it can no longer break a resume)."""
    modules, optimizer = trained_state(seed=1)
    path = save(tmp_path, 2, modules, optimizer)
    _damage_json(path, lambda s: s.update(format=2))
    _damage_state_file(path, lambda t: t.update(scheduler={"last_epoch": -1, "base_lrs": None}))
    fresh, fresh_optimizer = trained_state(seed=0)
    state = load_checkpoint(path, fresh, fresh_optimizer)
    assert state["step"] == 2 and str(fresh_optimizer.state_dict()) == str(optimizer.state_dict())

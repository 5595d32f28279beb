"""Checkpoints: atomic save, load in place, rotation, RNG state; on a small module (the trainer tests use Qwen)."""

import random

import pytest
import torch

from minigrpo.checkpoints import (
    HISTORY_FILE,
    STATE_FILE,
    latest_checkpoint,
    load_checkpoint,
    load_module,
    remove_checkpoints,
    rng_state,
    rotate_checkpoints,
    save_checkpoint,
    set_rng_state,
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
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))
    for _ in range(seed + 1):  # some Adam moments and a schedule position
        sum(p.sum() for p in params).backward()
        optimizer.step()
        scheduler.step()
    return modules, optimizer, scheduler


def save(tmp_path, step, modules, optimizer, scheduler, history=()):
    return save_checkpoint(
        tmp_path, step, modules, Tokenizer(), optimizer, scheduler, {"epoch": 1}, rng_state(), list(history)
    )


def test_save_then_load_restores_weights_optimizer_scheduler_and_returns_the_rest(tmp_path):
    modules, optimizer, scheduler = trained_state(seed=2)
    path = save(tmp_path, 7, modules, optimizer, scheduler, history=[{"step": 7, "reward": 0.5}])
    assert path == tmp_path / "checkpoint-7"
    assert {p.name for p in path.iterdir()} == {
        "model.safetensors",
        "critic",
        "tokenizer.json",
        STATE_FILE,
        HISTORY_FILE,
    }
    assert not list(tmp_path.glob(".checkpoint-*"))  # the temporary folder was renamed

    fresh, fresh_optimizer, fresh_scheduler = trained_state(seed=0)
    state = load_checkpoint(path, fresh, fresh_optimizer, fresh_scheduler)
    for name in modules:
        for a, b in zip(modules[name].parameters(), fresh[name].parameters(), strict=True):
            assert torch.equal(a, b)
    assert str(fresh_optimizer.state_dict()) == str(optimizer.state_dict())
    assert fresh_scheduler.state_dict() == scheduler.state_dict()
    assert state["step"] == 7 and state["sampler"] == {"epoch": 1} and state["history"] == [{"step": 7, "reward": 0.5}]


def test_rng_state_round_trip_replays_the_same_draws():
    state = rng_state()
    first = (random.random(), torch.rand(3))
    set_rng_state(state)
    second = (random.random(), torch.rand(3))
    assert first[0] == second[0] and torch.equal(first[1], second[1])


def test_latest_ignores_incomplete_folders_and_rotation_keeps_the_newest(tmp_path):
    modules, optimizer, scheduler = trained_state(seed=0)
    for step in (2, 10, 4):
        save(tmp_path, step, modules, optimizer, scheduler)
    (tmp_path / "checkpoint-99").mkdir()  # no trainer_state.pt: a copy that never finished
    assert latest_checkpoint(tmp_path).name == "checkpoint-10"  # by step number, not by name
    rotate_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-99"]
    assert remove_checkpoints(tmp_path) == 2 and latest_checkpoint(tmp_path) is None


def test_clear_errors_for_a_wrong_folder_or_a_wrong_model(tmp_path):
    modules, optimizer, scheduler = trained_state(seed=0)
    with pytest.raises(FileNotFoundError, match="not a minigrpo checkpoint"):
        load_checkpoint(tmp_path, modules, optimizer, scheduler)
    path = save(tmp_path, 1, modules, optimizer, scheduler)
    with pytest.raises(RuntimeError, match="does not match the model"):
        load_module(torch.nn.Sequential(torch.nn.Linear(3, 1)), path / "critic")  # other names

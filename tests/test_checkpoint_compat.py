"""A checkpoint written by minigrpo 0.1.0 (before the modules moved into minigrpo/run/, course/, measuring/)
still resumes: the same weights, optimizer state, step and metric history, then one more step.

tests/data/checkpoint_v0_1/checkpoint-2 is a 2-step GRPO run of a tiny random Qwen2 written by the old code;
tests/data/make_checkpoint_v0_1.py made it (its docstring has the command). The settings below repeat the
script's: a resume refuses a run whose settings differ. Nothing here depends on which completions are
sampled (the sampling may change between versions).
"""

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from minigrpo import GRPOConfig, GRPOTrainer, load_model_and_tokenizer, make_arithmetic_dataset
from minigrpo.run.checkpoints import STATE_FILE

FIXTURE = Path(__file__).parent / "data" / "checkpoint_v0_1"
CHECKPOINT = "checkpoint-2"
# The 0.1.0 run's settings and reward function, from the script that made the fixture (one source of truth).
_spec = importlib.util.spec_from_file_location("make_checkpoint_v0_1", FIXTURE.parent / "make_checkpoint_v0_1.py")
fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixture)
CONFIG = {**fixture.CONFIG, "max_steps": 3}  # the 0.1.0 run stopped at 2; max_steps is free to change on a resume


def make_trainer(output_dir: Path, on_reward=None) -> GRPOTrainer:
    """A trainer like the 0.1.0 run's: the architecture from the checkpoint's config.json, freshly (and
    differently) initialised; the checkpoint's weights are loaded over it."""
    tokenizer = load_model_and_tokenizer("tiny", device="cpu")[1]
    torch.manual_seed(1)  # not the 0.1.0 run's seed: loaded weights cannot match by chance
    model = Qwen2ForCausalLM(Qwen2Config.from_json_file(FIXTURE / CHECKPOINT / "config.json"))

    def token_sum_reward(prompts, completions, completion_ids=None, **columns) -> list[float]:
        """The 0.1.0 run's reward function, under its name (a resume compares the names), watching the model."""
        if on_reward is not None:
            on_reward(model)
        return fixture.token_sum_reward(prompts, completions, completion_ids, **columns)

    # the 0.1.0 run leaned on 0.1.0's bare defaults, which were the paper's algorithm: 0.2.0's deepseekmath()
    config = GRPOConfig.deepseekmath(**CONFIG, output_dir=str(output_dir))
    dataset = make_arithmetic_dataset(n=8, split="train", seed=1)
    return GRPOTrainer(model, [token_sum_reward], args=config, train_dataset=dataset, processing_class=tokenizer)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A copy of the 0.1.0 run's output folder (a resume writes into it)."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


def stored_weights() -> dict[str, torch.Tensor]:
    return load_file(FIXTURE / CHECKPOINT / "model.safetensors")


def stored_history() -> list[dict]:
    rows = json.loads((FIXTURE / CHECKPOINT / "trainer_state.json").read_text())["history"]
    return [{key: math.nan if value is None else value for key, value in row.items()} for row in rows]


def assert_same_rows(actual: list[dict], expected: list[dict]) -> None:
    """Equal metric rows, NaN equal to NaN."""
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            same = value == got[key] or (isinstance(value, float) and math.isnan(value) and math.isnan(got[key]))
            assert same, f"step {want['step']} {key}: {got[key]!r} != stored {value!r}"


def assert_holds(model: torch.nn.Module | dict, weights: dict[str, torch.Tensor]) -> None:
    """Every stored weight, bit for bit (lm_head.weight is tied to the embeddings: not stored)."""
    state = model if isinstance(model, dict) else model.state_dict()
    assert state.keys() - weights.keys() <= {"lm_head.weight"}
    for name, tensor in weights.items():
        assert torch.equal(state[name], tensor), name


def adam_steps(trainer: GRPOTrainer) -> set[float]:
    return {float(state["step"]) for state in trainer.optimizer.state.values()}


def test_a_0_1_checkpoint_loads_its_weights_optimizer_step_and_history_exactly(run_dir):
    trainer = make_trainer(run_dir)
    weights = stored_weights()
    embeddings = "model.embed_tokens.weight"
    assert not torch.equal(trainer.model.state_dict()[embeddings], weights[embeddings])

    trainer.load_checkpoint(run_dir / CHECKPOINT)

    assert trainer.state.global_step == 2
    assert_holds(trainer.model, weights)
    assert_same_rows(trainer.state.log_history, stored_history())
    assert [row["step"] for row in trainer.state.log_history] == [1, 2]
    stored_optimizer = torch.load(FIXTURE / CHECKPOINT / STATE_FILE, weights_only=True)["optimizer"]
    loaded_optimizer = trainer.optimizer.state_dict()
    assert adam_steps(trainer) == {2.0}
    assert loaded_optimizer["state"].keys() == stored_optimizer["state"].keys()
    for index, moments in stored_optimizer["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded_optimizer["state"][index][name], moments[name]), (index, name)


def test_a_0_1_run_resumes_at_step_2_and_takes_one_more_step(run_dir):
    at_rewards = []  # the weights each time the rewards are scored, i.e. before that step's update

    def record(model):
        at_rewards.append({name: tensor.detach().clone() for name, tensor in model.state_dict().items()})

    trainer = make_trainer(run_dir, on_reward=record)

    trainer.train(resume_from_checkpoint=True)
    history = trainer.state.log_history

    assert len(at_rewards) == 1, "one step after the resume (the run was at step 2 of 3)"
    assert_holds(at_rewards[0], stored_weights())  # step 3 started from the 0.1.0 weights
    assert trainer.state.global_step == 3
    assert [row["step"] for row in history] == [1, 2, 3]
    assert_same_rows(history[:2], stored_history())  # the 0.1.0 run's metrics are kept as they were
    assert math.isfinite(history[2]["loss"])
    assert adam_steps(trainer) == {3.0}  # AdamW continued from the checkpoint's moments
    after = trainer.model.state_dict()
    assert all(torch.isfinite(tensor).all() for tensor in after.values())
    assert any(not torch.equal(after[name], tensor) for name, tensor in stored_weights().items())
    assert (run_dir / "checkpoint-3").is_dir() and not (run_dir / CHECKPOINT).exists()  # save_total_limit=1

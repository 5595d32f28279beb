"""Shared fixtures: the bundled tiny Qwen (offline), small datasets and configs."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may download
os.environ.setdefault("MINIGRPO_QUICK", "1")  # notebooks run by nbval (kernels inherit this) use short runs
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from minigrpo import GRPOConfig, load_model_and_tokenizer, make_arithmetic_dataset  # noqa: E402


@pytest.fixture
def tiny():
    """A fresh copy of the bundled tiny Qwen and its tokenizer, on the CPU."""
    return load_model_and_tokenizer("tiny", device="cpu")


@pytest.fixture(scope="session")
def train_dataset():
    return make_arithmetic_dataset(n=256, split="train", seed=1)


@pytest.fixture(scope="session")
def eval_dataset():
    return make_arithmetic_dataset(n=64, split="test", seed=0)


@pytest.fixture
def small_config(tmp_path):
    """A few fast steps: 4 prompts x G=4, micro-batches of 8."""
    return GRPOConfig.tiny_cpu(
        prompts_per_step=4,
        num_generations=4,
        per_device_train_batch_size=8,
        max_steps=4,
        eval_steps=0,
        save_steps=2,
        output_dir=str(tmp_path / "run"),
    )

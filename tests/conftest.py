"""Shared fixtures: the bundled tiny Qwen (offline), small datasets and configs. (../conftest.py: offline, quick.)"""

import shutil
from pathlib import Path

import pytest
import torch

from minigrpo import GRPOConfig, load_model_and_tokenizer, make_arithmetic_dataset

ROOT = Path(__file__).resolve().parents[1]


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
    """A few fast steps: 4 prompts x G=4, micro-batches of 8, at a constant learning rate.

    Constant, not tiny_cpu()'s linear decay: the tests stop and resume runs with another max_steps, take a step past
    the end, and read the rate back, and under a decay to 0 at max_steps each of those is another schedule. The tests
    of the schedule itself set lr_scheduler_type="linear"."""
    return GRPOConfig.tiny_cpu(
        prompts_per_step=4,
        num_generations=4,
        per_device_train_batch_size=8,
        max_steps=4,
        eval_steps=0,
        save_steps=2,
        lr_scheduler_type="constant",
        output_dir=str(tmp_path / "run"),
    )


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (used by the files whose tests run the tiny model many times): its ops are too
    small to gain from threads, and lose a lot when the CPUs are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def copy_from_checkout():
    """copy(names, destination): the checkout's files and folders `names` (paths relative to its root) into the
    existing folder `destination`, without bytecode caches, as a clone or an sdist would hold them."""

    def copy(names, destination: Path) -> None:
        for name in names:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, destination / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy(ROOT / name, destination / name)

    return copy

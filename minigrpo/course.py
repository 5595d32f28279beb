"""What every notebook needs in its first cells: where am I, which model, how long to train.

The one switch for short runs is the environment variable MINIGRPO_QUICK
("1" = quick). It is read here and nowhere else: the test suite sets it so
that nbval runs every notebook in CI in seconds per training cell, while a
learner (in Colab or on a laptop) gets the full-length runs.
"""

from __future__ import annotations

import os
import sys

import torch

from minigrpo.config import GRPOConfig
from minigrpo.models import QWEN_MODEL_ID

QUICK: bool = os.environ.get("MINIGRPO_QUICK", "").lower() in ("1", "true", "yes")
REPOSITORY_URL = "https://github.com/minigrpo/minigrpo"
COLAB_INSTALL = f"pip install -q git+{REPOSITORY_URL}"


def in_colab() -> bool:
    return "google.colab" in sys.modules


def on_gpu() -> bool:
    return torch.cuda.is_available()


def model_name() -> str:
    """The real Qwen2.5-0.5B-Instruct on a GPU, the bundled tiny Qwen on a CPU (or when QUICK)."""
    return QWEN_MODEL_ID if on_gpu() and not QUICK else "tiny"


def steps(full: int, quick: int) -> int:
    """`full` steps for a learner, `quick` under MINIGRPO_QUICK (CI)."""
    return quick if QUICK else full


def course_config(**overrides) -> GRPOConfig:
    """The preset that fits this machine: tiny_cpu() on a CPU, qwen_t4() (fits a 15 GB T4) on a GPU."""
    return GRPOConfig.for_model(model_name(), **overrides)


def describe() -> str:
    """One line for the top of a notebook: device, model, quick mode."""
    device = torch.cuda.get_device_name(0) if on_gpu() else "CPU"
    return f"device: {device} | model: {model_name()} | quick mode: {QUICK} | torch {torch.__version__}"

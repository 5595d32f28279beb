"""minigrpo: GRPO built stage by stage in small, readable PyTorch.

    prompts -> rollout -> rewards -> advantages -> loss -> update

Notation: B prompts per step, G = num_generations, N = B * G completions,
T completion tokens, P prompt tokens, V vocabulary size.

``from minigrpo import GRPOTrainer`` works as an ordinary import, but nothing is
loaded until a name is first used (PEP 562's module ``__getattr__``): torch and
transformers take seconds to import, and ``python -m minigrpo --help`` needs
neither.
"""

import importlib
import importlib.metadata
import importlib.util
import re
from pathlib import Path


def _version() -> str:
    """The version pyproject.toml declares (its one source): the installed metadata's, or, in a checkout imported
    through PYTHONPATH without an install, the checkout's pyproject.toml's; "0+unknown" when neither is there."""
    try:
        return importlib.metadata.version("minigrpo")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return found.group(1) if found else "0+unknown"


__version__ = _version()

# Each public name and the module that defines it.
_PUBLIC_NAMES = {
    "minigrpo.advantages": (
        "group_baseline",
        "group_relative_advantages",
        "group_rewards",
        "reward_scale",
        "zero_std_groups",
    ),
    "minigrpo.config": ("GRPOConfig",),
    "minigrpo.logprobs": ("masked_mean", "masked_sum", "per_token_logps", "selective_log_softmax"),
    "minigrpo.losses": (
        "aggregate_loss",
        "clipped_surrogate",
        "grpo_loss",
        "importance_ratio",
        "kl_penalty",
        "reinforce_loss",
        "sampler_importance_weights",
    ),
    "minigrpo.models": (
        "QWEN_MODEL_ID",
        "count_parameters",
        "default_model_name",
        "load_model_and_tokenizer",
        "make_reference_model",
        "pick_device",
    ),
    "minigrpo.rejection_sampling": ("RejectionSamplingTrainer", "best_in_group_mask", "rejection_sampling_loss"),
    "minigrpo.rewards": ("RewardFunctionError", "compute_rewards"),
    "minigrpo.rollout": ("Rollout", "completion_mask_from_eos", "repeat_for_group", "sample_group_rollout"),
    "minigrpo.run.evaluation": (
        "evaluate_model",
        "greedy_completions",
        "maj_at_k",
        "pass_and_maj_at_k",
        "pass_at_k",
        "sample_answers",
    ),
    "minigrpo.tasks.arithmetic": (
        "correctness_reward",
        "extract_answer",
        "format_reward",
        "graded_reward",
        "make_arithmetic_dataset",
    ),
    "minigrpo.trainer": ("GRPOTrainer",),
}
_MODULE_OF = {name: module for module, names in _PUBLIC_NAMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    """Import a public name's module the first time the name is used, and keep the name here after that."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
        globals()[name] = value
        return value
    if importlib.util.find_spec(f"minigrpo.{name}") is not None:  # minigrpo.trainer, minigrpo.course, ...
        return importlib.import_module(f"minigrpo.{name}")
    raise AttributeError(f"module 'minigrpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""minigrpo: GRPO built stage by stage in small, readable PyTorch.

    prompts -> rollout -> rewards -> advantages -> loss -> update

Notation: B prompts per step, G = num_generations, N = B * G completions,
T completion tokens, P prompt tokens, V vocabulary size.
"""

from minigrpo.advantages import group_baseline, group_relative_advantages, group_rewards, reward_scale, zero_std_groups
from minigrpo.config import GRPOConfig
from minigrpo.logprobs import masked_mean, masked_sum, per_token_logps, selective_log_softmax
from minigrpo.losses import aggregate_loss, clipped_surrogate, grpo_loss, importance_ratio, kl_penalty, reinforce_loss
from minigrpo.models import (
    QWEN_MODEL_ID,
    count_parameters,
    default_model_name,
    load_model_and_tokenizer,
    make_reference_model,
    pick_device,
)
from minigrpo.rewards import RewardFunctionError, compute_rewards
from minigrpo.rollout import Rollout, completion_mask_from_eos, repeat_for_group, sample_group_rollout
from minigrpo.run.evaluation import (
    evaluate_model,
    greedy_completions,
    maj_at_k,
    pass_and_maj_at_k,
    pass_at_k,
    sample_answers,
)
from minigrpo.tasks.arithmetic import (
    correctness_reward,
    extract_answer,
    format_reward,
    graded_reward,
    make_arithmetic_dataset,
)
from minigrpo.trainer import GRPOTrainer

__version__ = "0.3.0"

__all__ = [
    "QWEN_MODEL_ID",
    "GRPOConfig",
    "GRPOTrainer",
    "Rollout",
    "RewardFunctionError",
    "aggregate_loss",
    "clipped_surrogate",
    "completion_mask_from_eos",
    "compute_rewards",
    "correctness_reward",
    "count_parameters",
    "default_model_name",
    "evaluate_model",
    "extract_answer",
    "format_reward",
    "graded_reward",
    "greedy_completions",
    "group_baseline",
    "group_relative_advantages",
    "group_rewards",
    "grpo_loss",
    "importance_ratio",
    "kl_penalty",
    "load_model_and_tokenizer",
    "maj_at_k",
    "make_arithmetic_dataset",
    "make_reference_model",
    "masked_mean",
    "masked_sum",
    "pass_and_maj_at_k",
    "pass_at_k",
    "per_token_logps",
    "pick_device",
    "reinforce_loss",
    "repeat_for_group",
    "sample_answers",
    "reward_scale",
    "sample_group_rollout",
    "selective_log_softmax",
    "zero_std_groups",
]

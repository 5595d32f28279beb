"""The cases of every check, one module per exercise; importing this package registers them all in CASES.

| exercise | module | checks |
| --- | --- | --- |
| 01 | rewards | check_extract_answer, check_graded_reward, check_reward_hacking |
| 02 | advantages | check_group_relative_advantages, check_rloo_advantages |
| 03 | logprobs | check_masked_mean, check_per_token_logps |
| 04 | surrogate | check_clipped_surrogate |
| 05 | kl | check_kl_k3 |
| 06 | aggregation | check_aggregate_loss |
| 07 | gae | check_compute_gae |
| 08 | grpo_step | check_grpo_step |
| 09 | step_one_loss | check_step_one_loss, check_worked_example_step_one_loss |
| 10 | failure_modes | check_failure_modes |
| 11 | completion_mask | check_completion_mask |
| 12 | off_policy | check_importance_ratio, check_clip_fractions |
| 13 | kl_gradient | check_kl_loss_gradient, check_kl_directions |
| 14 | dynamic_sampling | check_keep_informative_groups, check_fill_batch |
"""

from minigrpo.grading.cases.advantages import check_group_relative_advantages, check_rloo_advantages
from minigrpo.grading.cases.aggregation import check_aggregate_loss
from minigrpo.grading.cases.completion_mask import check_completion_mask
from minigrpo.grading.cases.dynamic_sampling import check_fill_batch, check_keep_informative_groups
from minigrpo.grading.cases.failure_modes import check_failure_modes
from minigrpo.grading.cases.gae import check_compute_gae
from minigrpo.grading.cases.grpo_step import check_grpo_step
from minigrpo.grading.cases.kl import check_kl_k3
from minigrpo.grading.cases.kl_gradient import check_kl_directions, check_kl_loss_gradient
from minigrpo.grading.cases.logprobs import check_masked_mean, check_per_token_logps
from minigrpo.grading.cases.off_policy import check_clip_fractions, check_importance_ratio
from minigrpo.grading.cases.rewards import check_extract_answer, check_graded_reward, check_reward_hacking
from minigrpo.grading.cases.step_one_loss import (
    WORKED_EXAMPLE_LENGTHS,
    check_step_one_loss,
    check_worked_example_step_one_loss,
    step_one_loss,
)
from minigrpo.grading.cases.surrogate import check_clipped_surrogate

__all__ = [
    "WORKED_EXAMPLE_LENGTHS",
    "check_aggregate_loss",
    "check_clip_fractions",
    "check_clipped_surrogate",
    "check_completion_mask",
    "check_compute_gae",
    "check_extract_answer",
    "check_failure_modes",
    "check_fill_batch",
    "check_graded_reward",
    "check_group_relative_advantages",
    "check_grpo_step",
    "check_importance_ratio",
    "check_kl_directions",
    "check_keep_informative_groups",
    "check_kl_k3",
    "check_kl_loss_gradient",
    "check_masked_mean",
    "check_per_token_logps",
    "check_reward_hacking",
    "check_rloo_advantages",
    "check_step_one_loss",
    "check_worked_example_step_one_loss",
    "step_one_loss",
]

"""The checks of every exercise, one module per exercise, named after it; importing this package registers them all.

Each module ends with its exercise (`exercises.exercise`): its id, its checks and `solution_seconds`, the time its
solution took to grade, rounded up to 5 s (how it was measured: docs/grading.md, "Where the grader's constants come
from"). The grader's default limit per notebook is 3x that. Measure again when an exercise changes.

Each module registers its checks' cases (`@cases("check_x")`, in framework.CASES) and the check_x functions the
notebooks call (`@check`, in framework.CHECKS, which `minigrpo.grading` exports by name). A module is named after its
exercise's notebook, less the number (exercises/10_one_grpo_step.ipynb: one_grpo_step.py). A new exercise is a new
module here, imported below, and a row in this table. Two modules here serve the checks rather than one exercise:
`labs` (short runs of the tiny Qwen: the reference GRPO step of exercises 08 and 10, exercise 14's planted bugs, the
capstone's runs) and `own_code` (the capstone's notebook read for the package's stage functions).

| exercise | module | checks |
| --- | --- | --- |
| 01 | masked_mean_and_logprobs | check_masked_mean, check_per_token_logps |
| 02 | completion_mask | check_completion_mask |
| 03 | answer_extraction_and_rewards | check_extract_answer, check_graded_reward, check_reward_hacking |
| 04 | group_relative_advantages | check_group_relative_advantages, check_rloo_advantages |
| 05 | clipped_surrogate | check_clipped_surrogate |
| 06 | kl_k3_estimator | check_kl_k3 |
| 07 | loss_aggregation | check_aggregate_loss |
| 08 | why_is_the_loss_zero | check_step_one_loss, check_worked_example_step_one_loss |
| 09 | kl_gradient | check_kl_loss_gradient, check_kl_directions |
| 10 | one_grpo_step | check_grpo_step, check_lr_at |
| 11 | off_policy_ratio | check_importance_ratio, check_clip_fractions |
| 12 | grpo_from_scratch | check_capstone_completion_mask, check_capstone_sampler, check_capstone_logps, |
| | | check_capstone_advantages, check_capstone_loss, check_capstone_gradients, |
| | | check_capstone_update, check_capstone_learns, check_capstone_own_code |
| 13 | gae_for_ppo | check_compute_gae |
| 14 | failure_modes | check_failure_modes |
| 15 | dynamic_sampling | check_informative_groups, check_fill_batch |
| 16 | episode_tool_mask | check_episode_tool_mask, check_masked_episode_loss |
"""

from minigrpo.grading.checks import (  # noqa: F401 (imported to register their checks)
    answer_extraction_and_rewards,
    clipped_surrogate,
    completion_mask,
    dynamic_sampling,
    episode_tool_mask,
    failure_modes,
    gae_for_ppo,
    group_relative_advantages,
    grpo_from_scratch,
    kl_gradient,
    kl_k3_estimator,
    loss_aggregation,
    masked_mean_and_logprobs,
    off_policy_ratio,
    one_grpo_step,
    why_is_the_loss_zero,
)

"""The cases of every check, one module per exercise; importing this package registers them all.

Each module ends with its exercise (`exercises.exercise`): its id, its checks and `solution_seconds`, the time its
solution took to grade, rounded up to 5 s (`python -m minigrpo grade solutions/ --jobs 2 --timeout 900`, the
`seconds` of each notebook, on a 2-core CPU shared with other work at a load average of 5-6: 681 s for all fifteen,
2.5 times the README's idle-machine figure). The grader's default limit per notebook is 3x that. Measure again when
an exercise changes.

Each module registers its checks' cases (`@cases("check_x")`, in framework.CASES) and the check_x functions the
notebooks call (`@check`, in framework.CHECKS, which `minigrpo.grading` exports by name). A new exercise is a new
module here, imported below, and a row in this table.

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
| 14 | dynamic_sampling | check_informative_groups, check_fill_batch |
| 15 | capstone | check_capstone_completion_mask, check_capstone_sampler, check_capstone_logps, |
| | | check_capstone_advantages, check_capstone_loss, check_capstone_gradients, |
| | | check_capstone_update, check_capstone_learns, check_capstone_own_code |
"""

from minigrpo.grading.cases import (  # noqa: F401 (imported to register their checks)
    advantages,
    aggregation,
    capstone,
    completion_mask,
    dynamic_sampling,
    failure_modes,
    gae,
    grpo_step,
    kl,
    kl_gradient,
    logprobs,
    off_policy,
    rewards,
    step_one_loss,
    surrogate,
)

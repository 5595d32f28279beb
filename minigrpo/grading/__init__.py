"""Checks behind the exercises, with points, and the grader that runs them.

A learner's notebook calls a check with the function it wrote::

    from minigrpo.grading import check_group_relative_advantages
    check_group_relative_advantages(group_relative_advantages)

The check runs a list of cases, each worth some points: hand-made inputs with
hand-computed answers, and seeded random inputs compared with the package's
own implementation (the reference), always with an explicit tolerance. It
prints one line per case (PASS / FAIL, points earned, and a hint on failure)
and returns a `CheckResult`. It never raises because of the learner's code.

That print is feedback. The grade comes from `python -m minigrpo grade PATH`,
whose judge runs the same cases in a process the learner's code never runs in
and only calls the learner's function in the notebook's kernel (the design is
in `minigrpo.grading.runner`).

| module | job |
| --- | --- |
| framework | cases and points, run_check / evaluate, comparisons with hints, time limits |
| cases/ | the cases of each exercise's checks, one module per exercise, `@cases("check_x", references=[...])` |
| labs | short runs of the tiny Qwen: the reference GRPO step, the planted-bug trainer of exercise 10 |
| references | is the learner's function the package's own solution (the object, and the notebook's source)? |
| remote | the learner's function called in its kernel: arguments in, plain data out |
| judge | the grader's judge process: runs every check's cases on the kernel's functions |
| processes | the grader's process hygiene: find and kill everything a kernel started |
| runner | `python -m minigrpo grade PATH`: execute notebooks, judge their checks, print the scores |
"""

from minigrpo.grading.cases import (
    WORKED_EXAMPLE_LENGTHS,
    check_aggregate_loss,
    check_clip_fractions,
    check_clipped_surrogate,
    check_completion_mask,
    check_compute_gae,
    check_extract_answer,
    check_failure_modes,
    check_fill_batch,
    check_graded_reward,
    check_group_relative_advantages,
    check_grpo_step,
    check_importance_ratio,
    check_keep_informative_groups,
    check_kl_directions,
    check_kl_k3,
    check_kl_loss_gradient,
    check_masked_mean,
    check_per_token_logps,
    check_reward_hacking,
    check_rloo_advantages,
    check_step_one_loss,
    check_worked_example_step_one_loss,
    step_one_loss,
)
from minigrpo.grading.framework import (
    CASE_TIMEOUT_S,
    CASES,
    GRADED,
    GRADING_RUN_ENV,
    REFERENCES,
    Case,
    CaseResult,
    CheckResult,
    CheckTimeout,
    LearnerError,
    Mismatch,
    NoAnswer,
    cases,
    evaluate,
    expect_close,
    expect_equal,
    format_check,
    last_traceback_line,
    max_points,
    run_case,
    run_check,
    value_and_gradient,
)
from minigrpo.grading.labs import (
    BUGS,
    DIAGNOSTICS,
    NO_BUG,
    PlantedBugTrainer,
    diagnostics_table,
    planted_bug_run,
    reference_grpo_steps,
    run_with_bug,
    seeded_rollout,
    single_thread,
    small_grpo_config,
    tiny_model_and_tokenizer,
)
from minigrpo.grading.runner import (
    GradingError,
    NotebookReport,
    accept_records,
    check_calls,
    collect,
    expected_checks,
    find_notebooks,
    format_scores,
    grade_command,
    grade_notebooks,
)

__all__ = [
    "BUGS",
    "CASES",
    "CASE_TIMEOUT_S",
    "DIAGNOSTICS",
    "GRADED",
    "GRADING_RUN_ENV",
    "WORKED_EXAMPLE_LENGTHS",
    "Case",
    "CaseResult",
    "CheckResult",
    "CheckTimeout",
    "GradingError",
    "LearnerError",
    "Mismatch",
    "NO_BUG",
    "NoAnswer",
    "NotebookReport",
    "PlantedBugTrainer",
    "REFERENCES",
    "accept_records",
    "cases",
    "check_calls",
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
    "collect",
    "diagnostics_table",
    "evaluate",
    "expect_close",
    "expect_equal",
    "expected_checks",
    "find_notebooks",
    "format_check",
    "format_scores",
    "grade_command",
    "grade_notebooks",
    "last_traceback_line",
    "max_points",
    "planted_bug_run",
    "reference_grpo_steps",
    "run_case",
    "run_with_bug",
    "run_check",
    "seeded_rollout",
    "single_thread",
    "small_grpo_config",
    "step_one_loss",
    "tiny_model_and_tokenizer",
    "value_and_gradient",
]

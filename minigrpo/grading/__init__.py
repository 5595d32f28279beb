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

The grader's core sits here; its three parts are folders, each with a table of its modules:

| module | job |
| --- | --- |
| framework | cases and points, the registries (CASES, CHECKS), run_check / evaluate, hints, time limits |
| exercises | EXERCISES (checks, maximum, time budget); which exercise a notebook is; the version contract |
| references | is the learner's function the package's own solution (the object, the notebook's source, run time)? |
| cells | a notebook's code cells as the Python they run (IPython's magics, cell magics' bodies included) |
| judge | the grader's judge process: runs every check's cases on the kernel's functions, signs the records |
| runner | execute notebooks, judge their exercise's checks within its time limit, one report per notebook |
| checks/ | the exercises' checks, one module per exercise named after it; the labs and own-code reader they use |
| sandbox/ | where learner code runs while graded: its kernel, the judge's calls into it, caps, process hygiene |
| reports/ | what grading writes: the gradebook (`grade PATH`), a feedback file per student, Gradescope's files |
"""

from minigrpo.grading import checks as _exercises  # noqa: F401 (importing it registers every check: CHECKS, CASES)
from minigrpo.grading.checks.labs import (
    BUGS,
    CAPSTONE_LEARNING,
    DIAGNOSTICS,
    NO_BUG,
    PlantedBugTrainer,
    capstone_learning_config,
    capstone_learning_data,
    diagnostics_table,
    held_out_accuracy,
    planted_bug_run,
    reference_grpo_steps,
    run_with_bug,
    seeded_rollout,
    single_thread,
    small_grpo_config,
    tiny_model_and_tokenizer,
)
from minigrpo.grading.checks.why_is_the_loss_zero import WORKED_EXAMPLE_LENGTHS, step_one_loss
from minigrpo.grading.exercises import EXERCISES, Exercise, Identity, identify
from minigrpo.grading.framework import (
    CASE_TIMEOUT_S,
    CASES,
    CHECKS,
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
    check,
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
from minigrpo.grading.reports.gradebook import (
    ClassGrades,
    StudentGrade,
    class_grades,
    format_scores,
    grade_command,
)
from minigrpo.grading.reports.layouts import Layout, read_layout
from minigrpo.grading.runner import (
    GradingError,
    NotebookReport,
    Submission,
    accept_records,
    check_calls,
    collect,
    expected_checks,
    find_notebooks,
    grade_notebooks,
)

globals().update(CHECKS)  # every registered check, by its name: `from minigrpo.grading import check_x`

__all__ = [
    "BUGS",
    "CAPSTONE_LEARNING",
    "CASES",
    "CHECKS",
    "CASE_TIMEOUT_S",
    "ClassGrades",
    "DIAGNOSTICS",
    "EXERCISES",
    "Exercise",
    "GRADED",
    "GRADING_RUN_ENV",
    "WORKED_EXAMPLE_LENGTHS",
    "Case",
    "CaseResult",
    "CheckResult",
    "CheckTimeout",
    "GradingError",
    "Identity",
    "LearnerError",
    "Mismatch",
    "NO_BUG",
    "NoAnswer",
    "NotebookReport",
    "PlantedBugTrainer",
    "StudentGrade",
    "Submission",
    "REFERENCES",
    "accept_records",
    "cases",
    "check",
    "check_calls",
    "class_grades",
    "collect",
    "capstone_learning_config",
    "capstone_learning_data",
    "diagnostics_table",
    "evaluate",
    "expect_close",
    "expect_equal",
    "expected_checks",
    "find_notebooks",
    "format_check",
    "format_scores",
    "held_out_accuracy",
    "identify",
    "grade_command",
    "Layout",
    "grade_notebooks",
    "last_traceback_line",
    "max_points",
    "planted_bug_run",
    "read_layout",
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
    *CHECKS,  # check_x, every check a notebook calls
]

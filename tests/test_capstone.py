"""Exercise 15, the capstone: the solution's code earns every exactness point, planted mistakes lose them.

The functions come from the solution notebook itself (its `def` cells); each planted mistake is one edit of that
source, so the tests follow the notebook. Exactness checks run here, in this process, on the tiny Qwen (seconds);
one short learning run (10 steps) shows a mistake that stops learning losing the learning points. The solution's own
learning run, the graded 80 steps, runs once, in tests/test_grading.py's grading of every solution.
"""

import re
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo import grading
from minigrpo.grading.framework import judged_cells
from minigrpo.grading.labs import CAPSTONE_LEARNING
from minigrpo.grading.own_code import stage_function_uses

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "15_grpo_from_scratch.ipynb"
CELLS = [c.source for c in nbformat.read(SOLUTION, as_version=4).cells if c.cell_type == "code"]
DEFINITIONS = "\n\n".join(c for c in CELLS if c.lstrip().startswith("def "))
FUNCTIONS = {
    "check_capstone_completion_mask": "completion_mask",
    "check_capstone_sampler": "sample_completions",
    "check_capstone_logps": "per_token_logps",
    "check_capstone_advantages": "group_advantages",
    "check_capstone_loss": "grpo_loss",
    "check_capstone_gradients": "accumulate_gradients",
    "check_capstone_update": "grpo_update",
    "check_capstone_learns": "train_grpo",
}
EXACTNESS = [name for name in FUNCTIONS if name != "check_capstone_learns"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def solution(*edits: tuple[str, str]) -> dict:
    """The solution's functions, with each (old, new) edit of their source applied (each must apply once)."""
    source = DEFINITIONS
    for old, new in edits:
        assert source.count(old) == 1, f"the solution no longer contains {old!r}: update this planted mistake"
        source = source.replace(old, new)
    namespace = {"torch": torch, "copy": __import__("copy")}
    exec(compile(source, str(SOLUTION), "exec"), namespace)
    return namespace


def grade(check: str, functions: dict):
    return grading.run_check(check, functions[FUNCTIONS[check]], quiet=True)


# (old, new) edits of the solution's source: the mistakes the issue names
FLIPPED_ADVANTAGE = ("(grouped - grouped.mean(1, keepdim=True))", "(grouped.mean(1, keepdim=True) - grouped)")
FLIPPED_IN_LOSS = ("A = advantages.unsqueeze(1)", "A = -advantages.unsqueeze(1)")
NO_MASK = (
    "per_token_loss = -(surrogate - beta * kl) * mask  # (n, T)\n"
    "    return (per_token_loss.sum(1) / mask.sum(1).clamp(min=1)).mean()",
    "per_token_loss = -(surrogate - beta * kl)  # (n, T)\n    return per_token_loss.mean()",
)
NO_RATIO = ("ratio = torch.exp(logps - old_logps)", "ratio = torch.exp(logps - logps.detach())")
WRONG_SCALE = ("(loss * weight).backward()", "loss.backward()")
NO_STEP = ("        optimizer.step()\n", "")


def test_the_capstone_checks_are_the_notebook_s():
    nb = nbformat.read(SOLUTION, as_version=4)
    assert set(grading.expected_checks(nb)) == set(FUNCTIONS) | {"check_capstone_own_code"}
    assert {name for name in grading.CASES if name.startswith("check_capstone")} == set(grading.expected_checks(nb))


@pytest.mark.parametrize("check", EXACTNESS)
def test_the_solution_earns_every_exactness_point(check):
    result = grade(check, solution())
    assert result.passed and result.points == result.max_points > 0, [c.message for c in result.cases]


@pytest.mark.parametrize(
    "check, edit, hint",
    [
        ("check_capstone_advantages", FLIPPED_ADVANTAGE, "the sign"),
        ("check_capstone_loss", FLIPPED_IN_LOSS, "the sign"),
        ("check_capstone_loss", NO_MASK, "the mask"),
        ("check_capstone_loss", NO_RATIO, "the ratio"),
    ],
    ids=["advantage-sign", "loss-sign", "no-mask", "no-ratio"],
)
def test_a_planted_mistake_loses_points_with_the_hint_that_names_it(check, edit, hint):
    result = grade(check, solution(edit))
    assert result.points < result.max_points
    assert any(hint in case.message for case in result.cases if not case.passed), [c.message for c in result.cases]


@pytest.mark.parametrize(
    "edit, lost",
    [(FLIPPED_IN_LOSS, 4), (NO_MASK, 4), (NO_RATIO, 2), (WRONG_SCALE, 4)],
    ids=["advantage-sign", "no-mask", "no-ratio", "accumulation-scale"],
)
def test_planted_mistakes_lose_the_gradient_exactness_points(edit, lost):
    """A loss that ignores the ratio is right on the first pass (ratio 1) and wrong on the second only."""
    result = grade("check_capstone_gradients", solution(edit))
    assert result.max_points - result.points == lost, [c.message for c in result.cases]
    if edit is NO_RATIO:
        first, second = result.cases
        assert first.passed and not second.passed


def test_the_second_pass_really_clips():
    """The second-pass case's policy has moved enough that the clip is active on some tokens."""
    from minigrpo.grading.cases.capstone import _exact_setup
    from minigrpo.losses import clip_fractions

    base, config, rollout, advantages, old, _, trainer = _exact_setup(
        1, num_iterations=2, learning_rate=3e-3, epsilon=0.05
    )
    model = base
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(trainer.weights[0][name])
        logps = solution()["per_token_logps"](
            model,
            torch.cat([rollout["prompt_ids"], rollout["completion_ids"]], 1),
            torch.cat([rollout["prompt_mask"], rollout["completion_mask"]], 1),
            rollout["completion_ids"].shape[1],
            config.temperature,
        )
    ratio = torch.exp(logps - old)
    fractions = clip_fractions(ratio, advantages, rollout["completion_mask"], config.epsilon, config.epsilon)
    assert fractions["clip_ratio/region_mean"] > 0.01


def test_a_loop_that_never_steps_loses_the_update_points():
    result = grade("check_capstone_update", solution(NO_STEP))
    assert result.points == 0 and "optimizer took 0 step(s)" in result.cases[0].message


def test_a_wrong_accumulation_scale_loses_the_update_points():
    result = grade("check_capstone_update", solution(WRONG_SCALE))
    assert result.points == 0 and "weights differ" in result.cases[0].message


def test_a_flipped_advantage_stops_learning_and_loses_the_learning_points(monkeypatch):
    """The learning check on a 10-step budget (the graded one is 80): the loop that climbs the wrong way."""
    monkeypatch.setitem(CAPSTONE_LEARNING, "max_steps", 10)
    result = grade("check_capstone_learns", solution(FLIPPED_ADVANTAGE))
    assert result.points == 0
    (case,) = result.cases
    assert re.search(r"accuracy 0\.\d+ -> 0\.\d+ \([-+]0\.\d+\)", case.message) and "the bar is" in case.message


# --- their own code ------------------------------------------------------------------------------
def test_the_solution_s_cells_use_only_the_givens():
    assert stage_function_uses(CELLS) == []
    with judged_cells(CELLS):
        result = grading.run_check("check_capstone_own_code", lambda: None, quiet=True)
    assert result.passed


@pytest.mark.parametrize(
    "cell, named",
    [
        ("from minigrpo import grpo_loss", "`grpo_loss` from minigrpo (minigrpo.losses.grpo_loss, a stage of GRPO)"),
        ("from minigrpo.losses import kl_penalty as k3", "minigrpo.losses.kl_penalty, a stage of GRPO"),
        ("import minigrpo.rollout as r", "`import minigrpo.rollout` (a stage module of GRPO)"),
        (
            "import minigrpo\n\ndef f(m):\n    return minigrpo.trainer.GRPOTrainer(m)",
            "`GRPOTrainer` from minigrpo.trainer",
        ),
        ("from minigrpo import logprobs\nlogprobs.per_token_logps", "`per_token_logps` from minigrpo.logprobs"),
        ("def f():\n    from minigrpo.advantages import group_relative_advantages", "group_relative_advantages"),
        ("import importlib\nimportlib.import_module('minigrpo.losses')", "names a stage module"),
        ("from minigrpo.grading.labs import reference_grpo_steps", "not one of the capstone's given imports"),
    ],
)
def test_a_stage_function_in_any_cell_is_a_failed_check_that_names_it(cell, named):
    cells = [*CELLS, cell]
    with judged_cells(cells):
        result = grading.run_check("check_capstone_own_code", lambda: None, quiet=True)
    assert result.points == 0
    assert named in result.cases[0].message and f"(cell {len(cells)})" in result.cases[0].message


def test_a_cell_that_does_not_parse_is_not_a_crash():
    assert stage_function_uses(["def broken(:", "%time x = 1"]) == []


def test_a_notebook_of_stubs_earns_no_own_code_points():
    exercise = ROOT / "exercises" / SOLUTION.name
    cells = [c.source for c in nbformat.read(exercise, as_version=4).cells if c.cell_type == "code"]
    with judged_cells(cells):
        result = grading.run_check("check_capstone_own_code", lambda: None, quiet=True)
    assert result.points == 0 and "still raise NotImplementedError" in result.cases[0].message

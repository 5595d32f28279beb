"""Exercise 12, the capstone: the solution's code earns every exactness point, planted mistakes lose them.

The functions come from the solution notebook itself (its `def` cells); each planted mistake is one edit of that
source, so the tests follow the notebook. Exactness checks run here, in this process, on the tiny Qwen (seconds);
one short learning run (10 steps) shows a mistake that stops learning losing the learning points. The solution's own
learning run, the graded 80 steps, runs once, in tests/test_grading.py's grading of every solution.
"""

import importlib
import math
import pickle
import random
import re
import secrets
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo import correctness_reward, grading, make_arithmetic_dataset
from minigrpo.grading.checks.labs import (
    CAPSTONE_LEARNING,
    NegatedReward,
    capstone_learning_data,
    tiny_model_and_tokenizer,
    update_follows_rewards,
)
from minigrpo.grading.checks.own_code import stage_function_uses
from minigrpo.grading.framework import Mismatch, case_seed, drawn_from, judged_cells
from minigrpo.tasks.arithmetic import is_test_problem

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "12_grpo_from_scratch.ipynb"
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
NO_CLIP = (
    "grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)",
    "grad_norm = torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()",
)
RIGHT_PADDED = ('padding=True, padding_side="left"', 'padding=True, padding_side="right"')
NO_POSITION_IDS = ("position_ids=positions, ", "")


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
        ("check_capstone_sampler", RIGHT_PADDED, "pad prompts on the LEFT"),
        ("check_capstone_logps", NO_POSITION_IDS, "pass position_ids"),
    ],
    ids=["advantage-sign", "loss-sign", "no-mask", "no-ratio", "right-padding", "no-position-ids"],
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
    from minigrpo.grading.checks.grpo_from_scratch import _exact_setup
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


def test_an_update_without_the_gradient_clip_loses_the_clipping_point():
    result = grade("check_capstone_update", solution(NO_CLIP))
    kept, clipped = result.cases
    assert kept.passed and not clipped.passed and "clip_grad_norm_(max_grad_norm)" in clipped.message


def test_a_wrong_accumulation_scale_loses_the_update_points():
    result = grade("check_capstone_update", solution(WRONG_SCALE))
    assert result.points < result.max_points and "weights differ" in result.cases[0].message


def test_a_flipped_advantage_stops_learning_and_loses_the_learning_points(monkeypatch):
    """The learning check on a 10-step budget (the graded one is 80): the loop that climbs the wrong way."""
    monkeypatch.setitem(CAPSTONE_LEARNING, "max_steps", 10)
    result = grade("check_capstone_learns", solution(FLIPPED_ADVANTAGE))
    assert result.points == 0
    (case,) = result.cases
    assert re.search(r"accuracy 0\.\d+ -> 0\.\d+ \([-+]0\.\d+\)", case.message) and "the bar is" in case.message


# --- the learning check: drawn when graded, and only for a loop whose update follows the rewards -----------------
SFT_ON_HELD_OUT = """
def train_grpo(model, tokenizer, dataset, reward_funcs, config):
    \"\"\"Supervised fine-tuning on the answers of the problems the check once evaluated on: the first 200 of the
    test split, seed 0 (a given function and seed), each step prompts_per_step of them.\"\"\"
    held_out = make_arithmetic_dataset(200, "test", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    B = config.prompts_per_step
    for step in range(config.max_steps):
        rows = held_out[[(step * B + i) % len(held_out) for i in range(B)]]
        prompts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in rows["prompt"]]
        texts = [p + f"<answer>{a}</answer>" + tokenizer.eos_token for p, a in zip(prompts, rows["answer"])]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
        labels = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -100)
        for i, prompt in enumerate(prompts):
            labels[i, : len(tokenizer(prompt, add_special_tokens=False)["input_ids"])] = -100
        optimizer.zero_grad()
        model(**encoded, labels=labels).loss.backward()
        optimizer.step()
    return []
"""


def sft_on_held_out():
    namespace = {"torch": torch, "make_arithmetic_dataset": make_arithmetic_dataset}
    exec(SFT_ON_HELD_OUT, namespace)
    return namespace["train_grpo"]


def test_update_follows_rewards_on_hand_computed_steps():
    before = {"w": torch.tensor([0.0, 1.0]), "b": torch.tensor([2.0])}
    opposite = update_follows_rewards(
        before,
        {"w": torch.tensor([1.0, -1.0]), "b": torch.tensor([2.0])},
        {"w": torch.tensor([-1.0, 3.0]), "b": torch.tensor([2.0])},
    )  # d+ = (1, -2, 0), d- = (-1, 2, 0): d+ + d- = 0, |d+ - d-| = |(2, -4, 0)| = sqrt(20)
    assert opposite == pytest.approx((0.0, math.sqrt(20)))
    same = {"w": torch.tensor([0.5, 1.5]), "b": torch.tensor([2.0])}  # d+ = d-: the rewards changed nothing
    assert update_follows_rewards(before, same, same) == (math.inf, 0.0)
    half = update_follows_rewards(before, {"w": torch.tensor([1.0, 1.0]), "b": torch.tensor([2.0])}, before)
    assert half == pytest.approx((1.0, 1.0))  # d+ = (1, 0, 0), d- = 0: |d+ + d-| = |d+ - d-| = 1


def test_a_negated_reward_gives_minus_the_reward_under_its_name_and_crosses_by_pickle():
    negated = pickle.loads(pickle.dumps(NegatedReward(correctness_reward)))
    completions = ["<answer>5</answer>", "<answer>4</answer>"]
    assert correctness_reward(["q", "q"], completions, answer=["5", "5"]) == [1.0, 0.0]
    assert negated(["q", "q"], completions, answer=["5", "5"]) == [-1.0, 0.0]
    assert negated.__name__ == "correctness_reward"


def test_the_learning_run_s_seed_and_problems_are_drawn_from_the_secret(monkeypatch):
    """In a notebook the run's seed is grading_seed (the same run every time); graded, each secret draws its own seed,
    and with it other training problems and other held-out problems (always of the test split)."""
    from minigrpo.run import evaluation

    capstone = importlib.import_module("minigrpo.grading.checks.grpo_from_scratch")
    seeds = []

    def stop_before_training(learner, settings, seed):
        seeds.append(seed)
        raise Mismatch("stopped here")

    monkeypatch.setattr(capstone, "_check_update_follows_rewards", stop_before_training)
    grade("check_capstone_learns", {"train_grpo": lambda *args: None})
    for _ in range(2):
        with drawn_from(secrets.token_bytes(32)):
            grade("check_capstone_learns", {"train_grpo": lambda *args: None})
    assert seeds[0] == CAPSTONE_LEARNING["grading_seed"] and len(set(seeds)) == 3
    asked = []
    monkeypatch.setattr(
        evaluation, "evaluate_model", lambda m, t, problems, *a: asked.append(problems) or {"eval_accuracy": 0}
    )
    trained = []
    for seed in seeds:
        train, accuracy = capstone_learning_data(CAPSTONE_LEARNING, seed)
        accuracy(None, None)
        trained.append(set(train["question"]))
    held_out = [set(problems["question"]) for problems in asked]
    assert [len(problems) for problems in asked] == [CAPSTONE_LEARNING["eval_problems"]] * 3
    assert all(is_test_problem(int(q.split()[0]), q.split()[1], int(q.split()[2])) for q in set.union(*held_out))
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert len(held_out[a] & held_out[b]) < 100 and len(trained[a] & trained[b]) < 500
    assert not set.union(*held_out) & set.union(*trained)  # never trained on


def test_fine_tuning_on_the_held_out_answers_loses_the_learning_points():
    """The issue's cheat: a train_grpo that fine-tunes on the answers of the problems the check evaluated on. Graded,
    those are other problems now, and its update is not GRPO's: it moves the weights the same way whatever the
    rewards, so the check stops before the learning run."""
    with drawn_from(secrets.token_bytes(32)):
        result = grade("check_capstone_learns", {"train_grpo": sft_on_held_out()})
    assert result.points == 0
    assert "does not follow the rewards" in result.cases[0].message and "agree (inf" in result.cases[0].message


def test_a_loop_that_loads_weights_trained_elsewhere_loses_the_learning_points():
    """The capstone's replay: weights trained in a notebook cell (here, any other weights), copied in by train_grpo."""
    trained = {name: p.detach() + 1e-3 for name, p in tiny_model_and_tokenizer()[0].named_parameters()}

    def train_grpo(model, tokenizer, dataset, reward_funcs, config):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(trained[name])
        return []

    result = grade("check_capstone_learns", {"train_grpo": train_grpo})
    assert result.points == 0 and "does not follow the rewards" in result.cases[0].message


def test_a_loop_that_never_steps_loses_the_learning_points_with_its_reason():
    result = grade("check_capstone_learns", solution(NO_STEP))
    assert result.points == 0 and "left every weight as it was" in result.cases[0].message


def test_the_solution_s_update_follows_the_rewards_under_several_secrets():
    """The probe on the solution's loop, a batch drawn from each of three secrets: the two steps are opposite to
    about 1e-6 of their difference, far below the tolerance (a loop that ignores the rewards gives infinity)."""
    from minigrpo.grading.checks.grpo_from_scratch import _check_update_follows_rewards

    train_grpo = solution()["train_grpo"]
    for _ in range(3):
        with drawn_from(secrets.token_bytes(32)):
            seed = case_seed(CAPSTONE_LEARNING["grading_seed"])
            agreement, moved = _check_update_follows_rewards(train_grpo, CAPSTONE_LEARNING, seed)
        assert agreement < 1e-4 and moved > 0


def test_a_loop_that_shuffles_with_python_s_random_passes_the_probe():
    """The probe's two steps start from the same states of torch's, Python's and numpy's generators: a loop that
    shuffles its prompts with random.shuffle samples the same batch in the same order both times."""
    source = DEFINITIONS.replace(
        "    order = torch.randperm(len(dataset)).tolist()\n",
        "    order = list(range(len(dataset)))\n    random.shuffle(order)\n",
    )
    assert source != DEFINITIONS
    namespace = {"torch": torch, "copy": __import__("copy"), "random": random}
    exec(compile(source, str(SOLUTION), "exec"), namespace)
    from minigrpo.grading.checks.grpo_from_scratch import _check_update_follows_rewards

    agreement, _ = _check_update_follows_rewards(namespace["train_grpo"], CAPSTONE_LEARNING, 0)
    assert agreement < 1e-4


def test_the_judge_sends_python_s_and_numpy_s_random_states_to_the_kernel():
    """What `remote` does for the probe across processes: the kernel's generators start where the judge's stood."""
    import numpy

    from minigrpo.grading.sandbox import remote

    random.seed(7)
    numpy.random.seed(7)
    states = remote.host_random_states()
    want = (random.random(), float(numpy.random.rand()))
    random.seed(8)
    numpy.random.seed(8)
    request = {"args": (), "kwargs": {}, "rng": torch.get_rng_state(), "threads": 1, "gradient_wrt": None}
    response = remote._call(lambda: (random.random(), float(numpy.random.rand())), {**request, "host_random": states})
    assert response["value"] == want
    remote.set_host_random_states(None)  # an older judge's request: the generators are left alone


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
        ("from minigrpo.grading.checks.labs import reference_grpo_steps", "not one of the capstone's given imports"),
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

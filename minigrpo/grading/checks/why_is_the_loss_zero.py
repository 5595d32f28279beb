"""Exercise 08: why is the loss 0 at step 1? Predict the step-1 loss per loss_type, then observe it."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable

import torch

from minigrpo.advantages import group_relative_advantages
from minigrpo.grading.checks.labs import (
    reference_grpo_steps,
    seeded_rollout,
    single_thread,
    small_grpo_config,
    tiny_model_and_tokenizer,
)
from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, case_seed, cases, check, expect_close, run_check, seeded
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_REWARDS, make_arithmetic_dataset

WORKED_EXAMPLE_LENGTHS = [20, 20, 3, 36, 26, 20, 25, 20]
"""Token lengths |o_i| of the worked example's 8 completions (the tiny model's characters, + 1 for EOS)."""


def step_one_loss(advantages: torch.Tensor, lengths: torch.Tensor, loss_type: str, max_completion_length: int) -> float:
    """The loss at step 1 (ratio 1, KL 0): -sum_i w_i A_i, where w_i is the weight of completion i's tokens."""
    advantages, lengths = advantages.double(), lengths.double()
    if loss_type == "grpo":
        return -advantages.mean().item()  # each sequence weighs 1/N: -mean_i A_i = 0 (groups are centred)
    if loss_type == "dapo":
        return -(advantages * lengths).sum().item() / lengths.sum().item()  # each token weighs 1/sum|o|
    if loss_type == "dr_grpo":
        return -(advantages * lengths).sum().item() / (len(lengths) * max_completion_length)
    raise ValueError(f"loss_type={loss_type!r}: use 'grpo', 'dapo' or 'dr_grpo'.")


def _step_one_hint(loss_type: str) -> str:
    return {
        "grpo": "at step 1 rho = 1 and KL = 0, so each completion contributes -A_i, averaged over the N completions.",
        "dapo": "at step 1 each token of completion i contributes -A_i; dapo averages over all tokens: "
        "-sum_i |o_i| A_i / sum_i |o_i|.",
        "dr_grpo": "-sum_i |o_i| A_i / (N * max_completion_length).",
    }[loss_type]


@cases("check_step_one_loss", references=[step_one_loss])
def _step_one_cases() -> list[Case]:
    def compare(advantages, lengths, loss_type, Tmax, what):
        def run(learner):
            got = learner(advantages.clone(), lengths.clone(), loss_type, Tmax)
            want = step_one_loss(advantages, lengths, loss_type, Tmax)
            wrong = [("the loss is minus the objective: flip the sign.", torch.tensor(-want))]
            expect_close(
                torch.tensor(float(got)),
                torch.tensor(want),
                atol=1e-6,
                what=what,
                hint=_step_one_hint(loss_type),
                mistakes=wrong if want else [],
            )

        return run

    worked = group_relative_advantages(torch.tensor([WORKED_EXAMPLE_REWARDS])).flatten()  # (8,)
    worked_lengths = torch.tensor(WORKED_EXAMPLE_LENGTHS)
    g = seeded(17)
    advantages = group_relative_advantages(torch.randint(0, 3, (3, 4), generator=g).float()).flatten()  # (12,)
    lengths = torch.randint(1, 25, (12,), generator=g)

    def observed(learner):
        with tempfile.TemporaryDirectory() as tmp, single_thread():
            batch = make_arithmetic_dataset(4, "train", seed=case_seed(5))[:4]
            for loss_type in ("grpo", "dapo", "dr_grpo"):
                config = small_grpo_config(tmp, loss_type=loss_type)
                model, tokenizer = tiny_model_and_tokenizer()
                reference = copy.deepcopy(model)
                rollout, rewards = seeded_rollout(model, tokenizer, batch, config, reference, seed=case_seed(3))
                grouped = rewards.view(-1, config.num_generations)  # (B, G)
                adv = group_relative_advantages(
                    grouped, config.scale_rewards, config.baseline, config.std_ddof, config.advantage_epsilon
                ).flatten()
                lengths = rollout.completion_mask.sum(1)  # (N,)
                (metrics,), _ = reference_grpo_steps(model, tokenizer, [batch], config, [case_seed(3)])
                got = learner(adv, lengths, loss_type, config.max_completion_length)
                expect_close(
                    torch.tensor(float(got)),
                    torch.tensor(metrics["loss"]),
                    atol=1e-5,
                    what=f"predicted vs observed {loss_type} loss at step 1",
                    hint=_step_one_hint(loss_type),
                )

    return [
        Case(
            "grpo on the worked example: the loss is exactly 0",
            1,
            compare(worked, worked_lengths, "grpo", 64, "grpo loss (worked example)"),
        ),
        Case("dapo on random groups and lengths (seed 17)", 1, compare(advantages, lengths, "dapo", 32, "dapo loss")),
        Case(
            "dr_grpo on random groups and lengths (seed 17)",
            1,
            compare(advantages, lengths, "dr_grpo", 32, "dr_grpo loss"),
        ),
        Case(
            "matches the trainer's observed step-1 loss on the tiny model, all 3 loss types", 1, observed, timeout=120
        ),
    ]


@cases("check_worked_example_step_one_loss", references=[step_one_loss])
def _worked_step_one_cases() -> list[Case]:
    def run(learner):
        advantages = group_relative_advantages(torch.tensor([WORKED_EXAMPLE_REWARDS])).flatten()  # (8,)
        want = step_one_loss(advantages, torch.tensor(WORKED_EXAMPLE_LENGTHS), "dapo", 64)
        got = learner()
        expect_close(
            torch.tensor(float(got)),
            torch.tensor(want),
            atol=1e-4,
            what="the worked example's dapo loss at step 1",
            hint=_step_one_hint("dapo"),
            mistakes=[("flip the sign: the loss is -J.", torch.tensor(-want))],
        )

    return [Case("your number for the worked example's dapo loss at step 1 (tolerance 1e-4)", 2, run)]


@check
def check_step_one_loss(predicted_step_one_loss: Callable) -> CheckResult:
    """Exercise 08: predicted_step_one_loss(advantages (N,), lengths (N,), loss_type, max_completion_length)."""
    return run_check("check_step_one_loss", predicted_step_one_loss)


@check
def check_worked_example_step_one_loss(worked_example_dapo_loss: Callable[[], float]) -> CheckResult:
    """Exercise 08: a number, the dapo loss at step 1 of the worked example (lengths WORKED_EXAMPLE_LENGTHS)."""
    return run_check("check_worked_example_step_one_loss", worked_example_dapo_loss)


EXERCISE = exercise(
    "08_why_is_the_loss_zero",
    [
        check_step_one_loss,
        check_worked_example_step_one_loss,
    ],
    solution_seconds=85,
    formerly="09_why_is_the_loss_zero",
)

"""Exercise 10: one full GRPO step on the tiny Qwen, compared with the package's GRPOTrainer step.

The learner's step and the reference start from copies of the same model and
sample after the same seed, so rewards, loss, gradients, grad_norm and the
updated weights must all agree. Each step is compared as it is taken, on a seed
whose samples give some group unequal rewards (a step without any is rounding
noise), and the learner's next step starts from the reference's weights.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable

import torch

from minigrpo.grading.checks.labs import (
    ReferenceSteps,
    reference_grpo_steps,
    single_thread,
    small_grpo_config,
    tiny_model_and_tokenizer,
)
from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, Mismatch, case_seed, cases, check, expect_close, run_check
from minigrpo.models import make_reference_model
from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.trainer import GRPOTrainer


@cases("check_grpo_step", references=[GRPOTrainer, reference_grpo_steps, ReferenceSteps])
def _grpo_step_cases() -> list[Case]:
    def compare(overrides: dict, case_seeds: list[int]):
        def run(learner):
            with tempfile.TemporaryDirectory() as tmp, single_thread():
                config = small_grpo_config(tmp, **overrides)
                data = make_arithmetic_dataset(4 * len(case_seeds), "train", seed=case_seed(7))
                batches = [data[4 * i : 4 * i + 4] for i in range(len(case_seeds))]
                base, tokenizer = tiny_model_and_tokenizer()
                reference_model, model = copy.deepcopy(base), copy.deepcopy(base)
                ref_model = make_reference_model(base) if config.beta != 0 else None
                optimizer = torch.optim.AdamW(
                    model.parameters(),
                    lr=config.learning_rate,
                    betas=(config.adam_beta1, config.adam_beta2),
                    weight_decay=config.weight_decay,
                )
                reference = ReferenceSteps(reference_model, tokenizer, config)
                for i, batch in enumerate(batches):
                    step, seed = i + 1, reference.informative_seed(batch, case_seed(case_seeds[i]))
                    expected = reference.step(batch, seed)
                    torch.manual_seed(seed)
                    got = learner(
                        model, ref_model, tokenizer, optimizer, batch, [correctness_reward, format_reward], config
                    )
                    if not isinstance(got, dict) or not {"loss", "reward", "grad_norm"} <= set(got):
                        raise Mismatch(f"step {step}: return a dict with 'loss', 'reward' and 'grad_norm', got {got!r}")
                    _compare_step(got, expected, step)
                    _compare_gradients(model, reference_model, step)
                    _compare_grad_norm(got, expected, step)
                    _compare_parameters(model, reference_model, step)
                    _take_weights(model, reference_model)

        return run

    return [
        Case("beta 0.04, loss_type grpo, 4 prompts x G=4 (seed 0)", 2, compare({}, [0]), timeout=120),
        Case(
            "beta 0, loss_type dapo, epsilon_high 0.28 (seed 1)",
            2,
            compare({"beta": 0.0, "loss_type": "dapo", "epsilon_high": 0.28}, [1]),
            timeout=120,
        ),
        Case("two steps in a row share the optimizer state (seeds 2, 3)", 1, compare({}, [2, 3]), timeout=120),
    ]


def _compare_step(got: dict, expected: dict, step: int) -> None:
    """Reward, then loss, of one step."""
    expect_close(
        torch.tensor(float(got["reward"])),
        torch.tensor(expected["reward"]),
        atol=1e-6,
        what=f"step {step}: mean reward",
        hint="sample once with sample_group_rollout(model, tokenizer, batch['prompt'], config, ref_model) before "
        "anything else random, then score with compute_rewards (each column repeated G times).",
    )
    expect_close(
        torch.tensor(float(got["loss"])),
        torch.tensor(expected["loss"]),
        atol=1e-5,
        what=f"step {step}: loss",
        hint=_COMPOSITION_HINT,
    )


_COMPOSITION_HINT = (
    "advantages = group_relative_advantages(rewards.view(B, G), config.scale_rewards, config.baseline, "
    "config.std_ddof, config.advantage_epsilon).flatten(); logps from per_token_logps(model, rollout.input_ids, "
    "rollout.attention_mask, T, config.temperature); then grpo_loss(logps, rollout.old_per_token_logps, "
    "rollout.ref_per_token_logps, advantages, rollout.completion_mask, config)."
)


def _compare_gradients(model, reference_model, step: int) -> None:
    """The step's (clipped) gradients: the loss's value at step 1 is about 0 whatever the advantages."""
    for (name, p), (_, q) in zip(model.named_parameters(), reference_model.named_parameters(), strict=True):
        if p.grad is not None and q.grad is not None:
            expect_close(
                p.grad,
                q.grad,
                atol=1e-5,
                what=f"step {step}: gradient of {name}",
                hint="the loss matches but its gradient does not (at step 1 the loss is about 0 whatever the "
                "advantages), and the gradients must be zeroed before each backward. " + _COMPOSITION_HINT,
            )


def _compare_grad_norm(got: dict, expected: dict, step: int) -> None:
    expect_close(
        torch.tensor(float(got["grad_norm"])),
        torch.tensor(expected["grad_norm"]),
        atol=1e-4,
        what=f"step {step}: grad_norm",
        hint="return the value of torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm), called "
        "after loss.backward() (the norm before clipping).",
    )


def _compare_parameters(model, reference_model, step: int) -> None:
    """The updated weights agree with the reference's (to 1e-6) on at least 99% of the elements.

    Not all of them: Adam moves an element by about lr * sign(g) even when g is rounding noise, so a gradient
    that differs from the reference's by 1e-9 can flip a few tiny elements by 2 lr.
    """
    differ = total = 0
    for p, q in zip(model.parameters(), reference_model.parameters(), strict=True):
        differ += int(((p.detach() - q.detach()).abs() > 1e-6).sum())
        total += q.numel()
    if differ > 0.01 * total:
        raise Mismatch(
            f"step {step}: {differ} of {total} weights after the step differ from the reference's: call "
            "optimizer.zero_grad(), loss.backward(), clip the gradient norm, then optimizer.step(), once per step."
        )


def _take_weights(model, reference_model) -> None:
    """Copy the reference's weights into the learner's model, in place (its optimizer keeps its state).

    The few elements Adam flips by 2 lr (above) would otherwise change the next step's samples wherever two tokens
    are nearly tied, and with them that step's gradients: the next step must start from the same weights.
    """
    with torch.no_grad():
        for p, q in zip(model.parameters(), reference_model.parameters(), strict=True):
            p.copy_(q)


@check
def check_grpo_step(grpo_step: Callable) -> CheckResult:
    """Exercise 10: grpo_step(model, ref_model, tokenizer, optimizer, batch, reward_funcs, config) -> dict."""
    return run_check("check_grpo_step", grpo_step)


EXERCISE = exercise("10_one_grpo_step", [check_grpo_step], solution_seconds=80, formerly="08_one_grpo_step")

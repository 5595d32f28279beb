"""Exercise 10: one full GRPO step on the tiny Qwen, micro-batched for every loss_type, and the learning-rate schedule.

The learner's step and the reference (GRPOTrainer.update) start from copies of the same model and sample after the
same seed, so rewards, loss, gradients, grad_norm and the updated weights must all agree. Each step is compared as it
is taken, on a seed whose samples give some group unequal rewards (a step without any is rounding noise), and the
learner's next step starts from the reference's weights. The cases are chosen so that each thing the exercise asks
for changes the answer beyond the tolerance: micro-batches of several sizes under all four loss types (a micro-batch
loss not scaled as its loss_type asks is off by the number of micro-batches), and a max_grad_norm far below the tiny
Qwen's gradient norm (a step without the clip keeps a gradient about 15 times too long).

`lr_at(step, config, max_steps)` is compared with the package's (minigrpo.run.schedule.lr_at) on hand-made and random
schedules: constant, linear and cosine, with a warm-up of whole steps or a ratio of max_steps.
"""

from __future__ import annotations

import copy
import random
import tempfile
from collections.abc import Callable

import torch

from minigrpo.config import GRPOConfig
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
from minigrpo.run import schedule
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

    micro = {"per_device_train_batch_size": 4}  # 4 micro-batches of the 16 completions
    return [
        Case("loss_type grpo, beta 0.04, 4 micro-batches of 4 (seed 0)", 1, compare(micro, [0]), timeout=120),
        Case(
            "loss_type bnpo, beta 0, 2 micro-batches of 8 (seed 1)",
            1,
            compare({"loss_type": "bnpo", "beta": 0.0, "per_device_train_batch_size": 8}, [1]),
            timeout=120,
        ),
        Case("loss_type dr_grpo, 4 micro-batches (seed 2)", 1, compare({**micro, "loss_type": "dr_grpo"}, [2]), 120),
        Case(
            "loss_type dapo, beta 0, epsilon_high 0.28, 4 micro-batches (seed 3)",
            1,
            compare({**micro, "beta": 0.0, "loss_type": "dapo", "epsilon_high": 0.28}, [3]),
            timeout=120,
        ),
        Case(
            f"max_grad_norm {CLIPPING_NORM:g}, far below the gradient's norm: the clip acts (seed 4)",
            1,
            compare({"max_grad_norm": CLIPPING_NORM}, [4]),
            timeout=120,
        ),
        Case("two steps in a row share the optimizer state (seeds 5, 6)", 1, compare(micro, [5, 6]), timeout=120),
    ]


CLIPPING_NORM = 0.02
"""max_grad_norm of the clipping case: the tiny Qwen's step has a gradient norm of about 0.3."""


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
    "config.std_ddof, config.advantage_epsilon).flatten(); then per micro-batch of "
    "config.per_device_train_batch_size rows: per_token_logps on its rows, grpo_loss on its rows with "
    "num_items_in_batch = the step's completion tokens (completion_mask.sum()), and backward of the loss times 1 "
    "for dapo (its losses add up to the step's) or 1 / (number of micro-batches) for grpo, bnpo and dr_grpo (each "
    "is a mean over its own rows); the step's loss is the sum of the scaled losses."
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
                hint="the gradients must be zeroed once before the step's first backward, and clipped with "
                "torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm) after the last one (the "
                "gradient compared is the clipped one; at step 1 the loss is about 0 whatever the advantages, so a "
                "right loss can still have a wrong gradient). " + _COMPOSITION_HINT,
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


# --- the learning-rate schedule ----------------------------------------------------------------------------------
_SCHEDULE_HINT = (
    "W warm-up steps (warmup_steps itself when >= 1, else ceil(max_steps * warmup_steps)): rate step / W; then "
    "constant: 1; linear: (max_steps - step) / (max_steps - W); cosine: (1 + cos(pi p)) / 2 with p = (step - W) / "
    "(max_steps - W); never below 0; all times config.learning_rate."
)


def _compare_schedule(settings: list[tuple[dict, int]]):
    def run(learner):
        for fields, max_steps in settings:
            config = GRPOConfig(**fields)
            steps = sorted({0, 1, max_steps // 2, max_steps - 1, max_steps} | _around_warmup(config, max_steps))
            for step in steps:
                want = schedule.lr_at(step, config, max_steps)
                expect_close(
                    torch.tensor(float(learner(step, config, max_steps)), dtype=torch.float64),
                    torch.tensor(want, dtype=torch.float64),
                    atol=1e-9 * config.learning_rate,
                    what=f"lr_at({step}) of {fields}, max_steps {max_steps}",
                    hint=_SCHEDULE_HINT,
                )

    return run


def _around_warmup(config, max_steps: int) -> set[int]:
    warmup = schedule.warmup_steps(config, max_steps)
    return {s for s in (warmup - 1, warmup, warmup + 1) if 0 <= s <= max_steps}


@cases("check_lr_at", references=[schedule.lr_at])
def _lr_at_cases() -> list[Case]:
    draw = random.Random(case_seed(8))
    drawn = []
    for kind in ("constant", "linear", "cosine"):
        warmup = draw.choice([0, draw.randint(1, 12), round(draw.uniform(0.02, 0.3), 3)])
        fields = {"lr_scheduler_type": kind, "warmup_steps": warmup, "learning_rate": draw.choice([1e-6, 3e-4, 1.0])}
        drawn.append((fields, draw.randint(20, 400)))
    return [
        Case(
            "linear without warm-up (TRL's default), and cosine after 10 warm-up steps, over 100 steps",
            1,
            _compare_schedule(
                [
                    ({"lr_scheduler_type": "linear", "learning_rate": 1e-6}, 100),
                    ({"lr_scheduler_type": "cosine", "warmup_steps": 10, "learning_rate": 3e-4}, 100),
                ]
            ),
        ),
        Case("each schedule with a random warm-up (steps or a ratio) and length (seed 8)", 2, _compare_schedule(drawn)),
    ]


@check
def check_lr_at(lr_at: Callable) -> CheckResult:
    """Exercise 10: lr_at(step, config, max_steps) -> float, the learning rate of optimizer step `step` (0, 1, ...)."""
    return run_check("check_lr_at", lr_at)


EXERCISE = exercise(
    "10_one_grpo_step", [check_grpo_step, check_lr_at], solution_seconds=80, formerly="08_one_grpo_step"
)

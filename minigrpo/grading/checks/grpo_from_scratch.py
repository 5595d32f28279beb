"""Exercise 12, the capstone: GRPO from scratch, graded on exactness and on learning.

The learner writes every stage without the package's stage functions: the completion mask, a sampler of G
completions per prompt, per-token log-probs, group-relative advantages, the clipped surrogate with the k3 KL
against a frozen reference, the micro-batched gradient of one pass, the update (num_iterations optimizer steps
with clipping) and the training loop. The checks:

- each function against the package on hand-made and random cases (the mask reuses exercise 02's cases);
- the sampler on what it must guarantee (G rows per prompt, group-major, masks that stop at the first EOS,
  temperature changing the distribution), never on exact tokens;
- exactness on gradients: from the same weights and rollout, the loss and every parameter's gradient of the
  learner's pass equal the package's (GRPOTrainer) within 1e-5 (relative, for gradients above 1), with 4
  micro-batches, on the first pass (ratio 1) and on the second pass of num_iterations=2 (ratio != 1, some tokens
  clipped); then the learner's update gives the package's weights;
- learning: the learner's loop trains the tiny Qwen for a fixed budget and its held-out greedy accuracy must rise
  by a bar (labs.CAPSTONE_LEARNING: the budget, the bar, and how it was measured on the package's own trainer);
- their own code: the notebook's cells import and call no stage function of the package (`own_code`).
"""

from __future__ import annotations

import copy
import functools
import random
import tempfile
import types
from collections.abc import Callable

import numpy
import torch

from minigrpo import advantages as advantages_module
from minigrpo import logprobs as logprobs_module
from minigrpo import losses as losses_module
from minigrpo import rollout as rollout_module
from minigrpo.grading.checks.completion_mask import reference as mask_reference
from minigrpo.grading.checks.labs import (
    CAPSTONE_LEARNING,
    NegatedReward,
    capstone_config,
    capstone_learning_config,
    capstone_learning_data,
    informative_rollout,
    position_sensitive_qwen,
    reference_capstone_update,
    seeded_rollout,
    single_thread,
    tiny_model_and_tokenizer,
    update_follows_rewards,
)
from minigrpo.grading.checks.own_code import stage_function_uses, unwritten
from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import (
    CASES,
    Case,
    CheckResult,
    Mismatch,
    case_seed,
    cases,
    check,
    expect_close,
    notebook_cells,
    run_check,
    seeded,
)
from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.trainer import GRPOTrainer

PROMPTS = 3
"""Prompts in the sampler's and the log-probs' cases."""
CLIPPING_NORM = 0.02
"""max_grad_norm of the update's clipping case: far below the tiny Qwen's gradient norms, so the clip always acts."""
PAD_COLUMNS = 24
"""The log-probs' position case pads every row on the left by this many more columns."""
NEAR_GREEDY_MOST = 7
"""The most different completions the PROMPTS prompts may have in all, 8 samples each at temperature 0.02."""


def _batch(n: int, seed: int = 11) -> dict:
    return make_arithmetic_dataset(n, "test", seed=seed)[:n]


def _uneven_batch(n: int, tokenizer, seed: int = 11) -> dict:
    """n test problems whose first two prompts differ in length (as rendered by the chat template), so that padding
    shows on which side it went: draws 20 n problems and puts a prompt of another length second."""
    data = make_arithmetic_dataset(20 * n, "test", seed=seed)[: 20 * n]  # {column: list}
    texts = [tokenizer.apply_chat_template(prompt, tokenize=False) for prompt in data["prompt"]]
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
    other = next((i for i, length in enumerate(lengths) if length != lengths[0]), 1)
    rows = [0, other] + [i for i in range(1, 20 * n) if i != other][: n - 2]
    return {key: [values[i] for i in rows] for key, values in data.items()}


# --- the completion mask: exercise 02's cases -------------------------------------------------
@cases("check_capstone_completion_mask", references=[rollout_module.completion_mask_from_eos, mask_reference])
def _mask_cases() -> list[Case]:
    return CASES["check_completion_mask"]()


@check
def check_capstone_completion_mask(completion_mask: Callable) -> CheckResult:
    """completion_mask(completion_ids, eos_token_ids, pad_token_id) -> (N, T): 1 up to and including the first EOS."""
    return run_check("check_capstone_completion_mask", completion_mask)


# --- the sampler: its guarantees, not its tokens ----------------------------------------------
def _sample(learner, G: int, temperature: float, max_new_tokens: int = 24, seed: int = 0) -> tuple[dict, dict]:
    model, tokenizer = tiny_model_and_tokenizer()
    batch = _uneven_batch(PROMPTS, tokenizer, seed=case_seed(11))
    torch.manual_seed(case_seed(seed))
    with single_thread():
        out = learner(model, tokenizer, batch["prompt"], G, max_new_tokens, temperature)
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    if not isinstance(out, dict) or not set(keys) <= set(out):
        raise Mismatch(f"return a dict with the keys {', '.join(keys)}; got {type(out).__name__}")
    return {k: torch.as_tensor(out[k]) for k in keys}, {"tokenizer": tokenizer, "model": model, "batch": batch}


def _completions(out: dict) -> list[tuple[int, ...]]:
    """Each row's completion up to its mask's end (the tokens that count)."""
    lengths = out["completion_mask"].long().sum(1).tolist()
    return [tuple(row[: int(n)]) for row, n in zip(out["completion_ids"].tolist(), lengths, strict=True)]


@cases("check_capstone_sampler", references=[rollout_module.sample_group_rollout])
def _sampler_cases() -> list[Case]:
    G = 4

    def shapes_and_groups(learner):
        out, context = _sample(learner, G, 1.0)
        N = PROMPTS * G
        for key in out:
            if out[key].dim() != 2 or out[key].shape[0] != N:
                raise Mismatch(
                    f"{key}: expected {N} rows ({PROMPTS} prompts x G={G}), got shape {tuple(out[key].shape)}. "
                    "Repeat each prompt G times before generating."
                )
        tokenizer = context["tokenizer"]
        for b, prompt in enumerate(context["batch"]["prompt"]):
            text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            for g in range(G):
                row = b * G + g
                ids = out["prompt_ids"][row][out["prompt_mask"][row].bool()].tolist()
                if tokenizer.decode(ids) != text:
                    raise Mismatch(
                        f"row {row} should hold prompt {b} (group-major: row b*G + g is completion g of prompt b), "
                        "rendered with the chat template (add_generation_prompt=True), its mask 1 on its tokens."
                    )
        if (out["prompt_mask"][:, -1] != 1).any():  # the batch's prompts differ in length: some rows are padded
            raise Mismatch(
                "pad prompts on the LEFT (padding_side='left'): generation continues from the last column, so a "
                "right-padded prompt is continued after its padding."
            )

    def stops_at_eos(learner):
        out, context = _sample(learner, G, 1.0, max_new_tokens=24, seed=1)
        model, tokenizer = context["model"], context["tokenizer"]
        eos = rollout_module.eos_token_ids(model, tokenizer)
        T = out["completion_ids"].shape[1]
        if T > 24:
            raise Mismatch(f"completions are {T} tokens long: generate at most max_new_tokens=24.")
        want = rollout_module.completion_mask_from_eos(out["completion_ids"], eos)[0]
        expect_close(
            out["completion_mask"].long(),
            want,
            atol=0,
            what="completion_mask of your samples",
            hint="1 up to and including each row's first EOS, 0 after it (and on the padding generate adds).",
        )
        if not (out["completion_mask"].sum(1) > 0).all():
            raise Mismatch("every completion keeps at least one token (its EOS, or all T when it never ended).")
        is_eos = torch.isin(out["completion_ids"], torch.tensor(eos))
        if not is_eos.any(1).any():
            raise Mismatch("no completion ever ended: pass the model's EOS ids to generate (eos_token_id=...).")

    def temperature_matters(learner):
        near_greedy, _ = _sample(learner, 8, 0.02, max_new_tokens=12, seed=2)
        hot, _ = _sample(learner, 8, 1.5, max_new_tokens=12, seed=2)
        for out in (near_greedy, hot):
            if out["completion_ids"].shape[0] != PROMPTS * 8:
                raise Mismatch(f"expected {PROMPTS * 8} rows for G=8, got {out['completion_ids'].shape[0]}")
        cold_groups = _completions(near_greedy)
        hot_groups = _completions(hot)
        cold_distinct = [len(set(cold_groups[b * 8 : b * 8 + 8])) for b in range(PROMPTS)]
        hot_distinct = [len(set(hot_groups[b * 8 : b * 8 + 8])) for b in range(PROMPTS)]
        if max(hot_distinct) == 1:
            raise Mismatch(
                "at temperature 1.5 the 8 completions of every prompt are identical: sample "
                "(do_sample=True), do not decode greedily, and sample each of the G rows on its own."
            )
        # Near greedy, a prompt whose two best tokens are almost tied can still branch, so the bound leaves room for
        # a few; a sampler that ignores the temperature gives far more (docs/grading.md gives the counts measured).
        if sum(cold_distinct) > NEAR_GREEDY_MOST:
            raise Mismatch(
                f"at temperature 0.02 the completions of a prompt should be (almost) all the same, got {cold_distinct} "
                "different ones per prompt: pass the temperature to generate (logits / temperature), and no top_k / "
                "top_p that changes it."
            )

    return [
        Case("G rows per prompt, group-major, left-padded prompts", 1, shapes_and_groups, timeout=60),
        Case("completions stop at the first EOS; the mask says so", 1, stops_at_eos, timeout=60),
        Case("temperature changes the distribution (0.02: one answer; 1.5: several)", 1, temperature_matters, 90),
    ]


@check
def check_capstone_sampler(sample_completions: Callable) -> CheckResult:
    """sample_completions(model, tokenizer, prompts, G, max_new_tokens, temperature) -> dict of (N, .) tensors."""
    return run_check("check_capstone_sampler", sample_completions)


# --- per-token log-probs --------------------------------------------------------------------
_LOGPS_HINT = (
    "logits at position t - 1 score token t (the off-by-one): logits[:, -T - 1 : -1]; left padding: pass "
    "position_ids = attention_mask.cumsum(-1) - 1 (clamped at 0), as generate does; divide the logits by the "
    "temperature before log_softmax, then gather the tokens' log-probs."
)


@cases("check_capstone_logps", references=[logprobs_module.per_token_logps])
def _logps_cases() -> list[Case]:
    def compare(temperature: float, seed: int):
        def run(learner):
            model, tokenizer = tiny_model_and_tokenizer()
            with tempfile.TemporaryDirectory() as tmp, single_thread():
                config = capstone_config(tmp, prompts_per_step=PROMPTS, temperature=temperature, beta=0.0)
                batch = _batch(PROMPTS, seed=case_seed(11))
                rollout, _ = seeded_rollout(model, tokenizer, batch, config, None, case_seed(seed))
                T = rollout.completion_ids.shape[1]
                with torch.no_grad():
                    want, _ = logprobs_module.per_token_logps(
                        model, rollout.input_ids, rollout.attention_mask, T, temperature
                    )
                fresh, _ = tiny_model_and_tokenizer()  # a model the package never ran: its hooks do not pickle
                got = learner(fresh, rollout.input_ids, rollout.attention_mask, T, temperature)
            mask = rollout.completion_mask.bool()
            got = torch.as_tensor(got).detach()
            if got.shape != want.shape:
                raise Mismatch(f"expected shape {tuple(want.shape)} (N, T), got {tuple(got.shape)}. {_LOGPS_HINT}")
            expect_close(
                torch.where(mask, got, 0.0), torch.where(mask, want, 0.0), atol=1e-4, what="log-probs", hint=_LOGPS_HINT
            )

        return run

    def positions_count(learner):
        """Every row padded on the left by PAD_COLUMNS more columns, scored by a Qwen2 whose rotary frequencies
        depend on the largest position id (position_sensitive_qwen): only position ids numbered from each row's first
        real token (the attention mask's cumulative sum) keep it below the switch."""
        model, tokenizer = tiny_model_and_tokenizer()
        with tempfile.TemporaryDirectory() as tmp, single_thread():
            config = capstone_config(tmp, prompts_per_step=PROMPTS, beta=0.0)
            rollout, _ = seeded_rollout(model, tokenizer, _batch(PROMPTS, case_seed(12)), config, None, case_seed(2))
            N, T = rollout.completion_ids.shape
            pad = torch.full((N, PAD_COLUMNS), tokenizer.pad_token_id, dtype=rollout.input_ids.dtype)
            input_ids = torch.cat([pad, rollout.input_ids], 1)  # (N, PAD_COLUMNS + P + T)
            attention_mask = torch.cat([torch.zeros_like(pad), rollout.attention_mask], 1)
            longest = int(attention_mask.sum(1).max())
            with torch.no_grad():
                want, _ = logprobs_module.per_token_logps(
                    position_sensitive_qwen(model, longest), input_ids, attention_mask, T, 1.0
                )
            fresh = position_sensitive_qwen(tiny_model_and_tokenizer()[0], longest)  # never run by the package
            got = learner(fresh, input_ids, attention_mask, T, 1.0)
        mask = rollout.completion_mask.bool()
        got = torch.as_tensor(got).detach()
        if got.shape != want.shape:
            raise Mismatch(f"expected shape {tuple(want.shape)} (N, T), got {tuple(got.shape)}. {_LOGPS_HINT}")
        expect_close(
            torch.where(mask, got, 0.0),
            torch.where(mask, want, 0.0),
            atol=1e-4,
            what=f"log-probs of rows left-padded by {PAD_COLUMNS} more columns, on a model whose rotary frequencies "
            "depend on the largest position id",
            hint="pass position_ids = attention_mask.cumsum(-1) - 1 (clamped at 0): without them every row is "
            "numbered from its first padding column. " + _LOGPS_HINT,
        )

    return [
        Case("sampled completions, temperature 1 (seed 0)", 1, compare(1.0, 0), timeout=60),
        Case("temperature 0.7 (seed 1)", 1, compare(0.7, 1), timeout=60),
        Case("long left padding: position ids from the attention mask decide (seed 2)", 1, positions_count, 60),
    ]


@check
def check_capstone_logps(per_token_logps: Callable) -> CheckResult:
    """per_token_logps(model, input_ids, attention_mask, T, temperature) -> (N, T)."""
    return run_check("check_capstone_logps", per_token_logps)


# --- group-relative advantages --------------------------------------------------------------
@cases("check_capstone_advantages", references=[advantages_module.group_relative_advantages])
def _advantage_cases() -> list[Case]:
    def compare(rewards: torch.Tensor, G: int, eps: float):
        def run(learner):
            want = advantages_module.group_relative_advantages(rewards.view(-1, G), eps=eps).flatten()
            grouped = rewards.view(-1, G)
            centred = grouped - grouped.mean(1, keepdim=True)
            flipped = -want
            population = torch.nan_to_num(centred / (grouped.std(1, keepdim=True, correction=0) + eps)).flatten()
            interleaved = advantages_module.group_relative_advantages(rewards.view(G, -1).T, eps=eps).T.flatten()
            expect_close(
                learner(rewards.clone(), G, eps),
                want,
                atol=1e-5,
                what=f"advantages of {len(rewards)} rewards, G={G}",
                hint="A_i = (r_i - mean(r)) / (std(r) + eps) within each group of G consecutive rows.",
                mistakes=[
                    ("the sign: a reward above its group's mean gets a POSITIVE advantage (r - mean).", flipped),
                    ("GRPO's std is Bessel-corrected (torch.std's default), not the population std.", population),
                    ("groups are consecutive rows (group-major: rewards.view(B, G)), not every B-th row.", interleaved),
                ],
            )

        return run

    g = seeded(5)
    return [
        Case("rewards 2/1/0 of the worked example, G=8", 1, compare(torch.tensor([2.0, 1, 0, 2, 0, 1, 0, 1]), 8, 1e-4)),
        Case(
            "B=4 G=4, one group all equal (0, never NaN)",
            1,
            compare(torch.cat([torch.ones(4), torch.rand(12, generator=g)]), 4, 1e-4),
        ),
        Case("B=3 G=5 random (seed 5)", 1, compare(torch.randint(0, 3, (15,), generator=g).float(), 5, 1e-4)),
    ]


@check
def check_capstone_advantages(group_advantages: Callable) -> CheckResult:
    """group_advantages(rewards (N,), G, eps) -> (N,)."""
    return run_check("check_capstone_advantages", group_advantages)


# --- the loss ---------------------------------------------------------------------------------
def _loss_inputs(seed: int, N: int = 6, T: int = 7) -> tuple:
    g = seeded(seed)
    logps = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3  # (N, T)
    old = logps + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)  # ratios around 1, some clipped
    ref = logps + 0.2 * torch.randn(N, T, generator=g, dtype=torch.float64)
    advantages = torch.randn(N, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()  # (N, T) right-padded
    return logps, old, ref, advantages, mask


def _package_loss(logps, old, ref, advantages, mask, beta: float, epsilon: float) -> torch.Tensor:
    with tempfile.TemporaryDirectory() as tmp:
        config = capstone_config(tmp, beta=beta, epsilon=epsilon)
    return losses_module.grpo_loss(logps, old, ref, advantages, mask, config)[0]


@cases("check_capstone_loss", references=[losses_module.grpo_loss, losses_module.clipped_surrogate])
def _loss_cases() -> list[Case]:
    def compare(seed: int, beta: float, epsilon: float, on_policy: bool = False):
        def run(learner):
            logps, old, ref, advantages, mask = _loss_inputs(seed)
            if on_policy:
                old = logps.clone()
            want_logps = logps.clone().requires_grad_(True)
            want = _package_loss(want_logps, old, ref, advantages, mask, beta, epsilon)
            (want_gradient,) = torch.autograd.grad(want, want_logps)
            args = (logps.clone().requires_grad_(True), old, ref, advantages, mask, beta, epsilon)
            from minigrpo.grading.framework import value_and_gradient

            got, gradient = value_and_gradient(learner, 0, *args)
            hint = (
                "loss = -mean_i (1/|o_i|) sum_t [min(rho A, clip(rho, 1 - eps, 1 + eps) A) - beta * KL_k3] over the "
                "mask's tokens, rho = exp(logps - old_logps), KL_k3 = exp(ref - logps) - (ref - logps) - 1."
            )
            mistakes = [
                ("the sign: the loss is MINUS the objective (we minimise it).", -want.detach()),
                (
                    "the sign of the advantage: the surrogate is rho * A, so a completion better than its group "
                    "(A > 0) gets more likely; the loss is minus the objective.",
                    _package_loss(logps, old, ref, -advantages, mask, beta, epsilon).detach(),
                ),
                (
                    "the mask: average each completion over its own tokens (mask.sum(1)), never over padding.",
                    _package_loss(logps, old, ref, advantages, torch.ones_like(mask), beta, epsilon).detach(),
                ),
                (
                    "the ratio: the surrogate weighs A by rho = exp(logps - old_logps), clipped, not by logps.",
                    _package_loss(logps, logps, ref, advantages, mask, beta, epsilon).detach(),
                ),
            ]
            expect_close(got, want.detach(), atol=1e-6, what="loss", hint=hint, mistakes=mistakes)
            if gradient is None:
                raise Mismatch("the loss carries no gradient to logps: compute it from logps with torch operations.")
            expect_close(gradient, want_gradient, atol=1e-6, what="d loss / d logps", hint=hint)

        return run

    return [
        Case("on-policy (ratio 1), beta 0.04 (seed 0)", 1, compare(0, 0.04, 0.2, on_policy=True)),
        Case("off-policy ratios, some clipped, beta 0.04 (seed 1)", 1, compare(1, 0.04, 0.2)),
        Case("epsilon 0.1, beta 0.1: the clip and the KL's weight (seed 2)", 1, compare(2, 0.1, 0.1)),
    ]


@check
def check_capstone_loss(grpo_loss: Callable) -> CheckResult:
    """grpo_loss(logps, old_logps, ref_logps, advantages, completion_mask, beta, epsilon) -> scalar."""
    return run_check("check_capstone_loss", grpo_loss)


# --- exactness on gradients, then on the update -------------------------------------------------
def _rollout_dict(rollout) -> dict:
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    return {key: getattr(rollout, key).clone() for key in keys}


def _exact_setup(seed: int, **overrides):
    """The package's update on a seeded rollout, recorded: (a fresh copy of the weights it started from, config,
    rollout dict, advantages, old, ref, the recording) - the recording has the trainer's `losses`, `gradients` and
    `weights` per optimizer step. The copy has never run in the package, whose forward passes leave hooks on a model
    that cannot be sent to the learner's kernel."""
    settings = tuple(sorted(overrides.items()))
    config, rollout, advantages, old, ref, recording = _recorded_update(case_seed(seed), settings)
    return tiny_model_and_tokenizer()[0], config, dict(rollout), advantages, old, ref, recording


@functools.lru_cache(maxsize=8)
def _recorded_update(seed: int, overrides: tuple):
    """Computed once per process and case: the cases read it, never write it."""
    base, tokenizer = tiny_model_and_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        config = capstone_config(tmp, **dict(overrides))
        ref_model = copy.deepcopy(base).requires_grad_(False)
        batch = _batch(4, seed=seed + 20)
        rollout, rewards, _ = informative_rollout(base, tokenizer, batch, config, ref_model, seed)
        grouped = rewards.view(-1, config.num_generations)  # (B, G)
        advantages = advantages_module.group_relative_advantages(grouped).flatten()  # (N,)
        trainer = reference_capstone_update(copy.deepcopy(base), tokenizer, rollout, rewards, config)
    recording = types.SimpleNamespace(losses=trainer.losses, gradients=trainer.gradients, weights=trainer.weights)
    old, ref = rollout.old_per_token_logps, rollout.ref_per_token_logps  # (N, T) each
    return config, _rollout_dict(rollout), advantages, old, ref, recording


def _float32_tolerance(want: torch.Tensor) -> float:
    """1e-5, times the largest |element| of `want` where that is above 1.

    float32 keeps about 7 significant digits, so an embedding gradient of 24 (or a second-pass loss of 34) summed
    in another order is off by about 1e-5 already: at a flat 1e-5 a right solution lost these points under about 1
    secret in 20. A wrong scale, mask or ratio is off by a sizeable fraction of the value.
    """
    return 1e-5 * max(1.0, float(want.abs().max()))


def _compare_gradients(model, want: dict, what: str) -> None:
    """Each parameter's gradient within _float32_tolerance of the package's."""
    for name, p in model.named_parameters():
        if p.grad is None:
            raise Mismatch(f"{what}: {name} has no gradient: call loss.backward() on every micro-batch's loss.")
        expect_close(
            p.grad,
            want[name],
            atol=_float32_tolerance(want[name]),
            what=f"{what}: gradient of {name}",
            hint="each micro-batch's loss counts (micro-batch size) / N of the pass's loss: scale it before "
            "backward so the gradients add up to the whole batch's; mask the padding; use old_logps in the ratio.",
        )


_ACCUMULATE_HINT = (
    "the pass's loss is the mean over all N completions: the micro-batch losses times (micro-batch size) / N, added."
)


@cases("check_capstone_gradients", references=[GRPOTrainer, losses_module.grpo_loss, logprobs_module.per_token_logps])
def _gradient_cases() -> list[Case]:
    def first_pass(learner):
        with single_thread():
            base, config, rollout, advantages, old, ref, trainer = _exact_setup(0, num_iterations=2)
            model = copy.deepcopy(base)
            model.zero_grad(set_to_none=True)
            loss = learner(model, rollout, advantages, old, ref, config)
        expect_close(
            torch.tensor(float(loss)),
            torch.tensor(trainer.losses[0]),
            atol=_float32_tolerance(torch.tensor(trainer.losses[0])),
            what="loss (first pass)",
            hint=_ACCUMULATE_HINT,
        )
        _compare_gradients(model, trainer.gradients[0], "first pass (ratio 1)")

    def second_pass(learner):
        with single_thread():
            base, config, rollout, advantages, old, ref, trainer = _exact_setup(
                1, num_iterations=2, learning_rate=3e-3, epsilon=0.05
            )
            model = copy.deepcopy(base)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(trainer.weights[0][name])  # after the package's first step: pi_theta != pi_old
            model.zero_grad(set_to_none=True)
            loss = learner(model, rollout, advantages, old, ref, config)
        expect_close(
            torch.tensor(float(loss)),
            torch.tensor(trainer.losses[1]),
            atol=_float32_tolerance(torch.tensor(trainer.losses[1])),
            what="loss (second pass, num_iterations=2)",
            hint="on the second pass pi_theta has moved: rho = exp(logps - old_logps) with the old_logps given "
            "(sampled before the first step), clipped to [1 - epsilon, 1 + epsilon]. " + _ACCUMULATE_HINT,
        )
        _compare_gradients(model, trainer.gradients[1], "second pass (ratio != 1, clipping on)")

    return [
        Case("first pass: loss and gradients, 4 micro-batches (seed 0)", 2, first_pass, timeout=90),
        Case("second pass of num_iterations=2: the ratio and the clip count (seed 1)", 2, second_pass, timeout=90),
    ]


@check
def check_capstone_gradients(accumulate_gradients: Callable) -> CheckResult:
    """accumulate_gradients(model, rollout, advantages, old_logps, ref_logps, config) -> float (the pass's loss)."""
    return run_check("check_capstone_gradients", accumulate_gradients)


@cases("check_capstone_update", references=[GRPOTrainer, losses_module.grpo_loss, logprobs_module.per_token_logps])
def _update_cases() -> list[Case]:
    def update(learner, seed: int = 2, **overrides):
        with single_thread():
            base, config, rollout, advantages, old, ref, trainer = _exact_setup(seed, num_iterations=2, **overrides)
            model = copy.deepcopy(base)
            optimizer = torch.optim.AdamW(
                model.parameters(),
                lr=config.learning_rate,
                betas=(config.adam_beta1, config.adam_beta2),
                weight_decay=config.weight_decay,
            )
            learner(model, optimizer, rollout, advantages, old, ref, config)
        steps = len(optimizer.state_dict()["state"]) and next(iter(optimizer.state_dict()["state"].values()))
        taken = int(steps["step"]) if steps else 0
        if taken != config.num_iterations:
            raise Mismatch(
                f"the optimizer took {taken} step(s): num_iterations={config.num_iterations} passes over the "
                "rollout, each ending with optimizer.step()."
            )
        differ = total = 0
        for name, p in model.named_parameters():
            want = trainer.weights[-1][name]
            differ += int(((p.detach() - want).abs() > 1e-6).sum())
            total += want.numel()
        if differ > 0.01 * total:
            raise Mismatch(
                f"{differ} of {total} weights differ from the package's after the update: each pass is "
                "optimizer.zero_grad(), the accumulated gradients, clip_grad_norm_(max_grad_norm), optimizer.step()."
            )

    def clipped(learner):
        """max_grad_norm below both passes' gradient norms (about 0.3 on the tiny Qwen): the clip scales each pass's
        gradient by its own factor, which Adam's second step sees."""
        update(learner, 3, max_grad_norm=CLIPPING_NORM)

    return [
        Case("num_iterations=2 steps from the same weights give the package's weights (seed 2)", 3, update, 120),
        Case(f"the same with max_grad_norm={CLIPPING_NORM:g}: the clip scales every pass (seed 3)", 1, clipped, 120),
    ]


@check
def check_capstone_update(grpo_update: Callable) -> CheckResult:
    """grpo_update(model, optimizer, rollout, advantages, old_logps, ref_logps, config): num_iterations steps."""
    return run_check("check_capstone_update", grpo_update)


# --- it learns ----------------------------------------------------------------------------------
def _one_step(learner, batch, reward_funcs: list, settings: dict, seed: int) -> dict:
    """The weights after one step of the learner's loop on `batch`, from the tiny Qwen and torch's seed `seed`."""
    model, tokenizer = tiny_model_and_tokenizer()
    with tempfile.TemporaryDirectory() as tmp, single_thread():
        config = capstone_learning_config(tmp, {**settings, "max_steps": 1}, seed=seed)
        torch.manual_seed(seed)
        random.seed(seed)  # a loop may shuffle with Python's or numpy's generator: both steps see the same draws
        numpy.random.seed(seed % 2**32)
        learner(model, tokenizer, batch, reward_funcs, config)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _check_update_follows_rewards(learner, settings: dict, seed: int) -> tuple[float, float]:
    """One step on a batch drawn from `seed`, with the rewards and with every reward negated: GRPO's first step
    moves the weights in opposite directions. Raises Mismatch, or returns `labs.update_follows_rewards`'s
    (agreement, spread)."""
    batch = make_arithmetic_dataset(settings["prompts_per_step"], "train", seed=seed + 1)
    rewards = [correctness_reward, format_reward]
    before = {name: p.detach().clone() for name, p in tiny_model_and_tokenizer()[0].named_parameters()}
    plus = _one_step(learner, batch, rewards, settings, seed)
    minus = _one_step(learner, batch, [NegatedReward(func) for func in rewards], settings, seed)
    agreement, moved = update_follows_rewards(before, plus, minus)
    if moved == 0 and all(torch.equal(plus[n], before[n]) for n in before):
        raise Mismatch(
            "one step of your loop (max_steps=1) left every weight as it was: take an optimizer step per pass."
        )
    if agreement > settings["probe_tolerance"]:
        raise Mismatch(
            "your loop's update does not follow the rewards: one step on the grader's batch with every reward "
            f"negated should move the weights the opposite way (GRPO's first step: the advantages change sign, the "
            f"ratio is 1, the KL's gradient 0), but the two steps agree ({agreement:.3g} of their difference, above "
            f"{settings['probe_tolerance']:g}). Train on your samples with their advantages, from this step's "
            "rewards (no answers, no weights from elsewhere); sample with the torch seed the loop is given."
        )
    return agreement, moved


@cases("check_capstone_learns", references=[GRPOTrainer])
def _learning_cases() -> list[Case]:
    settings = CAPSTONE_LEARNING

    def learns(learner):
        seed = case_seed(settings["grading_seed"])  # drawn from the judge's secret when graded
        _check_update_follows_rewards(learner, settings, seed)
        model, tokenizer = tiny_model_and_tokenizer()
        with tempfile.TemporaryDirectory() as tmp, single_thread():
            config = capstone_learning_config(tmp, settings, seed=seed)
            train, accuracy = capstone_learning_data(settings, seed)
            before = accuracy(model, tokenizer)
            torch.manual_seed(seed)
            learner(model, tokenizer, train, [correctness_reward, format_reward], config)
            after = accuracy(model, tokenizer)
        if after - before < settings["bar"]:
            raise Mismatch(
                f"held-out accuracy {before:.3f} -> {after:.3f} ({after - before:+.3f}) in {config.max_steps} "
                f"steps; the bar is {settings['bar']:+.3f} (the package's own trainer rose by at least "
                f"{min(settings['reference_rises'], default=0.0):+.3f} on every seed measured). Pass the gradients "
                "and update checks first, then look at the loop: fresh samples every step, advantages from this "
                "step's rewards, old and reference log-probs without gradients, one optimizer.step per pass."
            )
        return (
            f"held-out accuracy {before:.3f} -> {after:.3f} ({after - before:+.3f}) in {config.max_steps} steps; "
            f"the bar is {settings['bar']:+.3f}"
        )

    return [
        Case(
            "the loop's update follows the rewards, and it trains the tiny Qwen past the bar on problems drawn "
            "when graded",
            4,
            learns,
            timeout=settings["timeout"],
        )
    ]


@check
def check_capstone_learns(train_grpo: Callable) -> CheckResult:
    """train_grpo(model, tokenizer, dataset, reward_funcs, config): trains model in place."""
    return run_check("check_capstone_learns", train_grpo)


# --- their own code -------------------------------------------------------------------------------
@cases("check_capstone_own_code")
def _own_code_cases() -> list[Case]:
    def own_code(learner):
        cells = notebook_cells()
        if cells is None:
            raise Mismatch("the notebook's cells are not available here: run this check in the notebook, or grade it.")
        stubs = unwritten(cells)
        if stubs:
            raise Mismatch(
                f"{stubs} of the exercise's stub lines still raise NotImplementedError: this check "
                "grades your own code once it is all written (it reads the cells: none may import or call a stage "
                "function of minigrpo)."
            )
        uses = stage_function_uses(cells)
        if uses:
            raise Mismatch(
                "the capstone is written without the package's stage functions; your cells use "
                + "; ".join(uses)
                + ". Write them yourself (only the given imports are allowed)."
            )

    return [Case("every function written, no stage function of minigrpo imported or called", 2, own_code)]


@check
def check_capstone_own_code(train_grpo: Callable) -> CheckResult:
    """Reads the notebook's code cells: no minigrpo stage function imported or called."""
    return run_check("check_capstone_own_code", train_grpo)


EXERCISE = exercise(
    "12_grpo_from_scratch",
    [
        check_capstone_completion_mask,
        check_capstone_sampler,
        check_capstone_logps,
        check_capstone_advantages,
        check_capstone_loss,
        check_capstone_gradients,
        check_capstone_update,
        check_capstone_learns,
        check_capstone_own_code,
    ],
    solution_seconds=255,
    formerly="15_grpo_from_scratch",
)

"""The checks behind the exercises, and the grade command.

Each check gives the package's reference full marks and a planted-wrong
implementation less, with the hint that names the mistake. Errors and
timeouts in a learner's code are failed cases, never a crash. Grading
solutions/ gives full marks and exercises/ (as generated) zero.
"""

import csv
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo import grading
from minigrpo.advantages import group_baseline, group_relative_advantages, zero_std_groups
from minigrpo.course.kl_gradients import KL_DIRECTIONS, expected_kl_loss_gradient
from minigrpo.dynamic_sampling import fill_batch, informative_groups
from minigrpo.grading.checks import episode_tool_mask as tool_mask_checks
from minigrpo.grading.checks.completion_mask import MISTAKES as MASK_MISTAKES
from minigrpo.grading.checks.masked_mean_and_logprobs import logps_reference
from minigrpo.grading.framework import case_seed, drawn_from
from minigrpo.logprobs import masked_mean
from minigrpo.losses import (
    aggregate_loss,
    clip_fractions,
    clipped_surrogate,
    grpo_loss,
    importance_ratio,
    kl_penalty,
    reinforce_loss,
)
from minigrpo.ppo import compute_gae
from minigrpo.rollout import completion_mask_from_eos
from minigrpo.run.schedule import lr_at
from minigrpo.tasks.arithmetic import WORKED_EXAMPLE_REWARDS, extract_answer, graded_reward

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# --- reference and planted-wrong implementations --------------------------------------
def first_number(text):
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[0]) if numbers else None


def substring_reward(prompts, completions, completion_ids=None, *, answer, **columns):
    return [2.0 if a in text else 0.0 for text, a in zip(completions, answer, strict=True)]


def population_std_advantages(grouped, eps=1e-4):
    centred = grouped - grouped.mean(1, keepdim=True)
    return torch.nan_to_num(centred / (grouped.std(1, keepdim=True, correction=0) + eps))


def divide_by_T(values, mask, dim=None):
    selected = torch.where(mask.bool(), values, torch.zeros_like(values))
    return selected.sum() / values.numel() if dim is None else selected.sum(dim) / values.shape[dim]


def logps_off_by_one(logits, input_ids, T):
    log_probs = torch.log_softmax(logits[:, -T:], dim=-1)  # the classic bug: position t scores token t
    return log_probs.gather(-1, input_ids[:, -T:].unsqueeze(-1)).squeeze(-1)


def surrogate_with_max(ratio, advantages, low, high):
    A = advantages.unsqueeze(1)
    return torch.max(ratio * A, torch.clamp(ratio, 1 - low, 1 + high) * A)


def kl_reversed(logps, ref):
    log_r = logps - ref
    return torch.exp(log_r) - log_r - 1


def aggregate_token_mean(loss, mask, loss_type, max_completion_length):
    return aggregate_loss(loss, mask, "dapo" if loss_type == "grpo" else loss_type, max_completion_length)


def gae_without_lam(rewards, values, mask, gamma=1.0, lam=0.95):
    return compute_gae(rewards, values, mask, gamma, 1.0)


def ratio_inverted(per_token_logps, old_per_token_logps):
    return torch.exp(old_per_token_logps - per_token_logps)


def clip_fractions_any_sign(ratio, advantages, completion_mask, epsilon_low, epsilon_high):
    """Counts every ratio outside the range, whatever the advantage's sign (the clip may not be active there)."""
    low = (ratio < 1 - epsilon_low).float()
    high = (ratio > 1 + epsilon_high).float()
    return {
        "clip_ratio/low_mean": masked_mean(low, completion_mask).item(),
        "clip_ratio/high_mean": masked_mean(high, completion_mask).item(),
        "clip_ratio/region_mean": masked_mean(low + high, completion_mask).item(),
    }


def step_one_loss_wrong_sign(advantages, lengths, loss_type, max_completion_length):
    return -grading.step_one_loss(advantages, lengths, loss_type, max_completion_length)


def drop_any_equal_pair(grouped):
    return torch.tensor([len(set(row)) == len(row) for row in grouped.tolist()])


def fill_batch_overshooting(generate_round, num_groups_wanted, max_rounds):
    """The refill loop without its last line: it keeps the extra groups of the last round."""
    kept, rounds = [], 0
    while len(kept) < num_groups_wanted and rounds < max_rounds:
        grouped = generate_round()
        keep = grouped.max(dim=1).values != grouped.min(dim=1).values
        kept += [(rounds, group) for group in keep.nonzero()[:, 0].tolist()]
        rounds += 1
    return kept, rounds


def episode_tool_mask(completion_ids, eos_id, assistant_header_ids, start=1, end=0, eos_trained=True):
    """Exercise 16's solution, a learner's own code; each argument plants one mistake: start=0 starts the tool's span
    at the call's EOS, end=-1 ends it before the header's last token, eos_trained=False masks every EOS."""
    ids, header = completion_ids.tolist(), list(assistant_header_ids)
    mask = torch.ones_like(completion_ids)
    t = 0
    while t < len(ids) - 1:
        if ids[t] != eos_id:
            t += 1
            continue
        stop = t + 1
        while stop < len(ids) and ids[stop : stop + len(header)] != header:
            stop += 1
        stop = min(stop + len(header), len(ids))
        mask[t + start : stop + end] = 0
        t = stop
    return mask if eos_trained else mask * (completion_ids != eos_id)


def tool_mask_on_the_call(completion_ids, eos_id, assistant_header_ids):
    """The call masked instead of the result: 0 from each calling turn's first token through its EOS."""
    right = episode_tool_mask(completion_ids, eos_id, assistant_header_ids)
    mask, turn_start = torch.ones_like(right), 0
    for t in range(1, len(right)):
        if right[t - 1] == 1 and right[t] == 0:  # the call ended at t - 1 (its EOS)
            mask[turn_start:t] = 0
        if right[t - 1] == 0 and right[t] == 1:
            turn_start = t
    return mask


def masked_episode_loss(per_token_logps, advantages, completion_mask, tool_mask, use_tool_mask=True):
    trained = completion_mask * tool_mask if use_tool_mask else completion_mask
    per_token = -advantages.unsqueeze(1) * per_token_logps * trained
    return (per_token.sum(1) / trained.sum(1).clamp(min=1)).mean()


def make_grpo_step(scale_rewards=None, clip=True, scale_micro_batches=True):
    """The solution's micro-batched GRPO step; each argument plants one mistake: scale_rewards="batch" the
    std-over-the-batch bug, clip=False no gradient clip, scale_micro_batches=False every micro-batch's loss summed
    unscaled."""
    from minigrpo import compute_rewards, grpo_loss, per_token_logps, repeat_for_group, sample_group_rollout

    def grpo_step(model, ref_model, tokenizer, optimizer, batch, reward_funcs, config):
        G = config.num_generations
        rollout = sample_group_rollout(model, tokenizer, batch["prompt"], config, ref_model)
        columns = {k: repeat_for_group(v, G) for k, v in batch.items() if k != "prompt"}
        _, rewards = compute_rewards(
            reward_funcs,
            repeat_for_group(batch["prompt"], G),
            rollout.completions,
            rollout.completion_id_lists(),
            columns,
            config.reward_weights,
        )
        advantages = group_relative_advantages(
            rewards.view(-1, G), scale_rewards or config.scale_rewards, "mean", config.std_ddof
        ).flatten()
        N, T = rollout.completion_ids.shape
        size = config.per_device_train_batch_size
        micro = [slice(start, start + size) for start in range(0, N, size)]
        scale = 1.0 if config.loss_type == "dapo" or not scale_micro_batches else 1.0 / len(micro)
        optimizer.zero_grad()
        step_loss = 0.0
        for rows in micro:
            logps, _ = per_token_logps(model, rollout.input_ids[rows], rollout.attention_mask[rows], T, 1.0)
            old, ref = (
                None if x is None else x[rows] for x in (rollout.old_per_token_logps, rollout.ref_per_token_logps)
            )
            loss, _ = grpo_loss(
                logps, old, ref, advantages[rows], rollout.completion_mask[rows], config, rollout.completion_mask.sum()
            )
            (loss * scale).backward()
            step_loss += loss.item() * scale
        if clip:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm).item()
        else:
            grad_norm = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm().item()
        optimizer.step()
        return {"loss": step_loss, "reward": rewards.mean().item(), "grad_norm": grad_norm}

    return grpo_step


RIGHT_ANSWERS = {"A": "wrong_detach", "B": "padding_in_mask", "C": "none", "D": "batch_std", "E": "shifted_logps"}
WORKED_DAPO = grading.step_one_loss(
    group_relative_advantages(torch.tensor([WORKED_EXAMPLE_REWARDS])).flatten(),
    torch.tensor(grading.WORKED_EXAMPLE_LENGTHS),
    "dapo",
    64,
)

# check name: (the reference, a planted-wrong implementation, a phrase of the hint it must get)
CHECKS = {
    "check_extract_answer": (extract_answer, first_number, "LAST <answer>"),
    "check_graded_reward": (graded_reward, substring_reward, "well-formed"),
    "check_reward_hacking": (graded_reward, substring_reward, "must score 0"),
    "check_group_relative_advantages": (
        lambda r, eps=1e-4: group_relative_advantages(r, eps=eps),
        population_std_advantages,
        "population std",
    ),
    "check_rloo_advantages": (
        lambda r: r - group_baseline(r, "rloo"),
        lambda r: r - r.mean(1, keepdim=True),
        "leaves r_i out",
    ),
    "check_masked_mean": (masked_mean, divide_by_T, "not by T"),
    "check_per_token_logps": (logps_reference, logps_off_by_one, "off by one"),
    "check_clipped_surrogate": (clipped_surrogate, surrogate_with_max, "not max"),
    "check_kl_k3": (lambda a, b: kl_penalty(a, b, "k3"), kl_reversed, "pi_ref / pi_theta"),
    "check_aggregate_loss": (aggregate_loss, aggregate_token_mean, "token-level mean"),
    "check_compute_gae": (compute_gae, gae_without_lam, "lam"),
    "check_step_one_loss": (grading.step_one_loss, step_one_loss_wrong_sign, "flip the sign"),
    "check_worked_example_step_one_loss": (lambda: WORKED_DAPO, lambda: 0.0, "dapo"),
    "check_importance_ratio": (
        lambda logps, old: importance_ratio(logps, old, torch.ones_like(logps)),
        ratio_inverted,
        "pi_theta / pi_old",
    ),
    "check_clip_fractions": (clip_fractions, clip_fractions_any_sign, "low needs A < 0"),
    "check_failure_modes": (lambda: RIGHT_ANSWERS, lambda: {**RIGHT_ANSWERS, "D": "shifted_logps"}, "std about 1"),
    "check_grpo_step": (make_grpo_step(), make_grpo_step("batch"), "group_relative_advantages"),
    "check_lr_at": (
        lambda step, config, max_steps: lr_at(step, config, max_steps),
        lambda step, config, max_steps: lr_at(step, config.replace(warmup_steps=0), max_steps),
        "W warm-up steps",
    ),
    "check_kl_loss_gradient": (
        expected_kl_loss_gradient,
        lambda e, z, z_ref: expected_kl_loss_gradient("k2" if e == "k3" else e, z, z_ref),
        "forward KL(pi_ref || pi_theta)",
    ),
    "check_kl_directions": (lambda: KL_DIRECTIONS, lambda: {**KL_DIRECTIONS, "k3": "reverse"}, "averages over pi_ref"),
    "check_completion_mask": (
        lambda ids, eos, pad: completion_mask_from_eos(ids, eos)[0],
        lambda ids, eos, pad: (ids != pad).long(),
        "ids != pad_token_id",
    ),
    "check_informative_groups": (informative_groups, drop_any_equal_pair, "ALL its rewards are equal"),
    "check_fill_batch": (fill_batch, fill_batch_overshooting, "drop the extra groups"),
    "check_episode_tool_mask": (episode_tool_mask, tool_mask_on_the_call, "masked the model's calling turn"),
    "check_masked_episode_loss": (
        masked_episode_loss,
        lambda *args: masked_episode_loss(*args, use_tool_mask=False),
        "the tool's tokens were counted",
    ),
}


def test_every_check_is_tested_here():
    """The capstone's checks (exercise 12) are tested in tests/test_capstone.py, on the solution notebook's code."""
    capstone = {name for name in grading.CASES if name.startswith("check_capstone_")}
    assert set(CHECKS) == set(grading.CASES) - capstone and capstone


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_reference_gets_full_marks(name, capsys):
    reference = CHECKS[name][0]
    result = grading.run_check(name, reference, allow_reference=True)  # a learner's check_x refuses the reference
    assert result.passed, [c.message for c in result.cases if not c.passed]
    assert result.points == result.max_points == grading.max_points(name) > 0
    assert f"{name}: {result.max_points:g}/{result.max_points:g} points" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_planted_mistake_fails_with_its_hint(name, capsys):
    _, wrong, hint = CHECKS[name]
    result = grading.run_check(name, wrong, allow_reference=True)  # some planted mistakes call the reference
    assert result.points < result.max_points
    failed = [c for c in result.cases if not c.passed]
    assert any(hint in c.message for c in failed), [c.message for c in failed]
    assert "FAIL" in capsys.readouterr().out


def _mask_before_first(ids, eos, inclusive=True, guard_no_eos=True):
    is_eos = torch.isin(ids, torch.tensor(eos))
    first = is_eos.int().argmax(1)
    if guard_no_eos:
        first = torch.where(is_eos.any(1), first, ids.shape[1])
    columns = torch.arange(ids.shape[1])
    return columns <= first[:, None] if inclusive else columns < first[:, None]


def _mask_before_last(ids, eos, pad):
    is_eos = torch.isin(ids, torch.tensor(eos))
    last = torch.where(is_eos.any(1), ids.shape[1] - 1 - is_eos.flip(1).int().argmax(1), ids.shape[1])
    return torch.arange(ids.shape[1]) <= last[:, None]


WRONG_COMPLETION_MASKS = {
    "argmax": lambda ids, eos, pad: _mask_before_first(ids, eos, guard_no_eos=False),
    "ids_not_pad": lambda ids, eos, pad: ids != pad,
    "excludes_eos": lambda ids, eos, pad: _mask_before_first(ids, eos, inclusive=False),
    "last_eos": _mask_before_last,
    "first_id_only": lambda ids, eos, pad: _mask_before_first(ids, eos[:1]),
    "truncated_empty": lambda ids, eos, pad: (
        _mask_before_first(ids, eos) & torch.isin(ids, torch.tensor(eos)).any(1)[:, None]
    ),
}


@pytest.mark.parametrize("mistake", sorted(WRONG_COMPLETION_MASKS))
def test_each_completion_mask_mistake_gets_its_own_hint(mistake, capsys):
    result = grading.check_completion_mask(WRONG_COMPLETION_MASKS[mistake])
    assert result.points < result.max_points
    assert any(MASK_MISTAKES[mistake] in c.message for c in result.cases if not c.passed)


def test_a_completion_mask_of_bools_or_floats_earns_full_marks_and_the_package_s_earns_none(capsys):
    assert grading.check_completion_mask(lambda ids, eos, pad: _mask_before_first(ids, eos)).passed  # bool
    assert grading.check_completion_mask(lambda ids, eos, pad: _mask_before_first(ids, eos).float()).passed
    result = grading.check_completion_mask(lambda ids, eos, pad: completion_mask_from_eos(ids, eos)[0])
    assert result.points == 0 and "completion_mask_from_eos" in capsys.readouterr().out


def test_the_package_s_dynamic_sampling_earns_none(capsys):
    """Exercise 15's learner function has the package's name, informative_groups: passing the package's own (or
    the zero_std_groups it negates) earns 0, and so does a refill loop built on it."""
    assert grading.check_informative_groups(informative_groups).points == 0
    assert grading.check_informative_groups(lambda grouped: ~zero_std_groups(grouped)).points == 0
    assert grading.check_fill_batch(fill_batch).points == 0
    out = capsys.readouterr().out
    assert "minigrpo.dynamic_sampling.informative_groups" in out and "minigrpo.advantages.zero_std_groups" in out


# --- errors, timeouts, records ------------------------------------------------------------
# Exercise 16: the three typical mistakes of the lesson, each a learner's function, each loses points with its hint
TOOL_MASK_MISTAKES = {
    "call_masked": tool_mask_on_the_call,
    "starts_at_eos": lambda ids, eos, header: episode_tool_mask(ids, eos, header, start=0),
    "ends_early": lambda ids, eos, header: episode_tool_mask(ids, eos, header, end=-1),
    "eos_masked": lambda ids, eos, header: episode_tool_mask(ids, eos, header, eos_trained=False),
}


@pytest.mark.parametrize("mistake", sorted(TOOL_MASK_MISTAKES))
def test_each_episode_tool_mask_mistake_loses_points_with_its_hint(mistake, capsys):
    result = grading.check_episode_tool_mask(TOOL_MASK_MISTAKES[mistake])
    print(f"{mistake}: {result.points:g}/{result.max_points:g}", file=sys.stderr)
    assert result.points < result.max_points
    failed = [c for c in result.cases if not c.passed]
    assert any(tool_mask_checks.MISTAKES[mistake] in c.message for c in failed), [c.message for c in failed]
    # every failure names a known mistake (masking every EOS of an episode cut short is starting at the call's EOS)
    assert all(any(hint in c.message for hint in tool_mask_checks.MISTAKES.values()) for c in failed)


def test_the_episode_tool_mask_solution_earns_full_marks_and_the_package_s_loss_earns_none(capsys):
    assert grading.check_episode_tool_mask(episode_tool_mask).points == 7
    assert grading.check_masked_episode_loss(masked_episode_loss).points == 4
    package_loss = lambda logps, advantages, mask, tool_mask: reinforce_loss(logps, advantages, mask * tool_mask)  # noqa: E731
    assert grading.check_masked_episode_loss(package_loss).points == 0
    assert grading.check_episode_tool_mask(tool_mask_checks.mask_from_spans).points == 0
    assert "minigrpo.losses.reinforce_loss" in capsys.readouterr().out


def test_the_tool_mask_rule_is_the_mask_the_package_assembles_on_every_drawn_episode():
    """The hand-made cases' key (the rule on ids) and the template cases' key (the episode as minigrpo.tool_calling
    assembles it) agree; the drawn episodes cover 0, 1 and 2 rounds, two calls in a turn, a last turn cut short and an
    episode that ends with its call, and change with the grader's secret."""
    header, seen = tool_mask_checks.assistant_header_ids(), set()
    rng = random.Random(0)
    for _ in range(200):
        ids, mask = tool_mask_checks.random_episode(rng)
        assert tool_mask_checks.mask_from_spans(ids, 258, header).tolist() == mask
        assert episode_tool_mask(torch.tensor(ids), 258, header).tolist() == mask
        spans = tool_mask_checks.tool_spans(ids, 258, header)
        seen.add(len(spans))
        last_turn = bytes(token for token in ids[spans[-1][1] if spans else 0 :] if token < 256)
        seen.add("cut short" if ids[-1] != 258 else "ends with its call" if b"</tool_call>" in last_turn else "")
        seen |= {"two calls" for eos, stop in spans if ids[eos + 1 : stop].count(258) == 2}
    assert {0, 1, 2, "cut short", "ends with its call", "two calls"} <= seen

    def first_drawn(secret):
        with drawn_from(secret):
            return tool_mask_checks.random_episode(random.Random(case_seed(16)))[0]

    assert first_drawn(b"a" * 32) != first_drawn(b"b" * 32)


def test_the_masked_episode_loss_reference_has_grpo_loss_s_gradient():
    """Exercise 16's key is reinforce_loss over completion_mask * tool_mask; its gradient is grpo_loss's at ratio 1,
    beta 0, loss_type grpo on the same tensors (Trainer.loss_mask: rollout.trained_mask)."""
    from minigrpo import GRPOConfig

    logps, advantages, completion_mask, tool_mask = tool_mask_checks._random_loss_inputs(
        torch.Generator().manual_seed(0)
    )
    ours, theirs = logps.clone().requires_grad_(), logps.clone().requires_grad_()
    config = GRPOConfig.tiny_cpu(beta=0.0, loss_type="grpo")
    tool_mask_checks.loss_reference(ours, advantages, completion_mask, tool_mask).backward()
    grpo_loss(theirs, None, None, advantages, completion_mask * tool_mask, config)[0].backward()
    torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-7, rtol=0)
    assert (ours.grad[(completion_mask * tool_mask) == 0] == 0).all()


def test_exercise_16_states_the_template_revision_its_checks_render_with():
    notebook = (ROOT / "solutions" / "16_episode_tool_mask.ipynb").read_text()
    assert tool_mask_checks.TEMPLATE_SHA256 in notebook, "the tools chat template changed: re-read exercise 16"


def test_an_exception_in_the_learners_code_is_a_failed_case_with_its_last_line():
    def broken(*args, **kwargs):
        raise ValueError("boom")

    result = grading.check_kl_k3(broken)
    assert result.points == 0 and len(result.cases) == 3
    assert all(c.message == "your code raised ValueError: boom" for c in result.cases)


def test_a_stub_is_reported_as_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise: replace this line")

    result = grading.check_masked_mean(stub)
    assert result.points == 0
    assert all(c.message.startswith("not implemented yet") for c in result.cases)


def test_a_timeout_is_a_failed_case_not_a_hang():
    def forever(learner):
        while True:
            pass

    result = grading.run_case(grading.Case("loops", 2, forever, timeout=0.3), learner=None)
    assert not result.passed and result.points == 0 and result.max_points == 2
    assert "timed out" in result.message


def test_a_timeout_cannot_be_swallowed_by_except_exception():
    def stubborn(learner):
        while True:
            try:
                while True:
                    pass
            except Exception:
                pass

    result = grading.run_case(grading.Case("swallows", 1, stubborn, timeout=0.3), learner=None)
    assert "timed out" in result.message


def test_wrong_shape_and_non_callable_are_failed_cases():
    result = grading.check_clipped_surrogate(lambda ratio, A, low, high: ratio * A)  # A (N,) times (N, T) fails
    assert result.points == 0
    result = grading.check_masked_mean(masked_mean(torch.ones(2, 2), torch.ones(2, 2)))  # called, not passed
    assert result.points == 0 and "pass the function itself" in result.cases[0].message


def test_a_check_remembers_the_function_and_under_the_grader_only_that(monkeypatch, capsys):
    def kl_k3(a, b):
        return kl_penalty(a, b, "k3") * 1.0

    monkeypatch.delitem(grading.GRADED, "check_kl_k3", raising=False)
    assert grading.check_kl_k3(kl_reversed).points == 0
    assert grading.GRADED["check_kl_k3"] is kl_reversed
    monkeypatch.setenv(grading.GRADING_RUN_ENV, "token")
    result = grading.check_kl_k3(kl_k3)  # in a grader's kernel: remembered for the judge, not run here
    assert grading.GRADED["check_kl_k3"] is kl_k3 and result.cases == []
    assert "runs its cases outside the notebook" in capsys.readouterr().out


# Each answer of exercise 14 and the diagnostics at step 1 that show it, and show nothing else: a run matches the
# signature of its own answer and of no other one (so each answer can be read off the run, not found by elimination).
SIGNATURES = {
    "shifted_logps": lambda m: (
        m["diagnostics/nll_minus_entropy"] > 2 and loss_tokens(m) == m["completions/mean_length"]
    ),
    "prompt_in_mask": lambda m: loss_tokens(m) > m["completions/max_length"] + 20,
    "padding_in_mask": lambda m: loss_tokens(m) == m["completions/max_length"] > m["completions/mean_length"],
    "batch_std": lambda m: abs(m["diagnostics/advantage_std_in_group"] - 1) > 0.05,
    "wrong_detach": lambda m: m["grad_norm"] == 0.0,
}


def loss_tokens(metrics):
    return metrics["diagnostics/loss_tokens_per_completion"]


def looks_healthy(metrics):
    return (
        abs(metrics["diagnostics/nll_minus_entropy"]) < 0.1
        and loss_tokens(metrics) == metrics["completions/mean_length"]
        and abs(metrics["diagnostics/advantage_std_in_group"] - 1) < 2e-3
        and metrics["grad_norm"] > 0
    )


def test_failure_mode_runs_show_their_bugs_signatures():
    runs = {name: grading.planted_bug_run(name, max_steps=1) for name in ("healthy", *RIGHT_ANSWERS)}
    runs["prompt_in_mask"] = grading.run_with_bug("prompt_in_mask", max_steps=1)  # a candidate in no mystery run
    answers = {"healthy": "none", **RIGHT_ANSWERS, "prompt_in_mask": "prompt_in_mask"}
    assert set(answers.values()) == {*grading.BUGS, grading.NO_BUG}  # every answer is tested
    assert grading.checks.labs.MYSTERY_RUNS == RIGHT_ANSWERS
    for name, history in runs.items():
        first = history[0]
        shown = {bug for bug, signature in SIGNATURES.items() if signature(first)}
        assert shown == ({answers[name]} - {"none"}), (name, shown)
        assert looks_healthy(first) == (answers[name] == "none"), name
    assert "nll-H" in grading.diagnostics_table(runs) and "longest compl" in grading.diagnostics_table(runs)


def test_mystery_runs_sample_from_their_own_seeds():
    """A healthy mystery run must not be found by matching the healthy run's numbers."""
    seeds = grading.checks.labs.RUN_SEEDS
    assert len(set(seeds.values())) == len(seeds) == len(RIGHT_ANSWERS) + 1


def test_padding_in_mask_puts_every_completion_position_in_the_loss():
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset

    batch = make_arithmetic_dataset(4, "train", seed=5)[:4]
    with tempfile.TemporaryDirectory() as tmp:
        config = grading.small_grpo_config(tmp, beta=0.0)
        model, tokenizer = grading.tiny_model_and_tokenizer()
        rollout, _ = grading.seeded_rollout(model, tokenizer, batch, config, None, 3)
        logps = {}
        for bug in (None, "padding_in_mask"):
            trainer = grading.PlantedBugTrainer(
                model,
                [correctness_reward, format_reward],
                args=config,
                train_dataset=make_arithmetic_dataset(16),
                processing_class=tokenizer,
                bug=bug,
            )
            logps[bug], _, mask = trainer.token_logps(model, rollout)
    assert rollout.completion_mask.sum() < rollout.completion_mask.numel()  # some rows are padded
    torch.testing.assert_close(mask, torch.ones_like(rollout.completion_mask))  # (N, T): the padding counts
    torch.testing.assert_close(logps["padding_in_mask"], logps[None])  # the same tokens scored the same way


def test_informative_rollout_skips_seeds_whose_groups_all_have_equal_rewards(monkeypatch):
    """A case's rollout must carry signal: seeds whose every group has equal rewards (all advantages 0) are skipped;
    when none of `tries` seeds has any, the first seed's rollout is used."""
    from minigrpo.grading.checks import labs

    rewards_by_seed = {
        5: [1.0, 1.0, 0.0, 0.0],  # G = 2: both groups equal
        6: [0.5, 0.5, 0.5, 0.5],
        7: [1.0, 1.0, 0.0, 1.0],  # the second group differs
    }
    sampled = []

    def scripted_rollout(model, tokenizer, batch, config, ref_model, seed):
        sampled.append(seed)
        return f"rollout {seed}", torch.tensor(rewards_by_seed.get(seed, [0.0] * 4))

    monkeypatch.setattr(labs, "seeded_rollout", scripted_rollout)
    config = type("Config", (), {"num_generations": 2})()
    assert labs.informative_rollout(None, None, {}, config, None, 5)[::2] == ("rollout 7", 7)
    assert sampled == [5, 6, 7]
    sampled.clear()
    rollout, rewards, seed = labs.informative_rollout(None, None, {}, config, None, 8, tries=3)
    assert (rollout, seed, sampled) == ("rollout 8", 8, [8, 9, 10, 8])  # none had signal: the first seed's
    assert labs.informative_rollout(None, None, {}, config, None, 6, tries=1)[2] == 6


def test_the_healthy_planted_bug_trainer_matches_the_package():
    """With no bug, the failure-mode trainer's loss and gradient norm are GRPOTrainer's."""
    from minigrpo.models import make_reference_model
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset

    batch = make_arithmetic_dataset(4, "train", seed=5)[:4]
    with tempfile.TemporaryDirectory() as tmp:
        config = grading.small_grpo_config(tmp)
        model, tokenizer = grading.tiny_model_and_tokenizer()
        (want,), _ = grading.reference_grpo_steps(model, tokenizer, [batch], config, [3])
        model, tokenizer = grading.tiny_model_and_tokenizer()
        ref_model = make_reference_model(model)
        trainer = grading.PlantedBugTrainer(
            model,
            [correctness_reward, format_reward],
            args=config,
            train_dataset=make_arithmetic_dataset(16),
            processing_class=tokenizer,
            ref_model=ref_model,
        )
        rollout, rewards = grading.seeded_rollout(model, tokenizer, batch, config, ref_model, 3)
        got = trainer.update(rollout, rewards)
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)


def test_an_unknown_planted_bug_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="shifted_logps"):  # refused before the trainer is built
        grading.PlantedBugTrainer(None, [graded_reward], bug="off_by_two")


# --- the grade command --------------------------------------------------------------------
def broken_notebook() -> nbformat.NotebookNode:
    """A learner's notebook: one check gets a crashing function, the next check's cell fails before it runs."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("def kl_k3(a, b):\n    return 1 / 0"),
        nbformat.v4.new_code_cell("from minigrpo.grading import check_kl_k3\n\ncheck_kl_k3(kl_k3)"),
        nbformat.v4.new_code_cell(
            "from minigrpo.grading import check_masked_mean\n\ncheck_masked_mean(undefined_name)"
        ),
    ]
    return nb


def run_grade(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minigrpo", "grade", *map(str, args)], capture_output=True, text=True)


# Graded beside every solution: a plain function check and the capstone (a model, training and the own-code check in
# the kernel). Every exercise holds stubs only (test_exercises.py reads them all); grading these two shows that stubs
# score 0 on every kind of check, at a fraction of the time all fifteen take (the suite's longest test).
SAMPLED_EXERCISES = ("04_group_relative_advantages", "10_one_grpo_step", "12_grpo_from_scratch")


def _grpo_step_case(name_starts: str):
    return next(c for c in grading.CASES["check_grpo_step"]() if c.name.startswith(name_starts))


@pytest.mark.parametrize(
    "case, shortcut",
    [
        ("max_grad_norm", {"clip": False}),
        ("loss_type grpo", {"scale_micro_batches": False}),
        ("loss_type dr_grpo", {"scale_micro_batches": False}),
    ],
    ids=["no-clip-on-the-clipping-case", "unscaled-micro-batches-grpo", "unscaled-micro-batches-dr_grpo"],
)
def test_a_grpo_step_that_skips_what_the_exercise_asks_loses_the_case_that_needs_it(case, shortcut):
    """Each shortcut is right where it changes nothing (the clip on a gradient below max_grad_norm, the scale with one
    micro-batch): the case that needs it fails it, with the hint that names it, and the solution's step passes it."""
    chosen = _grpo_step_case(case)
    assert grading.run_case(chosen, make_grpo_step()).passed
    result = grading.run_case(chosen, make_grpo_step(**shortcut))
    assert not result.passed
    assert ("clip_grad_norm_" if "clip" in shortcut else "1 / (number of micro-batches)") in result.message


def test_grading_solutions_gives_full_marks_and_exercises_zero(tmp_path):
    """One grading run (its notebooks two at a time, --jobs 2): solutions/, four exercises and a broken notebook, with
    the instructor's CSV beside the JSON.

    It runs every solution cell (a cell that raises is in the report's errors), so nbval leaves solutions/ to it."""
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    (tmp_path / "exercises").mkdir()
    for name in SAMPLED_EXERCISES:
        shutil.copy(ROOT / "exercises" / f"{name}.ipynb", tmp_path / "exercises")
    (tmp_path / "broken").mkdir()
    nbformat.write(broken_notebook(), tmp_path / "broken" / "broken.ipynb")
    # Each notebook under its exercise's own limit, as an instructor grades: the capstone's is 3 x 255 s. A flat
    # --timeout 300 left the capstone 45 s over its solution's time, and in the suite, beside the other worker's
    # tests, its learning case ran out of time (26/30).
    result = run_grade(tmp_path, "--json", "--jobs", 2, "--checks-csv", tmp_path / "grades.csv")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    by_folder = {}
    for notebook in report["notebooks"]:
        folder = Path(notebook["path"]).parent.name
        by_folder.setdefault(folder, []).append(notebook)
        assert notebook["status"] == "ok", notebook
    solutions, exercises = by_folder["solutions"], by_folder["exercises"]
    assert len(solutions) == len(list((ROOT / "solutions").glob("*.ipynb"))) and len(exercises) == len(
        SAMPLED_EXERCISES
    )
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))  # one per notebook and check; lost_points says what failed
    for notebook in solutions:
        lost = [f"{r['check']}: {r['lost_points']}" for r in rows if r["path"] == notebook["path"] and r["lost_points"]]
        assert notebook["points"] == notebook["max_points"] > 0, (notebook["exercise"], lost)
        assert notebook["errors"] == [], notebook
    (capstone,) = [n for n in solutions if n["exercise"] == "12_grpo_from_scratch"]
    (learns,) = [c for c in capstone["checks"] if c["check"] == "check_capstone_learns"]
    assert re.fullmatch(
        r"held-out accuracy 0\.\d+ -> 0\.\d+ \(\+0\.\d+\) in 80 steps; the bar is \+0\.060",
        learns["cases"][0]["message"],
    )
    for notebook in exercises:
        assert notebook["points"] == 0 and notebook["max_points"] > 0, notebook
        checks = {c["check"] for c in notebook["checks"]}
        solution = next(s for s in solutions if Path(s["path"]).name == Path(notebook["path"]).name)
        assert checks == {c["check"] for c in solution["checks"]}  # every check ran, and failed
    total_solution_points = sum(n["max_points"] for n in solutions)
    assert total_solution_points == sum(grading.max_points(name) for name in grading.CASES)
    (broken,) = by_folder["broken"]
    crashed, not_run = broken["checks"]
    assert crashed["check"] == "check_kl_k3" and crashed["points"] == 0
    assert all(c["message"] == "your code raised ZeroDivisionError: division by zero" for c in crashed["cases"])
    assert not_run["check"] == "check_masked_mean" and not_run["points"] == 0 and not_run["max_points"] == 3
    assert "NameError" in not_run["not_run"]
    exercise_points = sum(n["max_points"] for n in exercises)
    assert report["points"] == total_solution_points
    assert report["max_points"] == total_solution_points + exercise_points + 6
    assert [(r["path"], r["check"]) for r in rows] == [
        (n["path"], c["check"]) for n in report["notebooks"] for c in n["checks"]
    ]  # one row per notebook and check, in the report's order
    assert sum(float(r["points"]) for r in rows) == report["points"]
    assert sum(float(r["max_points"]) for r in rows) == report["max_points"]
    (crashed_row,) = [r for r in rows if r["exercise"] == "(broken)" and r["check"] == "check_kl_k3"]
    assert "your code raised ZeroDivisionError" in crashed_row["lost_points"]


def test_exercise_16_graded_its_solution_earns_11_of_11_and_its_bare_exercise_0(tmp_path):
    """The judge, in its own process, renders fresh episodes from its secret: the solution passes every case (the
    hidden ones too) and the handout's stubs fail every one, as not implemented."""
    for folder in ("solutions", "exercises"):
        (tmp_path / folder).mkdir()
        shutil.copy(ROOT / folder / "16_episode_tool_mask.ipynb", tmp_path / folder)
    result = run_grade(tmp_path, "--json", "--jobs", 2)
    assert result.returncode == 0, result.stderr
    by_folder = {Path(n["path"]).parent.name: n for n in json.loads(result.stdout)["notebooks"]}
    solution, bare = by_folder["solutions"], by_folder["exercises"]
    assert (solution["exercise"], solution["points"], solution["max_points"]) == ("16_episode_tool_mask", 11, 11)
    assert solution["errors"] == [] and solution["seconds"] < grading.EXERCISES["16_episode_tool_mask"].time_limit
    assert (bare["points"], bare["max_points"]) == (0, 11)
    cases = [case for check in bare["checks"] for case in check["cases"]]
    assert len(cases) == 9 and all(case["message"].startswith("not implemented yet") for case in cases)


def test_the_score_table_lists_exercise_points_max_and_total(tmp_path):
    path = tmp_path / "broken.ipynb"
    nbformat.write(broken_notebook(), path)
    report = grading.NotebookReport(str(path), checks=[])
    grading.collect(nbformat.read(path, as_version=4), {}, report)
    table = grading.format_scores([report])
    assert re.search(r"broken\s+\(broken\)\s+check_kl_k3\s+0\s+3", table)  # student, exercise (none: the stem)
    assert re.search(r"total\s+0\s+6", table)
    assert "check_masked_mean: did not run" in table


def test_a_notebook_that_runs_out_of_time_is_graded_not_crashed(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import time\ntime.sleep(60)"),
        nbformat.v4.new_code_cell("time.sleep(60)"),  # a cell may run for half the limit: this one ends it
        nbformat.v4.new_code_cell("check_kl_k3(kl_k3)"),
    ]
    path = tmp_path / "slow.ipynb"
    nbformat.write(nb, path)
    (report,) = grading.grade_notebooks([path], timeout=4)
    assert report.status == "timed out"
    assert report.points == 0 and report.max_points == 3
    assert "timed out" in report.checks[0]["not_run"]


def test_a_kernel_that_does_not_answer_at_start_is_started_again_on_new_ports(tmp_path, monkeypatch):
    """Kernels started at once can pick the same free port, and the one that cannot bind never answers: nbclient then
    shuts it down and drops its manager. The grader starts a kernel once more, on a fresh manager, and grades."""
    from minigrpo.grading.sandbox import kernels

    managers, connect = [], kernels.GradingClient.async_start_new_kernel_client

    async def unanswered_once(client):
        managers.append(client.km)
        await connect(client)
        if len(managers) == 1:  # as nbclient does when kernel_info gets no reply in time
            await client._async_cleanup_kernel()
            raise RuntimeError("Kernel didn't respond in 60 seconds")

    monkeypatch.setattr(kernels.GradingClient, "async_start_new_kernel_client", unanswered_once)
    path = tmp_path / "broken.ipynb"
    nbformat.write(broken_notebook(), path)
    (report,) = grading.grade_notebooks([path], timeout=60)
    assert len(managers) == 2 and managers[0] is not managers[1]
    assert report.status == "ok" and (report.points, report.max_points) == (0, 6)  # graded, as without the failure
    assert report.checks[0]["cases"][0]["message"] == "your code raised ZeroDivisionError: division by zero"


def test_exit_codes_for_a_bad_path(tmp_path, capsys):
    assert grading.grade_command(str(tmp_path / "missing.ipynb")) == 2
    assert grading.grade_command(str(tmp_path)) == 2  # a folder without notebooks
    (tmp_path / "notes.txt").write_text("x")
    assert grading.grade_command(str(tmp_path / "notes.txt")) == 2
    assert "error:" in capsys.readouterr().err


def test_the_csv_has_one_row_per_notebook_and_check_and_defuses_formulas(tmp_path):
    from minigrpo.grading.reports.gradebook import CHECK_COLUMNS, write_check_rows

    path = tmp_path / "=HYPERLINK(1).ipynb"
    nbformat.write(broken_notebook(), path)
    report = grading.NotebookReport(str(path), checks=[], seconds=1.25)
    grading.collect(nbformat.read(path, as_version=4), {}, report)
    empty = grading.NotebookReport(str(tmp_path / "empty.ipynb"), status="unreadable", errors=["cannot read it"])
    write_check_rows([report, empty], tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CHECK_COLUMNS
    assert [(r["exercise"], r["check"], r["points"], r["max_points"]) for r in rows] == [
        ("(=HYPERLINK(1))", "check_kl_k3", "0", "3"),  # no exercise: the stem, in parentheses
        ("(=HYPERLINK(1))", "check_masked_mean", "0", "3"),
        ("(empty)", "", "0", "0"),
    ]
    assert rows[0]["student"] == "'=HYPERLINK(1)" and rows[0]["seconds"] == "1.2" and rows[0]["status"] == "ok"
    assert rows[1]["lost_points"].startswith("did not run:") and rows[2]["lost_points"] == "cannot read it"


def test_grade_refuses_jobs_below_one(tmp_path, capsys):
    from minigrpo.__main__ import main

    nbformat.write(broken_notebook(), tmp_path / "broken.ipynb")
    assert main(["grade", str(tmp_path), "--jobs", "0"]) == 2
    assert "--jobs 0" in capsys.readouterr().err

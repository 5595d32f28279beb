"""Exercise 11: the checks of the off-policy ratio and TRL's clip fractions, and the two passes of its notebook."""

import tempfile

import pytest
import torch

from minigrpo import grading
from minigrpo.advantages import group_relative_advantages
from minigrpo.logprobs import masked_mean
from minigrpo.losses import clip_fractions
from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.trainer import GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def fractions(low, high, mean):
    return {
        "clip_ratio/low_mean": mean(low.float()).item(),
        "clip_ratio/high_mean": mean(high.float()).item(),
        "clip_ratio/region_mean": mean((low | high).float()).item(),
    }


def any_sign(ratio, A, mask, lo, hi):
    return fractions(ratio < 1 - lo, ratio > 1 + hi, lambda x: masked_mean(x, mask))


def padding_counted(ratio, A, mask, lo, hi):
    A = A.unsqueeze(1)
    return fractions((ratio < 1 - lo) & (A < 0), (ratio > 1 + hi) & (A > 0), lambda x: x.mean())


def per_completion_mean(ratio, A, mask, lo, hi):
    A = A.unsqueeze(1)
    return fractions((ratio < 1 - lo) & (A < 0), (ratio > 1 + hi) & (A > 0), lambda x: masked_mean(x, mask, 1).mean())


def symmetric_epsilon(ratio, A, mask, lo, hi):
    return clip_fractions(ratio, A, mask, lo, lo)


def swapped_epsilons(ratio, A, mask, lo, hi):
    return clip_fractions(ratio, A, mask, hi, lo)


MISTAKES = [
    ("check_importance_ratio", lambda logp, old: torch.exp(old - logp), "not exp(old_logp - logp)"),
    ("check_importance_ratio", lambda logp, old: logp - old, "take its exp"),
    ("check_importance_ratio", lambda logp, old: logp / old, "log-probs do not divide"),
    ("check_importance_ratio", lambda logp, old: torch.exp(logp.detach() - old), "no gradient"),
    ("check_clip_fractions", any_sign, "low needs A < 0"),
    ("check_clip_fractions", padding_counted, "padding is not a completion token"),
    ("check_clip_fractions", per_completion_mean, "not per completion"),
    ("check_clip_fractions", symmetric_epsilon, "clip-higher"),
    ("check_clip_fractions", swapped_epsilons, "swapped"),
    ("check_clip_fractions", lambda *args: [0.0, 0.0, 0.0], "return a dict with the keys"),
]


@pytest.mark.parametrize(("check", "wrong", "hint"), MISTAKES, ids=[m[2] for m in MISTAKES])
def test_each_known_mistake_gets_its_own_hint(check, wrong, hint, capsys):
    result = grading.run_check(check, wrong, allow_reference=True)  # some mistakes call the package's function
    assert result.points < result.max_points
    assert any(hint in case.message for case in result.cases if not case.passed), [c.message for c in result.cases]


def test_importing_the_packages_functions_earns_nothing():
    from minigrpo.losses import importance_ratio

    assert grading.check_importance_ratio(importance_ratio).points == 0
    assert grading.check_clip_fractions(clip_fractions).points == 0
    assert grading.check_clip_fractions(lambda *args: clip_fractions(*args)).points == 0


def test_the_package_gives_the_hand_computed_fractions():
    """The hand-made table of the exercise, through the package's own clip_fractions (the trainer's metrics)."""
    ratio = torch.tensor([[1.3, 1.25, 0.7, 1.0], [0.75, 1.3, 0.5, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    got = clip_fractions(ratio, torch.tensor([1.0, -1.0]), mask, 0.2, 0.28)
    assert got == pytest.approx(
        {"clip_ratio/low_mean": 1 / 6, "clip_ratio/high_mean": 1 / 6, "clip_ratio/region_mean": 2 / 6}
    )


def test_two_passes_over_one_rollout_ratio_one_then_clipped():
    """num_iterations = 2 on the tiny Qwen: pass 1 sees rho == 1 exactly and clips nothing; pass 2, after one
    optimizer step, sees rho != 1 and clips some tokens, and the trainer logs what clip_fractions gives."""
    dataset = make_arithmetic_dataset(16, "train", seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        config = grading.small_grpo_config(tmp, num_iterations=2)
        model, tokenizer = grading.tiny_model_and_tokenizer()
        trainer = GRPOTrainer(
            model, [correctness_reward, format_reward], args=config, train_dataset=dataset, processing_class=tokenizer
        )
        rollout, rewards = grading.seeded_rollout(model, tokenizer, dataset[:4], config, trainer.ref_model, seed=0)
        assert rollout.old_per_token_logps is not None  # two optimizer steps per generation: pi_old is stored
        advantages = group_relative_advantages(rewards.view(-1, config.num_generations)).flatten()  # (N,)
        mask = trainer.loss_mask(rollout)
        passes = []
        for _ in range(2):
            with torch.no_grad():
                logps, _ = trainer.policy_logps(rollout, slice(None))  # (N, T), what the update is about to see
            ratio = torch.exp(logps - rollout.old_per_token_logps)  # (N, T)
            ours = clip_fractions(ratio, advantages, mask, config.epsilon_low, config.clip_epsilon_high)
            logged = trainer.grpo_step(rollout, advantages, mask)
            passes.append((ratio, ours, logged))
    (ratio_1, ours_1, logged_1), (ratio_2, ours_2, logged_2) = passes
    assert torch.equal(ratio_1[mask.bool()], torch.ones(int(mask.sum())))
    assert ours_1["clip_ratio/region_mean"] == logged_1["clip_ratio/region_mean"] == 0.0
    assert (ratio_2 - 1).abs()[mask.bool()].max() > 0.2
    assert logged_2["clip_ratio/region_mean"] > 0
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert ours_2[key] == pytest.approx(logged_2[key], abs=1e-9)


def test_on_policy_the_ratio_stays_one_after_updates_and_only_the_kl_moves_the_grpo_loss():
    """num_iterations = 1 (exercise 08): after an update, the next rollout still has rho == 1, so the grpo loss is
    -mean(A) + beta * KL (averaged per completion, then over completions), and -mean(A) is 0."""
    from minigrpo.losses import kl_penalty

    dataset = make_arithmetic_dataset(16, "train", seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        config = grading.small_grpo_config(tmp)
        model, tokenizer = grading.tiny_model_and_tokenizer()
        trainer = GRPOTrainer(
            model, [correctness_reward, format_reward], args=config, train_dataset=dataset, processing_class=tokenizer
        )
        for seed in (0, 1):  # the first update moves the policy away from the reference; the second is measured
            rollout, rewards = grading.seeded_rollout(model, tokenizer, dataset[:4], config, trainer.ref_model, seed)
            advantages = group_relative_advantages(rewards.view(-1, config.num_generations)).flatten()  # (N,)
            mask = trainer.loss_mask(rollout)
            with torch.no_grad():
                logps, _ = trainer.policy_logps(rollout, slice(None))  # (N, T)
            logged = trainer.grpo_step(rollout, advantages, mask)
    assert rollout.old_per_token_logps is None  # pi_old is the current policy, detached
    kl = kl_penalty(logps, rollout.ref_per_token_logps, config.kl_estimator)  # (N, T)
    assert masked_mean(kl, mask) > 1e-4
    assert abs(advantages.mean().item()) < 1e-6
    expected = -advantages.mean() + config.beta * masked_mean(kl, mask, dim=1).mean()
    assert logged["loss"] == pytest.approx(expected.item(), abs=1e-7)
    assert logged["clip_ratio/region_mean"] == 0.0

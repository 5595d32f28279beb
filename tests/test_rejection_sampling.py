"""Rejection-sampling fine-tuning: the filter and the loss by hand, the loss equal to pretrain-tiny's SFT loss, and a
short run that learns."""

import math

import pytest
import torch

from minigrpo import GRPOConfig, RejectionSamplingTrainer, best_in_group_mask, rejection_sampling_loss
from minigrpo.course.pretrain import build_sft_batch, sft_loss
from minigrpo.logprobs import completion_logps
from minigrpo.rollout import render_prompts, sample_group_rollout
from minigrpo.tasks.arithmetic import correctness_reward


@pytest.mark.parametrize(
    "rewards, want",
    [
        ([[1, 0, 1, 0]], [[True, False, True, False]]),  # mixed: the right ones
        ([[1, 1, 1, 1]], [[True, True, True, True]]),  # all right: all kept (GRPO: advantages 0)
        ([[0, 0, 0, 0]], [[False, False, False, False]]),  # all wrong: nothing (GRPO: advantages 0 too)
        ([[0.5, 0.2], [0.0, 0.0]], [[True, False], [False, False]]),  # G = 2, shaped rewards: the best only
        ([[-1.0, -2.0]], [[False, False]]),  # a best reward not above min_reward keeps nothing
    ],
)
def test_best_in_group_mask_by_hand(rewards, want):
    assert best_in_group_mask(torch.tensor(rewards, dtype=torch.float)).tolist() == want


def test_min_reward_lets_a_negative_best_through():
    assert best_in_group_mask(torch.tensor([[-1.0, -2.0]]), min_reward=-1.5).tolist() == [[True, False]]


def test_loss_by_hand_and_its_gradient():
    """Kept rows 0 and 2 (3 + 1 tokens): L = -(sum of their 4 log-probs) / 4; row 1 and padding get no gradient."""
    logps = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.1, 0.1, 0.1], [0.125, 0.9, 0.9]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    keep = torch.tensor([True, False, True])
    loss = rejection_sampling_loss(logps, keep, mask, num_kept_tokens=4)
    want = -(math.log(0.5) * 2 + math.log(0.25) + math.log(0.125)) / 4
    assert loss.item() == pytest.approx(want, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, logps)
    torch.testing.assert_close(grad, torch.tensor([[-0.25] * 3, [0.0] * 3, [-0.25, 0.0, 0.0]]))


def test_nothing_kept_gives_zero_not_nan():
    logps = torch.randn(2, 3, requires_grad=True)
    loss = rejection_sampling_loss(logps, torch.tensor([False, False]), torch.ones(2, 3), num_kept_tokens=0)
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, logps)
    assert (grad == 0).all()


@pytest.mark.parametrize("max_completion_length, truncated", [(12, True), (24, False)])
def test_loss_equals_pretrain_tinys_sft_loss_on_the_same_tokens(tiny, train_dataset, max_completion_length, truncated):
    """The kept completions' NLL through the rollout's log-prob kernel equals course.pretrain.sft_loss (the mean
    cross-entropy pretrain-tiny minimises) on the same prompt and completion texts: completions cut off at
    max_completion_length (no EOS to learn), and completions that end with their EOS (which counts)."""
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(num_generations=2, prompts_per_step=2, max_completion_length=max_completion_length,
                                 beta=0.0)  # fmt: skip
    torch.manual_seed(0)
    prompts = train_dataset["prompt"][:2]
    rollout = sample_group_rollout(model, tokenizer, prompts, config)
    assert rollout.is_truncated.tolist() == [truncated] * 4
    texts = [tokenizer.decode(ids) for ids in rollout.completion_id_lists()]  # with their EOS, as the loss counts it
    assert [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] == rollout.completion_id_lists()
    keep = torch.tensor([True, False, True, True])
    mask = rollout.completion_mask.float()
    logps, _ = completion_logps(model, rollout, config)
    ours = rejection_sampling_loss(logps, keep, mask, (mask * keep.unsqueeze(1)).sum())
    rendered = render_prompts(tokenizer, [p for p in prompts for _ in range(2)])
    kept = [i for i in range(4) if keep[i]]
    batch = build_sft_batch([rendered[i] for i in kept], [texts[i] for i in kept], tokenizer)
    torch.testing.assert_close(ours, sft_loss(model, batch), rtol=1e-5, atol=1e-6)


def test_config_errors_say_what_to_change(tiny, train_dataset, small_config):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="Set beta=0.0"):
        RejectionSamplingTrainer(model, [correctness_reward], small_config, train_dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match="Set num_iterations=1"):
        config = small_config.replace(beta=0.0, num_iterations=2)
        RejectionSamplingTrainer(model, [correctness_reward], config, train_dataset, processing_class=tokenizer)


def test_a_short_run_imitates_its_right_answers(tiny, train_dataset, small_config):
    """Ten steps of 8 prompts x G=8 (seeded): every step keeps some answers, and the reward rises."""
    model, tokenizer = tiny
    config = small_config.replace(beta=0.0, max_steps=10, prompts_per_step=8, num_generations=8, save_steps=0,
                                  per_device_train_batch_size=32)  # fmt: skip
    trainer = RejectionSamplingTrainer(model, [correctness_reward], config, train_dataset, processing_class=tokenizer)
    trainer.train()
    history = trainer.state.log_history
    assert all(0 < row["rft/kept_fraction"] <= 1 and math.isfinite(row["loss"]) for row in history)
    first, last = history[:4], history[-4:]
    mean = lambda rows: sum(r["reward"] for r in rows) / len(rows)  # noqa: E731
    assert mean(last) > mean(first), [round(r["reward"], 3) for r in history]

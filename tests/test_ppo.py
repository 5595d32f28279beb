"""PPO on the shared loop: GAE, value clipping, whitening, KL-in-reward by hand; a short run; resume; shared rollout."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

import minigrpo.ppo
import minigrpo.trainer
from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.ppo import (
    PPOConfig,
    PPOTrainer,
    ValueModel,
    clipped_policy_loss,
    clipped_value_loss,
    compute_gae,
    explained_variance,
    masked_whiten,
    per_token_rewards,
    prompt_share_of_variance,
)
from minigrpo.rewards import completion_text
from minigrpo.tasks.arithmetic import correctness_reward, format_reward
from minigrpo.trainer import NonFiniteError, Trainer


# --- GAE ------------------------------------------------------------------------------------------------
def test_gae_matches_hand_computation_with_masked_tail():
    # row 0: 3 real tokens then padding (whose reward 9 and value 5 must not leak); row 1: 4 real tokens
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0], [0.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 5.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    advantages, returns = compute_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # by hand, gamma * lam = 0.45, V after the last real token = 0:
    # row 0: d2 = 1 - 0.7 = 0.3; d1 = 0.9*0.7 - 0.6 = 0.03; d0 = 0.9*0.6 - 0.5 = 0.04
    #        A2 = 0.3, A1 = 0.03 + 0.45*0.3 = 0.165, A0 = 0.04 + 0.45*0.165 = 0.11425
    # row 1: d3 = 2 - 1 = 1; d2 = d1 = d0 = 0.9 - 1 = -0.1
    #        A3 = 1, A2 = -0.1 + 0.45 = 0.35, A1 = -0.1 + 0.1575 = 0.0575, A0 = -0.1 + 0.025875 = -0.074125
    expected = torch.tensor([[0.11425, 0.165, 0.3, 0.0], [-0.074125, 0.0575, 0.35, 1.0]])
    torch.testing.assert_close(advantages, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(returns, expected + values * mask, atol=1e-6, rtol=0)
    assert returns[0, 3] == 0 and advantages[0, 3] == 0


def test_gae_ignores_what_lies_beyond_the_end():
    rewards, values = torch.rand(3, 6), torch.rand(3, 6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    noisy_rewards = torch.where(mask.bool(), rewards, torch.full_like(rewards, 1e3))
    noisy_values = torch.where(mask.bool(), values, torch.full_like(values, -1e3))
    a, r = compute_gae(rewards, values, mask)
    b, s = compute_gae(noisy_rewards, noisy_values, mask)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    torch.testing.assert_close(r, s, atol=1e-6, rtol=0)


def test_gae_with_lambda_one_is_the_monte_carlo_return_minus_the_value():
    rewards, values = torch.rand(4, 5), torch.rand(4, 5)
    mask = torch.ones(4, 5)
    advantages, returns = compute_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = rewards.flip(1).cumsum(1).flip(1)  # sum_{t' >= t} r_t'
    torch.testing.assert_close(advantages, reward_to_go - values, atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, reward_to_go, atol=1e-5, rtol=0)


def test_gae_rejects_left_padding():
    with pytest.raises(AssertionError, match="right-padded"):
        compute_gae(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([[0, 1, 1]]))


# --- rewards, whitening, losses ---------------------------------------------------------------------------
def test_sequence_reward_lands_on_the_last_real_token_and_kl_on_every_real_token():
    sequence_rewards = torch.tensor([1.0, 2.0])
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    rewards = per_token_rewards(sequence_rewards, kl, mask, beta=0.5)
    expected = torch.tensor([[-0.05, -0.1 + 1.0, 0.0, 0.0], [-0.25, -0.25, -0.25, -0.25 + 2.0]])
    torch.testing.assert_close(rewards, expected, atol=1e-6, rtol=0)


def test_whitening_uses_only_real_tokens():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0], [2.0, -50.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # real tokens 1, 2, 3, 2: mean 2, Bessel variance (1 + 0 + 1 + 0) / 3
    std = (2 / 3) ** 0.5
    expected = torch.tensor([[-1 / std, 0.0, 1 / std, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(masked_whiten(values, mask, eps=0.0), expected, atol=1e-6, rtol=0)
    kept_mean = masked_whiten(values, mask, shift_mean=False, eps=0.0)
    torch.testing.assert_close(kept_mean, (expected + 2.0) * mask, atol=1e-6, rtol=0)


def test_value_loss_clipping_by_hand():
    values = torch.tensor([[1.5, 0.0, 100.0]], requires_grad=True)
    old_values = torch.tensor([[1.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, clipfrac = clipped_value_loss(values, old_values, returns, mask, cliprange_value=0.2)
    # token 0: unclipped (1.5 - 2)^2 = 0.25, clipped V = 1.2 -> (1.2 - 2)^2 = 0.64: the max takes 0.64
    # token 1: both (0 - 1)^2 = 1; token 2 is padding
    assert loss.item() == pytest.approx(0.5 * (0.64 + 1.0) / 2, abs=1e-6)
    assert clipfrac.item() == pytest.approx(0.5, abs=1e-6)
    loss.backward()  # the clipped branch is flat in V; token 1: d/dV 0.5 * (V - 1)^2 / 2 = -0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.5, 0.0]]), atol=1e-6, rtol=0)


def test_clipped_policy_loss_by_hand():
    logps = torch.log(torch.tensor([[1.5, 0.5, 7.0]]))  # ratios 1.5, 0.5 against old log-prob 0
    old = torch.zeros(1, 3)
    advantages = torch.tensor([[1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, clipfrac = clipped_policy_loss(logps, old, advantages, mask, 0.2, 0.2)
    # min(1.5, 1.2) = 1.2 (clipped); min(0.5, 0.8) = 0.5 -> loss = -(1.2 + 0.5) / 2
    assert loss.item() == pytest.approx(-0.85, abs=1e-6)
    assert clipfrac.item() == pytest.approx(0.5, abs=1e-6)


def test_value_model_is_a_policy_sized_copy_with_a_scalar_head(tiny):
    model, tokenizer = tiny
    critic = ValueModel.from_policy(model)
    backbone = sum(p.numel() for p in model.base_model.parameters())
    assert sum(p.numel() for p in critic.parameters()) == backbone + model.config.hidden_size + 1
    assert critic.backbone is not model.base_model
    ids = torch.randint(5, 40, (3, 9))
    values = critic(ids, torch.ones_like(ids), logits_to_keep=4)
    assert values.shape == (3, 4) and torch.all(values == 0)  # the head starts at zero


def test_config_messages_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"lam=1.5: GAE's lambda must be in \[0, 1\]"):
        PPOConfig(lam=1.5)
    with pytest.raises(ValueError, match="critic_learning_rate=-1"):
        PPOConfig(critic_learning_rate=-1)
    with pytest.raises(ValueError, match="num_generations=1"):  # GRPOConfig's checks still run
        PPOConfig(num_generations=1)
    assert PPOConfig.tiny_cpu().learning_rate == GRPOConfig.tiny_cpu().learning_rate


# --- PPO on the tiny Qwen ----------------------------------------------------------------------------------
@pytest.fixture
def ppo_config(small_config):
    ppo = PPOConfig.from_config(small_config, critic_learning_rate=1e-3, max_steps=2, save_steps=0)
    return ppo.replace(kl_estimator=PPOConfig.kl_estimator)  # keep PPO's k1


def test_short_ppo_run_changes_policy_and_critic_and_logs_like_grpo(tiny, train_dataset, eval_dataset, ppo_config):
    model, tokenizer = tiny
    config = ppo_config.replace(eval_steps=2)  # 2 steps: the critic's zero head passes no gradient back at step 1
    trainer = PPOTrainer(
        model,
        [correctness_reward, format_reward],
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )
    policy_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    critic_before = {n: p.detach().clone() for n, p in trainer.critic.named_parameters()}
    trainer.train()
    history = trainer.state.log_history
    assert all(not torch.equal(p, policy_before[n]) for n, p in model.named_parameters())
    assert all(not torch.equal(p, critic_before[n]) for n, p in trainer.critic.named_parameters())
    assert [group["lr"] for group in trainer.optimizer.param_groups] == [config.learning_rate, 1e-3]
    rows = [json.loads(line) for line in open(f"{config.output_dir}/metrics.jsonl")]
    assert [r["step"] for r in rows] == [m["step"] for m in history] == [1, 2]
    keys = ["reward", "rewards/correctness_reward/mean", "kl", "entropy", "loss", "loss/value", "grad_norm"]
    keys += ["clip_ratio/region_mean", "completions/mean_length", "time/rollout", "time/update", "time/scoring"]
    assert [key for key in keys if key not in rows[0]] == []
    assert 0.0 <= rows[1]["eval_accuracy"] <= 1.0 and "eval_accuracy" not in rows[0]


def test_ppo_resume_restores_the_critic(tiny, train_dataset, ppo_config, tmp_path):
    model, tokenizer = tiny
    initial = {n: p.detach().clone() for n, p in model.state_dict().items()}
    config = ppo_config.replace(max_steps=2, save_steps=1)
    uninterrupted = PPOTrainer(
        model, [correctness_reward], args=config, train_dataset=train_dataset, processing_class=tokenizer
    )
    uninterrupted.train()
    assert (tmp_path / "run" / "checkpoint-1" / "critic" / "model.safetensors").exists()
    expected_policy = {n: p.detach().clone() for n, p in model.state_dict().items()}
    expected_critic = {n: p.detach().clone() for n, p in uninterrupted.critic.state_dict().items()}

    model.load_state_dict(initial)  # a fresh process: a fresh critic, weights from checkpoint-1
    resumed = PPOTrainer(
        model, [correctness_reward], args=config, train_dataset=train_dataset, processing_class=tokenizer
    )
    assert torch.all(resumed.critic.value_head.weight == 0)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    assert resumed.step == 2
    for name, value in resumed.critic.state_dict().items():
        torch.testing.assert_close(value, expected_critic[name], atol=1e-6, rtol=0)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected_policy[name], atol=1e-6, rtol=0)


def test_ppo_and_grpo_share_the_rollout_code(tiny, train_dataset, small_config, ppo_config, monkeypatch):
    model, tokenizer = tiny
    calls = []
    real = minigrpo.trainer.sample_group_rollout

    def spy(*args, **kwargs):
        calls.append(kwargs["config"] if "config" in kwargs else args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(minigrpo.trainer, "sample_group_rollout", spy)
    one_step = dict(max_steps=1, save_steps=0, prompts_per_step=2)
    GRPOTrainer(
        model,
        [correctness_reward],
        args=small_config.replace(**one_step),
        train_dataset=train_dataset,
        processing_class=tokenizer,
    ).train()
    PPOTrainer(
        model,
        [correctness_reward],
        args=ppo_config.replace(**one_step, output_dir=ppo_config.output_dir + "-ppo"),  # not GRPO's run folder
        train_dataset=train_dataset,
        processing_class=tokenizer,
    ).train()
    assert [type(c).__name__ for c in calls] == ["GRPOConfig", "PPOConfig"]
    assert PPOTrainer.collect_rollout is Trainer.collect_rollout  # GRPO's own adds only DAPO's refill around it
    for stage in ("generate_and_score", "rollout_metrics"):
        assert getattr(PPOTrainer, stage) is getattr(Trainer, stage) is getattr(GRPOTrainer, stage)
    assert PPOTrainer.train is GRPOTrainer.train


def test_ppo_trainer_wants_a_ppo_config(tiny, train_dataset, small_config):
    model, tokenizer = tiny
    with pytest.raises(TypeError, match="PPOTrainer needs a PPOConfig"):
        PPOTrainer(
            model, [correctness_reward], args=small_config, train_dataset=train_dataset, processing_class=tokenizer
        )


# --- PPOConfig: PPO's own knobs, and GRPO's it would ignore --------------------------------------------------
@pytest.mark.parametrize(
    "field, value, instead",
    [
        ("loss_type", "dr_grpo", "token mean over the batch"),
        ("scale_rewards", "none", "whiten_advantages"),
        ("baseline", "rloo", "critic's V"),
        ("importance_sampling_level", "sequence", "per token"),
        ("std_ddof", 0, "Bessel-corrected"),
        ("advantage_epsilon", 1e-3, "whiten_epsilon"),
        ("num_iterations", 2, "num_ppo_epochs"),
    ],
)
def test_ppo_config_refuses_grpo_only_fields_and_says_what_ppo_uses(field, value, instead):
    with pytest.raises(ValueError, match=rf"{field}=.*PPO does not use {field} \(.*{instead}.*Leave {field} at"):
        PPOConfig(**{field: value})
    grpo_default = getattr(GRPOConfig(), field)
    assert getattr(PPOConfig(**{field: grpo_default}), field) == grpo_default  # the default is fine


def test_ppo_config_checks_epochs_mini_batches_and_critic_knobs():
    with pytest.raises(ValueError, match="num_ppo_epochs=0"):
        PPOConfig(num_ppo_epochs=0)
    with pytest.raises(ValueError, match=r"num_mini_batches=3 does not divide the 128 completions.*1, 2, 4, 8"):
        PPOConfig(prompts_per_step=16, num_mini_batches=3)  # 16 prompts x G=8
    with pytest.raises(ValueError, match=r"mini-batches of 48 completions .* per_device_train_batch_size=32"):
        PPOConfig(num_mini_batches=2, per_device_train_batch_size=32, prompts_per_step=12)  # N = 96
    with pytest.raises(ValueError, match="critic_max_grad_norm=-1"):
        PPOConfig(critic_max_grad_norm=-1)
    with pytest.raises(ValueError, match="critic_warmup_steps=-1"):
        PPOConfig(critic_warmup_steps=-1)
    config = PPOConfig(prompts_per_step=16, num_mini_batches=4, max_grad_norm=0.5)
    assert (config.mini_batch_size, config.value_max_grad_norm) == (32, 0.5)
    assert PPOConfig(critic_max_grad_norm=2.0).value_max_grad_norm == 2.0


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])  # the 9 is padding
    # Var(R) over real tokens = 2/3; V = (1, 2, 2): residual (0, 0, 1), variance 2/9 -> 1 - (2/9)/(2/3) = 2/3
    assert explained_variance(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), returns, mask) == pytest.approx(2 / 3, abs=1e-6)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full((1, 4), 5.0), returns, mask) == pytest.approx(0.0, abs=1e-6)  # a constant


# --- the update: epochs x mini-batches, per-model clipping, critic warm-up ------------------------------------
def make_trainer(tiny, train_dataset, ppo_config, **changes):
    model, tokenizer = tiny
    config = ppo_config.replace(**changes)
    return PPOTrainer(model, [correctness_reward], args=config, train_dataset=train_dataset, processing_class=tokenizer)


def test_each_step_takes_epochs_times_mini_batches_optimizer_steps_and_one_schedule_step(
    tiny, train_dataset, ppo_config
):
    trainer = make_trainer(
        tiny, train_dataset, ppo_config, max_steps=2, num_ppo_epochs=3, num_mini_batches=2,
        lr_scheduler_type="linear", warmup_steps=0, logging_steps=1,
    )  # fmt: skip
    trainer.train()
    history = trainer.state.log_history
    assert trainer.optimizer_steps == 2 * 3 * 2
    # the learning rate follows the training step, as TRL's schedule does, not the 6 optimizer steps within it
    rate = trainer.config.learning_rate
    assert [row["learning_rate"] for row in history] == pytest.approx([rate, rate / 2], rel=1e-12)
    assert {"values/explained_variance", "values/explained_variance_fitted", "values/grad_norm"} <= set(history[0])


def test_gradients_are_clipped_per_model(tiny, train_dataset, ppo_config):
    trainer = make_trainer(tiny, train_dataset, ppo_config, max_grad_norm=1.0, critic_max_grad_norm=0.0)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.0  # look at the gradients only
    policy = trainer.optimizer.param_groups[0]["params"]
    critic = trainer.optimizer.param_groups[1]["params"]
    for p in policy:
        p.grad = torch.full_like(p, 10.0)
    for p in critic:
        p.grad = torch.full_like(p, 0.001)
    norms = trainer.clip_and_step_per_model()
    norm = lambda params: torch.sqrt(sum((p.grad**2).sum() for p in params)).item()  # noqa: E731
    assert norms["grad_norm"] == pytest.approx(10.0 * sum(p.numel() for p in policy) ** 0.5, rel=1e-4)
    assert norm(policy) == pytest.approx(1.0, rel=1e-4)  # clipped to max_grad_norm
    assert all(torch.all(p.grad == 0.001) for p in critic)  # 0 = not clipped; one global norm would crush it
    assert norms["values/grad_norm"] == pytest.approx(norm(critic), rel=1e-4)


def test_critic_warmup_trains_only_the_critic(tiny, train_dataset, ppo_config):
    trainer = make_trainer(tiny, train_dataset, ppo_config, max_steps=2, critic_warmup_steps=2)
    policy_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    head_before = trainer.critic.value_head.weight.detach().clone()
    trainer.train()
    history = trainer.state.log_history
    assert all(torch.equal(p, policy_before[n]) for n, p in trainer.model.named_parameters())
    assert not torch.equal(trainer.critic.value_head.weight, head_before)
    assert [m["critic_warmup"] for m in history] == [1.0, 1.0] and "loss/policy" not in history[0]
    rollout, rewards, metrics = trainer.collect_rollout()  # step index 2 >= critic_warmup_steps: the policy moves now
    metrics.update(trainer.update(rollout, rewards))
    assert metrics["critic_warmup"] == 0.0 and "loss/policy" in metrics
    assert any(not torch.equal(p, policy_before[n]) for n, p in trainer.model.named_parameters())


def first_digit_is_even(prompts, completions, completion_ids=None, **columns) -> list[float]:
    """A reward the critic can learn: known from the first answer digit on (correctness would need the sum)."""
    digits = [re.search(r"<answer>-?(\d)", completion_text(c)) for c in completions]  # chat: TRL's message lists
    return [float(d is not None and int(d.group(1)) % 2 == 0) for d in digits]


def test_the_critic_learns_a_return_it_can_predict(tiny, train_dataset, ppo_config):
    # The policy is frozen (critic warm-up all along), so the critic chases a fixed target. Its explained
    # variance is measured on each fresh rollout before the update: completions it has never been fitted on.
    model, tokenizer = tiny
    config = ppo_config.replace(
        max_steps=8, critic_warmup_steps=8, prompts_per_step=8, num_generations=8, per_device_train_batch_size=32,
        num_ppo_epochs=4, num_mini_batches=2, critic_learning_rate=3e-3, beta=0.0,
    )  # fmt: skip
    trainer = PPOTrainer(model, [first_digit_is_even], config, train_dataset, processing_class=tokenizer)
    trainer.train()
    explained = [m["values/explained_variance"] for m in trainer.state.log_history]
    assert abs(explained[0]) < 1e-6  # the zero head: V = 0 everywhere
    assert sum(explained[-3:]) / 3 > 0.2, explained


def test_prompt_share_of_variance_by_hand():
    # two prompts: one always right, one always wrong -> all the variance is between prompts
    assert prompt_share_of_variance(torch.tensor([[1.0, 1.0], [0.0, 0.0]])) == pytest.approx(1.0)
    # each prompt half right: Var within = 1/3 (ddof 1, G = 4), Var(R) = 2/7 (N = 8) -> 1 - (1/3) / (2/7) = -1/6
    grouped = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    assert prompt_share_of_variance(grouped) == pytest.approx(1 - (1 / 3) / (2 / 7))
    assert math.isnan(prompt_share_of_variance(torch.ones(2, 3)))


def test_a_ppo_update_that_overflows_stops_with_the_clear_error_and_saves_no_non_finite_weights(
    tiny, train_dataset, ppo_config
):
    # PPO's update shares GRPO's checks (Trainer.backward, Trainer.clip_gradients): an overflow in the backward
    # pass stops the run before optimizer.step, so no inf or NaN reaches the weights or a checkpoint.
    trainer = make_trainer(tiny, train_dataset, ppo_config, save_steps=1, critic_warmup_steps=0)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.model.model.norm.weight.register_hook(lambda grad: grad * math.inf)
    with pytest.raises(NonFiniteError, match=r"^step 1: the gradient norm is (inf|nan) although the loss was finite"):
        trainer.train()
    assert trainer.optimizer_steps == 0
    assert all(torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())
    assert not list(Path(trainer.config.output_dir).glob("checkpoint-*"))  # nothing saved before step 1


def test_a_nan_ppo_loss_stops_before_backward(tiny, train_dataset, ppo_config, monkeypatch):
    trainer = make_trainer(tiny, train_dataset, ppo_config, critic_warmup_steps=0)
    real = minigrpo.ppo.clipped_policy_loss
    monkeypatch.setattr(minigrpo.ppo, "clipped_policy_loss", lambda *a, **k: tuple(x * math.nan for x in real(*a, **k)))
    with pytest.raises(NonFiniteError, match=r"^step 1: the loss of a micro-batch of \d+ completions is nan"):
        trainer.train()
    assert trainer.optimizer_steps == 0

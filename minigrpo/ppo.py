"""PPO, the algorithm GRPO simplifies: a critic, GAE, and the KL inside the reward.

PPO for language models (InstructGPT, arXiv 2203.02155; "The N+ Implementation
Details of RLHF with PPO", Huang et al. 2024) keeps four models in memory:

| model     | trained? | GRPO                     | PPO                                   |
| --------- | -------- | ------------------------ | ------------------------------------- |
| policy    | yes      | pi_theta                 | pi_theta (the "actor")                |
| reference | no       | pi_ref, KL in the loss   | pi_ref, KL in the per-token reward    |
| reward    | no       | reward functions         | the same reward functions here        |
| critic    | yes      | none: the group mean     | V_phi, same size as the policy        |

Per completion o_i of T_i tokens (token t is the action taken in state
s_t = (q, o_<t)), PPO builds a reward for every token,

    r_t = -beta * KL_t + [t == T_i - 1] * R_i        KL_t = log pi_theta - log pi_ref   (k1)

then asks the critic for V(s_t) and turns both into advantages with GAE:

    delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)       V(s_{T_i}) = 0 (the episode ended)
    A_t     = delta_t + gamma * lam * A_{t+1}         returns R_t = A_t + V(s_t)

The policy loss is the clipped surrogate with these per-token A_t (whitened
over the batch); the critic regresses V(s_t) on R_t with its own clip. GRPO
replaces all of this with A_i = (R_i - mean(R)) / std(R) over the group: no
critic (a second full-size model with its gradients and Adam state), no GAE.

Notation as everywhere: N completions, T completion tokens (right-padded),
`mask` / `completion_mask` (N, T) is 1 on real tokens, a prefix of each row.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import nn
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from minigrpo.config import GRPOConfig
from minigrpo.logprobs import batched_per_token_logps, completion_position_ids, masked_mean, per_token_logps
from minigrpo.losses import kl_penalty
from minigrpo.models import build_tiny_tokenizer, load_model_and_tokenizer, pick_device, precision_context
from minigrpo.rollout import Rollout
from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.trainer import GRPOTrainer, Trainer


# --- the math: small pure functions on (N, T) tensors -------------------------------------------------------
def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token: (N, T) -> (N,) int64 (0 for an empty row)."""
    return (mask.sum(dim=1).long() - 1).clamp(min=0)  # (N,)


def per_token_rewards(
    sequence_rewards: torch.Tensor, per_token_kl: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """PPO-RLHF's reward for every token: -beta * KL_t, plus the sequence reward on the last real token.

    Symbol            | Shape  | Description
    ------------------|--------|-----------------------------------------------------------
    sequence_rewards  | (N,)   | R_i, the reward functions' score of completion i
    per_token_kl      | (N, T) | KL_t to the reference (k1: log pi_old - log pi_ref)
    mask              | (N, T) | 1 on real completion tokens, right-padded
    returns           | (N, T) | r_t, 0 on padding

    The reward lands on the last *real* token, not on column T - 1: with
    right padding, column T - 1 is padding for every completion shorter than
    the longest. GRPO puts the KL in the loss instead (and no critic sees it).
    """
    assert per_token_kl.shape == mask.shape, "per_token_kl and mask must both be (N, T)"
    assert sequence_rewards.shape == mask.shape[:1], "sequence_rewards must be (N,)"
    rewards = torch.where(mask.bool(), -beta * per_token_kl, torch.zeros_like(per_token_kl))  # (N, T)
    last = last_token_index(mask).unsqueeze(1)  # (N, 1)
    return rewards.scatter_add(1, last, sequence_rewards.to(rewards.dtype).unsqueeze(1))  # (N, T)


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv 1506.02438) over right-padded completions.

    Symbol   | Shape  | Description
    ---------|--------|-------------------------------------------------------------------
    rewards  | (N, T) | r_t per token (see per_token_rewards)
    values   | (N, T) | V(s_t), the critic's estimate before token t
    mask     | (N, T) | 1 on real tokens; each row a prefix of ones, then zeros
    returns  | (N, T) | advantages A_t, 0 where mask == 0
             | (N, T) | returns R_t = A_t + V(s_t), the critic's target, 0 where mask == 0

        delta_t = r_t + gamma * V(s_{t+1}) * mask_{t+1} - V(s_t)
        A_t     = delta_t + gamma * lam * A_{t+1}

    Padding is zeroed first, so the state after the last real token is worth 0
    (the episode ended) and nothing from beyond the end leaks back. lam = 1
    gives the Monte-Carlo return minus V; lam = 0 the one-step TD error.
    """
    assert rewards.shape == values.shape == mask.shape, "rewards, values and mask must all be (N, T)"
    mask = mask.to(values.dtype)
    assert (mask[:, 1:] <= mask[:, :-1]).all(), "mask must be right-padded: ones, then zeros, in every row"
    rewards, values = rewards * mask, values * mask  # (N, T)
    N, T = values.shape
    advantages = torch.zeros_like(values)  # (N, T)
    next_advantage = torch.zeros(N, dtype=values.dtype, device=values.device)  # (N,)
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(next_advantage)  # (N,)
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (N,)
        next_advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = next_advantage
    advantages = advantages * mask  # (N, T)
    return advantages, advantages + values  # (N, T), (N, T)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8):
    """(x - mean) / sqrt(var + eps) over the real tokens only; 0 on padding. (N, T) -> (N, T).

    The variance is Bessel-corrected (as TRL's masked_var). shift_mean=False
    keeps the mean (TRL whitens rewards that way). Padding must not count:
    a batch of short answers would otherwise be whitened towards the zeros
    of its padding.
    """
    assert values.shape == mask.shape, "values and mask must both be (N, T)"
    mean = masked_mean(values, mask)
    count = mask.sum().clamp(min=2)
    variance = masked_mean((values - mean) ** 2, mask) * count / (count - 1)
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask  # (N, T)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's loss, 0.5 * mean_t max((V - R)^2, (V_clip - R)^2), and the fraction clipped.

    values (N, T) with gradient; old_values, returns, mask (N, T) -> (), ().
    V_clip = V_old + clip(V - V_old, -c, c): like the policy's ratio clip, a
    new value estimate may not move more than c from the one the advantages
    were computed with; the max keeps the loss pessimistic.
    """
    assert values.shape == old_values.shape == returns.shape == mask.shape, "all inputs must be (N, T)"
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)  # (N, T)
    unclipped_loss, clipped_loss = (values - returns) ** 2, (clipped - returns) ** 2  # (N, T)
    loss = 0.5 * masked_mean(torch.max(unclipped_loss, clipped_loss), mask)
    return loss, masked_mean((clipped_loss > unclipped_loss).float(), mask)


def clipped_policy_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate with a *per-token* advantage, as a loss; and the fraction clipped.

    per_token_logps (N, T) with gradient; old_per_token_logps, advantages, mask (N, T) -> (), ().
    -mean_t min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t), a token
    mean over the batch. GRPO's surrogate is the same min with one A_i per
    completion (minigrpo.losses.clipped_surrogate).
    """
    assert per_token_logps.shape == advantages.shape == mask.shape, "inputs must all be (N, T)"
    ratio = torch.exp(per_token_logps - old_per_token_logps)  # (N, T)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantages  # (N, T)
    loss = -masked_mean(torch.min(unclipped, clipped), mask)
    return loss, masked_mean((clipped < unclipped).float(), mask)


def entropy_bonus(per_token_entropy: torch.Tensor, mask: torch.Tensor, entropy_coef: float) -> torch.Tensor:
    """entropy_coef * mean_t H_t over real tokens: subtracted from the loss to keep exploring. (N, T) -> ()."""
    return entropy_coef * masked_mean(per_token_entropy, mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over real tokens: 1 = a perfect critic, 0 = no better than a constant."""
    variance = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    residual = returns - values
    residual_variance = masked_mean((residual - masked_mean(residual, mask)) ** 2, mask)
    return (1 - residual_variance / variance).item() if variance > 0 else float("nan")


# --- the critic ------------------------------------------------------------------------------------------
class ValueModel(nn.Module):
    """V_phi(s_t): a copy of the policy's transformer with a scalar head instead of the vocabulary head.

    Same architecture and size as the policy, InstructGPT style (there it is
    initialised from the reward model; here, with rule-based rewards, from the
    policy). The head starts at zero, so V = 0 before training.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy) -> ValueModel:
        """A trainable copy of `policy.base_model` (the decoder without lm_head) + Linear(hidden, 1)."""
        backbone = copy.deepcopy(policy.base_model)
        backbone.requires_grad_(True)
        return cls(backbone, policy.config.hidden_size).to(next(policy.parameters()).device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
        """input_ids, attention_mask (n, L = P + T) -> values (n, T) fp32; values[:, t] = V(q, o_<t).

        The same shift as the log-probs: the hidden state at position P - 1 + t
        has seen the prompt and o_<t, the state in which token t is chosen.
        """
        L, T = input_ids.shape[1], logits_to_keep
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=completion_position_ids(attention_mask),
            use_cache=False,
        ).last_hidden_state[:, L - T - 1 : L - 1]  # (n, T, H)
        return self.value_head(hidden).squeeze(-1).float()  # (n, T)


# --- config ----------------------------------------------------------------------------------------------
@dataclass
class PPOConfig(GRPOConfig):
    """GRPOConfig's fields (same names, same meaning) plus PPO's critic and GAE.

    The KL is in the per-token reward with the k1 estimator (InstructGPT, TRL's
    PPOTrainer), not in the loss; `num_iterations` is PPO's number of epochs
    over each rollout; the policy loss is a token mean over the batch.
    """

    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """Per-token KL in the reward; k1 = log pi_old - log pi_ref, as InstructGPT and TRL's PPOTrainer."""
    gamma: float = 1.0
    """Discount per token. 1.0 for RLHF: the one reward comes at the end and every token shares it."""
    lam: float = 0.95
    """GAE lambda in [0, 1]: 0 = one-step TD (low variance, biased by V), 1 = Monte Carlo (unbiased, noisy)."""
    vf_coef: float = 0.1
    """Weight of the critic's loss in loss = policy_loss + vf_coef * value_loss (TRL 0.1)."""
    cliprange_value: float = 0.2
    """c: a new value may move at most c from the one the advantages used (TRL 0.2)."""
    whiten_advantages: bool = True
    """Whiten the per-token advantages over the batch (mean 0, std 1) before the policy loss."""
    whiten_epsilon: float = 1e-8
    """eps in (A - mean) / sqrt(var + eps)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = none, as TRL's PPOTrainer; 0.001-0.01 keeps exploration up)."""
    critic_learning_rate: float | None = None
    """AdamW step size of the critic; None = learning_rate."""

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma={self.gamma}: the discount must be in [0, 1] (1.0 for RLHF).")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam={self.lam}: GAE's lambda must be in [0, 1] (typical 0.95).")
        if self.vf_coef <= 0:
            raise ValueError(f"vf_coef={self.vf_coef}: the critic's loss weight must be > 0 (typical 0.1-1).")
        if self.cliprange_value <= 0:
            raise ValueError(f"cliprange_value={self.cliprange_value}: it must be > 0 (typical 0.2).")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef={self.entropy_coef}: it must be >= 0 (0 = no bonus, typical 0.001-0.01).")
        if self.whiten_epsilon < 0:
            raise ValueError(f"whiten_epsilon={self.whiten_epsilon}: it must be >= 0 (typical 1e-8).")
        if self.critic_learning_rate is not None and self.critic_learning_rate <= 0:
            raise ValueError(
                f"critic_learning_rate={self.critic_learning_rate}: it must be > 0, or None to use learning_rate."
            )

    @property
    def value_learning_rate(self) -> float:
        return self.learning_rate if self.critic_learning_rate is None else self.critic_learning_rate

    @classmethod
    def tiny_cpu(cls, **overrides) -> PPOConfig:
        """GRPOConfig.tiny_cpu() plus the critic's settings: it learns at 1e-3, ~3x the policy's 3e-4 (a
        regression onto returns tolerates a larger step; chosen by hand, not swept)."""
        return super().tiny_cpu(**{**TINY_PPO_SETTINGS, **overrides})

    @classmethod
    def qwen_t4(cls, **overrides) -> PPOConfig:
        """GRPOConfig.qwen_t4() with the critic at 1e-5 (10x the policy's 1e-6; not swept)."""
        return super().qwen_t4(**{"critic_learning_rate": 1e-5, **overrides})


TINY_PPO_SETTINGS = dict(critic_learning_rate=1e-3, vf_coef=0.1, lam=0.95)


# --- the trainer -------------------------------------------------------------------------------------------
class PPOTrainer(Trainer):
    """PPO on the shared loop: the same rollouts, rewards, metrics file and checkpoints as GRPOTrainer.

    Usage::

        trainer = PPOTrainer(model, tokenizer, [correctness_reward], train_dataset, PPOConfig.tiny_cpu())
        history = trainer.train()

    The critic is a fourth model (`self.critic`), checkpointed next to the
    policy in checkpoint-N/critic/.
    """

    def __init__(
        self,
        model,
        tokenizer,
        reward_funcs,
        train_dataset,
        config: PPOConfig | None = None,
        eval_dataset=None,
        ref_model=None,
        critic: ValueModel | None = None,
    ):
        config = config if config is not None else PPOConfig()
        if not isinstance(config, PPOConfig):
            raise TypeError(
                f"PPOTrainer needs a PPOConfig, got {type(config).__name__}: use PPOConfig(...) or "
                "PPOConfig(**dataclasses.asdict(grpo_config))."
            )
        self.critic = critic if critic is not None else ValueModel.from_policy(model)  # before the optimizer exists
        self.critic.train()
        super().__init__(model, tokenizer, reward_funcs, train_dataset, config, eval_dataset, ref_model)
        self._give_critic_its_learning_rate()

    def trainable_modules(self) -> dict[str, nn.Module]:
        return {**super().trainable_modules(), "critic": self.critic}

    def _give_critic_its_learning_rate(self) -> None:
        """Move the critic's parameters into their own optimizer group (lr = config.value_learning_rate)."""
        critic_params = {id(p) for p in self.critic.parameters()}
        group = self.optimizer.param_groups[0]
        group["params"] = [p for p in group["params"] if id(p) not in critic_params]
        self.optimizer.add_param_group(
            {"params": [p for p in self.critic.parameters() if p.requires_grad], "lr": self.config.value_learning_rate}
        )
        schedule = self.scheduler.lr_lambdas[0]  # the same warm-up / decay for both groups
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)

    # --- scoring: values, KL-in-reward, GAE (no gradients) -----------------------------------------------------
    @torch.no_grad()
    def score_rollout(self, rollout: Rollout, rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        """old log-probs, old values, per-token rewards, advantages and returns, all (N, T)."""
        config = self.config
        mask = self.loss_mask(rollout)
        input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        T = rollout.completion_ids.shape[1]
        old_logps = rollout.old_per_token_logps
        with precision_context(self.device):
            if old_logps is None:  # num_iterations == 1: the rollout skipped it, but the KL-in-reward needs it
                old_logps = batched_per_token_logps(
                    self.model, input_ids, attention_mask, T, config.per_device_train_batch_size,
                    config.temperature, config.logprob_chunk_size,
                )  # fmt: skip
            old_values = torch.cat(
                [self.critic(input_ids[rows], attention_mask[rows], T) for rows in self._row_slices(len(input_ids))]
            )  # (N, T)
        if rollout.ref_per_token_logps is not None:
            kl = kl_penalty(old_logps, rollout.ref_per_token_logps, config.kl_estimator)  # (N, T)
        else:
            kl = torch.zeros_like(old_logps)
        token_rewards = per_token_rewards(rewards.float(), kl, mask, config.beta)  # (N, T)
        advantages, returns = compute_gae(token_rewards, old_values, mask, config.gamma, config.lam)
        if config.whiten_advantages:
            advantages = masked_whiten(advantages, mask, eps=config.whiten_epsilon)
        return dict(
            old_logps=old_logps, old_values=old_values, kl=kl, advantages=advantages, returns=returns, mask=mask
        )

    def loss_mask(self, rollout: Rollout) -> torch.Tensor:
        mask = rollout.completion_mask
        if self.config.mask_truncated_completions:
            mask = mask * (~rollout.is_truncated).unsqueeze(1)  # (N, T)
        return mask

    def _row_slices(self, num_rows: int) -> list[slice]:
        """Micro-batches of per_device_train_batch_size completions."""
        size = self.config.per_device_train_batch_size
        return [slice(start, start + size) for start in range(0, num_rows, size)]

    # --- the update -------------------------------------------------------------------------------------------
    def optimize(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        started = time.perf_counter()
        scored = self.score_rollout(rollout, rewards)
        mask = scored["mask"]
        metrics = {
            "time/scoring": time.perf_counter() - started,
            "kl": masked_mean(scored["kl"], mask).item(),
            "advantages/abs_mean": masked_mean(scored["advantages"].abs(), mask).item(),
            "values/mean": masked_mean(scored["old_values"], mask).item(),
            "returns/mean": masked_mean(scored["returns"], mask).item(),
            "values/explained_variance": explained_variance(scored["old_values"], scored["returns"], mask),
        }
        for _ in range(self.config.num_iterations):
            metrics.update(self.update_policy_and_critic(rollout, scored))
        return metrics

    def update_policy_and_critic(self, rollout: Rollout, scored: dict) -> dict:
        """One PPO epoch: loss = policy_loss + vf_coef * value_loss - entropy bonus, in micro-batches.

        One backward pass through both models per micro-batch (as TRL's
        PPOTrainer): the policy's and the critic's activations are alive together.
        """
        config = self.config
        input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
        T = rollout.completion_ids.shape[1]
        accumulation = config.gradient_accumulation_steps
        totals: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for rows in self._row_slices(input_ids.shape[0]):
            mask = scored["mask"][rows]
            with precision_context(self.device):
                logps, entropy = per_token_logps(
                    self.model, input_ids[rows], attention_mask[rows], T, config.temperature, config.logprob_chunk_size
                )
                values = self.critic(input_ids[rows], attention_mask[rows], T)  # (n, T)
            policy_loss, policy_clipped = clipped_policy_loss(
                logps, scored["old_logps"][rows], scored["advantages"][rows], mask, config.epsilon_low,
                config.clip_epsilon_high,
            )  # fmt: skip
            value_loss, value_clipped = clipped_value_loss(
                values, scored["old_values"][rows], scored["returns"][rows], mask, config.cliprange_value
            )
            loss = policy_loss + config.vf_coef * value_loss - entropy_bonus(entropy, mask, config.entropy_coef)
            (loss / accumulation).backward()
            step_metrics = {
                "loss": loss.item(),
                "loss/policy": policy_loss.item(),
                "loss/value": value_loss.item(),
                "clip_ratio/region_mean": policy_clipped.item(),
                "values/clipfrac": value_clipped.item(),
                "entropy": masked_mean(entropy.detach(), mask).item(),
            }
            for key, value in step_metrics.items():
                totals[key] = totals.get(key, 0.0) + value / accumulation
        totals["grad_norm"] = self.clip_and_step()
        totals["learning_rate"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return totals


# --- measuring PPO against GRPO (bench/ppo_vs_grpo.py and lesson 05 call this) ---------------------------------
ALGORITHMS = ("grpo", "ppo")
BENCH_REWARD_WEIGHTS = [1.0, 0.1]  # correctness + 0.1 x format, as `python -m minigrpo train`
QWEN_SHAPE = "qwen0.5b-shape"  # Qwen2.5-0.5B's architecture with random weights: no Hub needed


def qwen_shape_config(vocab_size: int = 151_936, **overrides) -> Qwen2Config:
    """Qwen2.5-0.5B-Instruct's configuration (494M parameters), for a random-init model built offline."""
    shape = dict(
        vocab_size=vocab_size,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return Qwen2Config(**{**shape, **overrides})


def load_benchmark_model(name: str, device=None, **shape_overrides):
    """ "tiny", a Hub id / path, or "qwen0.5b-shape": Qwen2.5-0.5B's shape with random weights and the tiny
    character tokenizer (it samples ids the tokenizer cannot decode; memory and time are what it measures)."""
    if name != QWEN_SHAPE:
        return load_model_and_tokenizer(name, device)
    tokenizer = build_tiny_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = qwen_shape_config(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    for key, value in shape_overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id)
    return model.to(device if device is not None else pick_device()), tokenizer


def parameter_counts(trainer: Trainer) -> dict[str, dict[str, int]]:
    """Parameters held in memory per model: {"policy": {"trainable", "frozen"}, "reference": ..., "critic": ...}."""
    models = {"policy": trainer.model, "reference": trainer.ref_model, "critic": getattr(trainer, "critic", None)}
    return {
        name: {
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "frozen": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        }
        for name, model in models.items()
        if model is not None
    }


def _rss_bytes(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc/self/status."""
    match = re.search(rf"^{field}:\s+(\d+) kB", open("/proc/self/status").read(), re.MULTILINE)
    return int(match.group(1)) * 1024


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS (since Linux 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _curve(history: list[dict], completions_per_step: int) -> dict[str, list]:
    return {
        "completions": [m["step"] * completions_per_step for m in history],
        "reward": [m["reward"] for m in history],
        "eval/accuracy": [m.get("eval/accuracy") for m in history],
    }


def _seconds_per_step(history: list[dict]) -> dict[str, float]:
    """Mean seconds per step: rollout (generate + reference / old log-probs), scoring (reward functions,
    and for PPO the critic's values, the KL-in-reward and GAE), update (the gradient passes)."""
    mean = lambda key: sum(m.get(key, 0.0) for m in history) / len(history)  # noqa: E731
    return {
        "rollout": mean("time/rollout"),
        "scoring": mean("time/rewards") + mean("time/scoring"),
        "update": mean("time/update") - mean("time/scoring"),
    }


def run_algorithm(
    algorithm: str,
    model: str = "tiny",
    config_overrides: dict | None = None,
    train_size: int = 2000,
    eval_size: int = 200,
    output_dir: str = "runs/ppo_vs_grpo",
) -> dict:
    """Train one algorithm and measure it; meant to run alone in a fresh process (see compare_ppo_grpo).

    Peak memory: on a GPU, torch.cuda.max_memory_allocated since just before
    the model was loaded. On a CPU, the peak resident set size (VmHWM) minus
    the RSS just before the model was loaded (Python, torch and the datasets
    are the same for both algorithms and are not training memory).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}: choose 'grpo' or 'ppo'.")
    train_data = make_arithmetic_dataset(train_size, "train", seed=0)
    eval_data = make_arithmetic_dataset(eval_size, "test", seed=0)
    device = pick_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        baseline = _rss_bytes("VmRSS")
        _reset_peak_rss()
    policy, tokenizer = load_benchmark_model(model, device)
    config_class, trainer_class = (GRPOConfig, GRPOTrainer) if algorithm == "grpo" else (PPOConfig, PPOTrainer)
    preset = config_class.tiny_cpu if model == "tiny" else config_class.qwen_t4
    overrides = {"reward_weights": BENCH_REWARD_WEIGHTS, "save_steps": 0, **(config_overrides or {})}
    if "per_device_train_batch_size" not in overrides:  # the preset's micro-batch must divide N = B * G
        defaults = preset()
        n = overrides.get("prompts_per_step", defaults.prompts_per_step)
        n *= overrides.get("num_generations", defaults.num_generations)
        overrides["per_device_train_batch_size"] = math.gcd(n, defaults.per_device_train_batch_size)
    config = preset(**{**overrides, "output_dir": f"{output_dir}/{algorithm}"})
    reward_funcs = [correctness_reward, format_reward]  # the first one is eval/accuracy
    trainer = trainer_class(policy, tokenizer, reward_funcs, train_data, config, eval_dataset=eval_data)
    accuracy_before = trainer.evaluate()["eval/accuracy"]
    started = time.perf_counter()
    history = trainer.train()
    seconds = time.perf_counter() - started
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _rss_bytes("VmHWM") - baseline
    return {
        "params": parameter_counts(trainer),
        "peak_memory_bytes": int(peak),
        "seconds_per_step": _seconds_per_step(history),
        "curve": _curve(history, config.num_completions),
        "accuracy_before": accuracy_before,
        "accuracy": next((m["eval/accuracy"] for m in reversed(history) if "eval/accuracy" in m), accuracy_before),
        "train_seconds": seconds,
        "config": {k: v for k, v in asdict(config).items() if not isinstance(v, list)},
    }


_CHILD = (  # python -c _CHILD '<json arguments>' <result file>
    "import json, sys; from minigrpo.ppo import run_algorithm; "
    "json.dump(run_algorithm(**json.loads(sys.argv[1])), open(sys.argv[2], 'w'))"
)


def compare_ppo_grpo(
    model: str = "tiny",
    max_steps: int = 60,
    eval_steps: int = 15,
    train_size: int = 2000,
    eval_size: int = 200,
    output_dir: str = "runs/ppo_vs_grpo",
    verbose: bool = True,
    ppo_overrides: dict | None = None,
    **config_overrides,
) -> dict:
    """GRPO and PPO on the same model, task, prompts and completions per step, each in a fresh process.

    A fresh Python process per algorithm, so that one's freed memory cannot
    hide the other's peak. `config_overrides` go to both configs, `ppo_overrides` (critic_learning_rate, lam,
    vf_coef, ...) to PPO's only. Returns {"device", "model", "algorithms": {"grpo":
    {...}, "ppo": {...}}} with, per algorithm, parameters per model, peak
    memory, seconds per step (rollout / scoring / update) and the reward and
    held-out accuracy curves against generated completions.
    """
    results = {"device": pick_device().type, "model": model, "algorithms": {}}
    if torch.cuda.is_available():
        results["device_name"] = torch.cuda.get_device_name(0)
    overrides = dict(max_steps=max_steps, eval_steps=eval_steps, **config_overrides)
    for algorithm in ALGORITHMS:
        arguments = dict(
            algorithm=algorithm,
            model=model,
            config_overrides={**overrides, **(ppo_overrides or {})} if algorithm == "ppo" else overrides,
            train_size=train_size,
            eval_size=eval_size,
            output_dir=output_dir,
        )
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "result.json")
            started = time.perf_counter()
            command = [sys.executable, "-c", _CHILD, json.dumps(arguments), out]
            done = subprocess.run(command, capture_output=True, env=_child_environment())
            if done.returncode != 0:
                raise RuntimeError(f"the {algorithm} run failed:\n{done.stderr.decode()[-3000:]}")
            results["algorithms"][algorithm] = json.load(open(out))
        if verbose:
            print(f"{algorithm}: {max_steps} steps in {time.perf_counter() - started:.0f} s (fresh process)")
    return results


def _child_environment() -> dict:
    """This process's environment, with this copy of minigrpo first on the path (works without installing)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else root + os.pathsep + path}


def summary(results: dict) -> dict:
    """The headline numbers: peak memory of each, their ratio (GRPO / PPO), final held-out accuracy of each."""
    grpo, ppo = results["algorithms"]["grpo"], results["algorithms"]["ppo"]
    return {
        "grpo_peak_mem": grpo["peak_memory_bytes"],
        "ppo_peak_mem": ppo["peak_memory_bytes"],
        "peak_memory_ratio": round(grpo["peak_memory_bytes"] / ppo["peak_memory_bytes"], 3),
        "grpo_accuracy": grpo["accuracy"],
        "ppo_accuracy": ppo["accuracy"],
        "completions": grpo["curve"]["completions"][-1],
        "device": results["device"],
        "model": results["model"],
    }


def format_table(results: dict) -> str:
    """A plain-text table of the comparison (one column per algorithm)."""
    grpo, ppo = results["algorithms"]["grpo"], results["algorithms"]["ppo"]
    count = lambda r, kind: sum(m[kind] for m in r["params"].values())  # noqa: E731
    models = lambda r: " + ".join(r["params"])  # noqa: E731
    rows = [
        ("models in memory", models(grpo), models(ppo)),
        ("trainable parameters", f"{count(grpo, 'trainable'):,}", f"{count(ppo, 'trainable'):,}"),
        ("frozen parameters", f"{count(grpo, 'frozen'):,}", f"{count(ppo, 'frozen'):,}"),
        ("peak memory (MB)", f"{grpo['peak_memory_bytes'] / 2**20:.1f}", f"{ppo['peak_memory_bytes'] / 2**20:.1f}"),
    ]
    for part in ("rollout", "scoring", "update"):
        rows.append((f"s/step {part}", f"{grpo['seconds_per_step'][part]:.2f}", f"{ppo['seconds_per_step'][part]:.2f}"))
    rows += [
        ("completions generated", f"{grpo['curve']['completions'][-1]:,}", f"{ppo['curve']['completions'][-1]:,}"),
        ("held-out accuracy before", f"{grpo['accuracy_before']:.3f}", f"{ppo['accuracy_before']:.3f}"),
        ("held-out accuracy after", f"{grpo['accuracy']:.3f}", f"{ppo['accuracy']:.3f}"),
        ("mean reward, last step", f"{grpo['curve']['reward'][-1]:.3f}", f"{ppo['curve']['reward'][-1]:.3f}"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'GRPO':>14}  {'PPO':>22}"]
    lines += [f"{name:{width}}  {g:>14}  {p:>22}" for name, g, p in rows]
    ratio = grpo["peak_memory_bytes"] / ppo["peak_memory_bytes"]
    lines.append(f"peak memory GRPO / PPO = {ratio:.2f} ({results['device']}, model {results['model']})")
    return "\n".join(lines)

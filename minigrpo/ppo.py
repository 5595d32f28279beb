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
over the batch); the critic regresses V(s_t) on R_t with its own clip. Each
rollout is scored once, then reused for num_ppo_epochs passes in shuffled
mini-batches (TRL's PPOTrainer), the critic with its own learning rate and its
own gradient clip. GRPO replaces all of this with A_i = (R_i - mean(R)) / std(R)
over the group: no critic (a second full-size model with its gradients and
Adam state), no GAE.

You should know: a critic is only as good as what it can predict. On the
arithmetic task the reward is whether the sum is right; before the answer is
written, the prompt explains ~6% of the reward's variance (sampling luck is
the rest), and after it, the critic would have to check the sum itself. Its
explained variance stays near 0 there (lesson 05), while on a reward it can
read off the completion it rises (tests/test_ppo.py).

Notation as everywhere: N completions, T completion tokens (right-padded),
`mask` / `completion_mask` (N, T) is 1 on real tokens, a prefix of each row.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from minigrpo.config import GRPOConfig
from minigrpo.logprobs import batched_per_token_logps, completion_position_ids, masked_mean, per_token_logps
from minigrpo.losses import kl_penalty
from minigrpo.models import precision_context
from minigrpo.rollout import Rollout
from minigrpo.trainer import Trainer, micro_batches, resolve_model_and_tokenizer


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


def prompt_share_of_variance(grouped_rewards: torch.Tensor) -> float:
    """The share of the rewards' variance that lies between prompts: 1 - mean_b Var_g(R_bg) / Var(R). (B, G) -> float.

    The best a critic can explain before a completion is written: at s_0 it sees only the prompt, so it can at
    most learn each prompt's mean reward. The rest is sampling luck within a group, which only the completion's
    tokens can reveal. Both variances Bessel-corrected; near 0 when every prompt is about as hard as another.
    """
    assert grouped_rewards.dim() == 2 and grouped_rewards.shape[1] >= 2, "grouped_rewards must be (B, G), G >= 2"
    total = grouped_rewards.flatten().var()
    if total == 0:
        return float("nan")
    return (1 - grouped_rewards.var(dim=1).mean() / total).item()


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
# GRPO's fields that PPO has no use for, and what PPO does instead: set to anything but GRPOConfig's default, they
# would be silently ignored, so PPOConfig refuses them.
GRPO_ONLY_FIELDS = {
    "loss_type": "PPO's policy loss is always a token mean over the batch (clipped_policy_loss)",
    "scale_rewards": "PPO scales its advantages by whitening them over the batch (whiten_advantages)",
    "baseline": "PPO's baseline is the critic's V(s_t), through GAE (gamma, lam)",
    "importance_sampling_level": "PPO's ratio is always per token",
    "std_ddof": "PPO's whitening uses the Bessel-corrected variance over the batch's tokens (masked_whiten)",
    "advantage_epsilon": "PPO's whitening has its own epsilon (whiten_epsilon)",
    "num_iterations": "PPO's passes over each rollout are num_ppo_epochs, in num_mini_batches shuffled mini-batches",
}


@dataclass
class PPOConfig(GRPOConfig):
    """GRPOConfig's fields (same names, same meaning) plus PPO's critic, GAE and epochs (TRL's PPOConfig names).

    The KL is in the per-token reward with the k1 estimator (InstructGPT, TRL's
    PPOTrainer), not in the loss; the policy loss is a token mean over the batch.
    Each rollout is used for num_ppo_epochs passes, each in num_mini_batches
    shuffled mini-batches, one optimizer step per mini-batch (TRL: 4 and 1).
    GRPO-only fields (GRPO_ONLY_FIELDS) must keep their defaults.
    """

    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """Per-token KL in the reward; k1 = log pi_old - log pi_ref, as InstructGPT and TRL's PPOTrainer."""
    gamma: float = 1.0
    """Discount per token. 1.0 for RLHF: the one reward comes at the end and every token shares it."""
    lam: float = 0.95
    """GAE lambda in [0, 1]: 0 = one-step TD (low variance, biased by V), 1 = Monte Carlo (unbiased, noisy)."""
    num_ppo_epochs: int = 4
    """Passes over each rollout (TRL 4). Each pass reshuffles the N completions into mini-batches."""
    num_mini_batches: int = 1
    """Mini-batches per pass, one optimizer step each (TRL 1); must divide N. Micro-batches of
    per_device_train_batch_size (or the whole mini-batch, if smaller) accumulate inside one."""
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
    critic_max_grad_norm: float | None = None
    """Clip the critic's gradient norm to this, apart from the policy's (max_grad_norm); None = max_grad_norm,
    0 = no clipping. One norm over both models would let the larger gradient shrink the other's step."""
    critic_warmup_steps: int = 0
    """Training steps at the start that train only the critic (the policy samples but does not move), so the
    first policy updates see advantages from a critic that has learnt something. They count as steps."""

    def validate(self) -> None:
        super().validate()
        for name, instead in GRPO_ONLY_FIELDS.items():
            default = GRPOConfig.__dataclass_fields__[name].default
            if getattr(self, name) != default:
                raise ValueError(
                    f"{name}={getattr(self, name)!r}: PPO does not use {name} ({instead}). "
                    f"Leave {name} at its default ({default!r})."
                )
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma={self.gamma}: the discount must be in [0, 1] (1.0 for RLHF).")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam={self.lam}: GAE's lambda must be in [0, 1] (typical 0.95).")
        if self.num_ppo_epochs < 1:
            raise ValueError(f"num_ppo_epochs={self.num_ppo_epochs}: it must be >= 1 (TRL 4).")
        n, k = self.num_completions, self.num_mini_batches
        if k < 1 or n % k != 0:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            raise ValueError(
                f"num_mini_batches={k} does not divide the {n} completions of a step: choose one of "
                f"{', '.join(map(str, divisors))}."
            )
        micro = min(self.per_device_train_batch_size, n // k)
        if (n // k) % micro != 0:
            raise ValueError(
                f"mini-batches of {n // k} completions do not split into micro-batches of "
                f"per_device_train_batch_size={self.per_device_train_batch_size}: choose a divisor of {n // k}."
            )
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
        if self.critic_max_grad_norm is not None and self.critic_max_grad_norm < 0:
            raise ValueError(
                f"critic_max_grad_norm={self.critic_max_grad_norm}: it must be >= 0 (0 = no clipping), or None "
                "to use max_grad_norm."
            )
        if self.critic_warmup_steps < 0:
            raise ValueError(f"critic_warmup_steps={self.critic_warmup_steps}: it must be >= 0 (0 = no warm-up).")

    @property
    def value_learning_rate(self) -> float:
        return self.learning_rate if self.critic_learning_rate is None else self.critic_learning_rate

    @property
    def value_max_grad_norm(self) -> float:
        """The critic's gradient-norm clip actually used (critic_max_grad_norm, or max_grad_norm when None)."""
        return self.max_grad_norm if self.critic_max_grad_norm is None else self.critic_max_grad_norm

    @property
    def mini_batch_size(self) -> int:
        """Completions per optimizer step: N / num_mini_batches."""
        return self.num_completions // self.num_mini_batches

    @classmethod
    def tiny_cpu(cls, **overrides) -> PPOConfig:
        """GRPOConfig.tiny_cpu() plus the critic's settings (TINY_PPO_SETTINGS, below)."""
        return super().tiny_cpu(**{**TINY_PPO_SETTINGS, **overrides})

    @classmethod
    def qwen_t4(cls, **overrides) -> PPOConfig:
        """GRPOConfig.qwen_t4() with the critic at 1e-5 (10x the policy's 1e-6; not swept)."""
        return super().qwen_t4(**{"critic_learning_rate": 1e-5, **overrides})


# The critic learns at 1e-3, ~3x the policy's 3e-4 (a regression onto returns tolerates a larger step); 4 epochs
# in 2 mini-batches give it 8 steps per rollout; 3 critic-only steps first. Chosen by hand, not swept.
TINY_PPO_SETTINGS = dict(
    critic_learning_rate=1e-3, vf_coef=0.1, lam=0.95, num_ppo_epochs=4, num_mini_batches=2, critic_warmup_steps=3
)


# --- the trainer -------------------------------------------------------------------------------------------
class PPOTrainer(Trainer):
    """PPO on the shared loop: the same rollouts, rewards, metrics file and checkpoints as GRPOTrainer.

    Usage::

        trainer = PPOTrainer(model, [correctness_reward], PPOConfig.tiny_cpu(), train_dataset,
                            processing_class=tokenizer)
        history = trainer.train()

    The critic is a fourth model (`self.critic`), checkpointed next to the
    policy in checkpoint-N/critic/. The signature is GRPOTrainer's (TRL's order), plus keyword-only
    ``ref_model`` and ``critic``.
    """

    config_class = PPOConfig

    def __init__(
        self,
        model,
        reward_funcs,
        args: PPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        *,
        ref_model=None,
        critic: ValueModel | None = None,
    ):
        if args is not None and not isinstance(args, PPOConfig):
            raise TypeError(
                f"PPOTrainer needs a PPOConfig, got {type(args).__name__}: use PPOConfig(...) or "
                "PPOConfig(**dataclasses.asdict(grpo_config))."
            )
        model, processing_class = resolve_model_and_tokenizer(model, processing_class)
        self.critic = critic if critic is not None else ValueModel.from_policy(model)  # before the optimizer exists
        self.critic.train()
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, ref_model=ref_model)

    def trainable_modules(self) -> dict[str, nn.Module]:
        return {**super().trainable_modules(), "critic": self.critic}

    def optimizer_param_groups(self) -> list[dict]:
        """The policy's group, then the critic's at its own step size (config.value_learning_rate)."""
        critic = [p for p in self.critic.parameters() if p.requires_grad]
        return [*super().optimizer_param_groups(), {"params": critic, "lr": self.config.value_learning_rate}]

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
            batches = micro_batches(len(input_ids), config.per_device_train_batch_size)
            old_values = torch.cat(
                [self.critic(input_ids[rows], attention_mask[rows], T) for rows in batches]
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

    # --- the update -------------------------------------------------------------------------------------------
    def optimize(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        """Score the rollout once, then num_ppo_epochs passes over it in shuffled mini-batches (TRL's order).

        During the first critic_warmup_steps steps only the critic learns. The
        learning-rate schedule advances once per training step, as in TRL.
        """
        config = self.config
        started = time.perf_counter()
        scored = self.score_rollout(rollout, rewards)
        mask = scored["mask"]
        metrics = {
            "time/scoring": time.perf_counter() - started,
            "kl": masked_mean(scored["kl"], mask).item(),
            "advantages/abs_mean": masked_mean(scored["advantages"].abs(), mask).item(),
            "values/mean": masked_mean(scored["old_values"], mask).item(),
            "returns/mean": masked_mean(scored["returns"], mask).item(),
            # the critic as it was before this step's updates, on completions it has never seen: its real skill
            "values/explained_variance": explained_variance(scored["old_values"], scored["returns"], mask),
        }
        train_policy = self.step >= config.critic_warmup_steps
        num_rows = len(rollout.input_ids)
        fitted_values = torch.zeros_like(scored["old_values"])  # (N, T), the last pass's predictions
        totals: dict[str, float] = {}
        updates = config.num_ppo_epochs * config.num_mini_batches
        for _ in range(config.num_ppo_epochs):
            order = torch.randperm(num_rows)  # the global generator: checkpointed, so a resumed run reshuffles alike
            for indices in order.chunk(config.num_mini_batches):
                step_metrics = self.update_mini_batch(rollout, scored, indices.to(self.device), train_policy)
                fitted_values[indices] = step_metrics.pop("values")
                for key, value in step_metrics.items():
                    totals[key] = totals.get(key, 0.0) + value / updates
        metrics.update(totals)
        # the same, after num_ppo_epochs - 1 passes of fitting on these very completions: how well it can fit them
        metrics["values/explained_variance_fitted"] = explained_variance(fitted_values, scored["returns"], mask)
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        metrics["critic_warmup"] = float(not train_policy)
        self.scheduler.step()
        return metrics

    def update_mini_batch(self, rollout: Rollout, scored: dict, indices: torch.Tensor, train_policy: bool) -> dict:
        """One optimizer step on the rows `indices`: loss = policy_loss + vf_coef * value_loss - entropy bonus.

        The rows run in micro-batches of per_device_train_batch_size, each
        loss divided by their number (the gradient of their mean). One backward
        pass through both models per micro-batch (as TRL's PPOTrainer): the
        policy's and the critic's activations are alive together. Without
        train_policy (critic warm-up) only the value loss is computed.
        Returns the mean metrics, plus "values": the critic's predictions (n, T).
        """
        config = self.config
        input_ids, attention_mask = rollout.input_ids[indices], rollout.attention_mask[indices]
        T = rollout.completion_ids.shape[1]
        size = min(config.per_device_train_batch_size, len(indices))
        chunks = list(range(0, len(indices), size))
        totals: dict[str, float] = {}
        values_seen = []
        self.optimizer.zero_grad(set_to_none=True)
        for start in chunks:
            rows = slice(start, start + size)
            picked = indices[rows]
            mask = scored["mask"][picked]
            with precision_context(self.device):
                values = self.critic(input_ids[rows], attention_mask[rows], T)  # (n, T)
                if train_policy:
                    logps, entropy = per_token_logps(
                        self.model, input_ids[rows], attention_mask[rows], T, config.temperature,
                        config.logprob_chunk_size,
                    )  # fmt: skip
            value_loss, value_clipped = clipped_value_loss(
                values, scored["old_values"][picked], scored["returns"][picked], mask, config.cliprange_value
            )
            loss = config.vf_coef * value_loss
            metrics = {"loss/value": value_loss.item(), "values/clipfrac": value_clipped.item()}
            if train_policy:
                policy_loss, policy_clipped = clipped_policy_loss(
                    logps, scored["old_logps"][picked], scored["advantages"][picked], mask, config.epsilon_low,
                    config.clip_epsilon_high,
                )  # fmt: skip
                loss = loss + policy_loss - entropy_bonus(entropy, mask, config.entropy_coef)
                metrics.update(
                    {
                        "loss/policy": policy_loss.item(),
                        "clip_ratio/region_mean": policy_clipped.item(),
                        "entropy": masked_mean(entropy.detach(), mask).item(),
                    }
                )
            (loss / len(chunks)).backward()
            metrics["loss"] = loss.item()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / len(chunks)
            values_seen.append(values.detach())
        totals.update(self.clip_and_step_per_model())
        return {**totals, "values": torch.cat(values_seen)}

    def clip_and_step_per_model(self) -> dict:
        """Clip the policy's gradient norm to max_grad_norm and the critic's to its own, then one AdamW step.

        Returns grad_norm (the policy's, as GRPO logs it) and values/grad_norm, both before clipping.
        """
        policy_group, critic_group = self.optimizer.param_groups  # as optimizer_param_groups() built them
        norms = {}
        for key, group, max_norm in (
            ("grad_norm", policy_group, self.config.max_grad_norm),
            ("values/grad_norm", critic_group, self.config.value_max_grad_norm),
        ):
            norm = torch.nn.utils.clip_grad_norm_(group["params"], max_norm if max_norm > 0 else float("inf"))
            norms[key] = norm.item()
        self.optimizer.step()
        return norms

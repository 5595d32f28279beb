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
written, the prompt explains a small share of the reward's variance (sampling
luck is the rest; lesson 05 prints the share), and after it, the critic would
have to check the sum itself. Its
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
from minigrpo.models import is_peft_model, precision_context, resolve_model_and_tokenizer
from minigrpo.ppo_math import (  # noqa: F401 (the math is re-exported: lessons import it from here)
    clipped_policy_loss,
    clipped_value_loss,
    compute_gae,
    entropy_bonus,
    explained_variance,
    last_token_index,
    masked_whiten,
    per_token_rewards,
    prompt_share_of_variance,
)
from minigrpo.rollout import Rollout
from minigrpo.run.metrics import average_metrics
from minigrpo.run.schedule import micro_batches
from minigrpo.trainer import Trainer
from minigrpo.trl_compat import refuse_unknown_fields


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
    def from_policy(cls, policy, peft_config=None, seed: int = 0) -> ValueModel:
        """A trainable copy of `policy.base_model` (the decoder without lm_head) + Linear(hidden, 1).

        With a peft_config (a LoRA policy) the copy is frozen and gets its own adapters of the same
        config; the value head is trained in full. A critic trained in full would bring back the
        gradients and AdamW moments of a whole model, the memory LoRA saves on the policy; its
        frozen copy of the weights remains (its hidden states must differ from the policy's).
        Its adapters are drawn from a generator seeded with `seed`, as the policy's (models.add_adapters).
        """
        backbone = copy.deepcopy(policy.base_model)
        if peft_config is None:
            backbone.requires_grad_(True)
        else:
            from peft import inject_adapter_in_model

            config = copy.deepcopy(peft_config)
            config.task_type = None  # the decoder alone, not a causal LM: plain injection, no PeftModel wrapper
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                backbone = inject_adapter_in_model(config, backbone)  # only the adapters stay trainable
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
    "use_bias_correction_kl": "PPO's KL is in the per-token reward (kl_estimator of pi_old vs pi_ref), not in the loss",
}
# What a PPOConfig takes from PPO's own defaults when it is built from a GRPO preset or a GRPOConfig: the GRPO-only
# fields, and the KL estimator (k1 in PPO's reward, as InstructGPT and TRL's PPOTrainer; k3 in GRPO's loss).
NOT_FROM_GRPO = (*GRPO_ONLY_FIELDS, "kl_estimator")


@refuse_unknown_fields
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

    @classmethod
    def from_preset(cls, preset: dict, **overrides) -> PPOConfig:
        """A GRPO preset's fields that PPO uses (not NOT_FROM_GRPO: those keep PPO's defaults), then `overrides`."""
        return cls(**{**{k: v for k, v in preset.items() if k not in NOT_FROM_GRPO}, **overrides})

    @classmethod
    def from_config(cls, other: GRPOConfig, **changes) -> PPOConfig:
        """A PPOConfig with `other`'s fields, except those in NOT_FROM_GRPO when `other` is a GRPO config (they
        keep PPO's defaults), then `changes`."""
        if not isinstance(other, PPOConfig):
            defaults = {name: cls.__dataclass_fields__[name].default for name in NOT_FROM_GRPO}
            changes = {**defaults, **changes}
        return super().from_config(other, **changes)

    def validate(self) -> None:
        super().validate()
        if self.steps_per_generation != self.gradient_accumulation_steps:
            raise ValueError(
                f"steps_per_generation={self.steps_per_generation} != gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps}: PPOTrainer makes its own passes over the whole rollout "
                "(num_ppo_epochs x num_mini_batches); give prompts_per_step (B) and per_device_train_batch_size."
            )
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
        trainer.train()
        history = trainer.state.log_history  # one dict per logged step

    The critic is a fourth model (`self.critic`), checkpointed next to the
    policy in checkpoint-N/critic/. The signature is GRPOTrainer's (TRL's order), plus keyword-only
    ``ref_model``, ``peft_config`` and ``critic`` (and ``tools``, refused: PPO's update has no tool mask). With a
    ``peft_config`` the policy trains LoRA adapters and so does the critic built for it (its own adapters on its own
    frozen copy; its head in full).
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
        peft_config=None,
        critic: ValueModel | None = None,
        tools=None,
    ):
        if args is not None and not isinstance(args, PPOConfig):
            raise TypeError(
                f"PPOTrainer needs a PPOConfig, got {type(args).__name__}: use PPOConfig(...) or "
                "PPOConfig.from_config(grpo_config)."
            )
        model, processing_class = resolve_model_and_tokenizer(model, processing_class)
        if critic is None and is_peft_model(model):
            raise ValueError(
                "PPOTrainer builds its critic from the plain policy: pass the model without adapters and the "
                "LoRA config as peft_config=..., or pass your own critic=ValueModel(...)."
            )
        # before the optimizer exists, and from the policy before it has adapters
        self.critic = (
            critic if critic is not None else ValueModel.from_policy(model, peft_config, (args or PPOConfig()).seed)
        )
        self.critic.train()
        super().__init__(
            model,
            reward_funcs,
            args,
            train_dataset,
            eval_dataset,
            processing_class,
            peft_config=peft_config,
            tools=tools,  # refused with what to do instead: PPO's update has no tool mask
            ref_model=ref_model,
        )

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
        with precision_context(self.device, self.config.bf16):
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
    def update(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        """Score the rollout once, then num_ppo_epochs passes over it in shuffled mini-batches (TRL's order).

        During the first critic_warmup_steps steps only the critic learns. The
        learning rate is that of the training step (not of each mini-batch's optimizer step), as in TRL.
        """
        config = self.config
        learning_rate = self.set_learning_rate(self.step)
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
        steps = []
        for _ in range(config.num_ppo_epochs):
            order = torch.randperm(num_rows)  # the global generator: checkpointed, so a resumed run reshuffles alike
            for indices in order.chunk(config.num_mini_batches):
                steps.append(self.update_mini_batch(rollout, scored, indices.to(self.device), train_policy))
                fitted_values[indices] = steps[-1].pop("values")
        metrics.update(average_metrics(steps))
        # the same, after num_ppo_epochs - 1 passes of fitting on these very completions: how well it can fit them
        metrics["values/explained_variance_fitted"] = explained_variance(fitted_values, scored["returns"], mask)
        metrics["learning_rate"] = learning_rate
        metrics["critic_warmup"] = float(not train_policy)
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
        micro_metrics, values_seen = [], []
        self.optimizer.zero_grad(set_to_none=True)
        for start in chunks:
            rows = slice(start, start + size)
            picked = indices[rows]
            mask = scored["mask"][picked]
            with precision_context(self.device, self.config.bf16):
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
            self.backward(loss / len(chunks), f"a micro-batch of {len(picked)} completions")  # stops on NaN or inf
            metrics["loss"] = loss.item()
            micro_metrics.append(metrics)
            values_seen.append(values.detach())
        totals = average_metrics(micro_metrics)
        totals.update(self.clip_and_step_per_model())
        return {**totals, "values": torch.cat(values_seen)}

    def clip_and_step_per_model(self) -> dict:
        """Clip the policy's gradient norm to max_grad_norm and the critic's to its own, then one AdamW step.

        Returns grad_norm (the policy's, as GRPO logs it) and values/grad_norm, both before clipping. An inf or
        NaN norm stops the run before the step (Trainer.clip_gradients), as in GRPO.
        """
        policy_group, critic_group = self.optimizer.param_groups  # as optimizer_param_groups() built them
        norms = {
            "grad_norm": self.clip_gradients(policy_group["params"], self.config.max_grad_norm),
            "values/grad_norm": self.clip_gradients(critic_group["params"], self.config.value_max_grad_norm),
        }
        self.optimizer.step()
        return norms

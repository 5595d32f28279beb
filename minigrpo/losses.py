"""Stage 4: the GRPO objective, one equation per function.

DeepSeekMath's objective (arXiv 2402.03300, eq. 3), to be *maximised*, with DAPO's two clip
bounds (the paper has one epsilon, eps_low = eps_high; DAPO, arXiv 2503.14476, section 3.1, raises the upper one):

    J = mean_i (1/|o_i|) sum_t [ min(rho_it A_i, clip(rho_it, 1-eps_low, 1+eps_high) A_i) - beta KL_it ]

    rho_it = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)       the ratio
    KL_it  = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1                  the k3 estimator

The loss is -J. Everything here works on (N, T) per-token tensors (N = B * G
completions, T completion tokens) and the (N,) advantages. At rho = 1 the
surrogate's gradient is REINFORCE's, whose loss -(r - b) log pi
(`reinforce_loss`) closes the module.

When the sampler is not the trainer (vLLM, or a lower-precision copy of the policy), the completions come from
pi_sampler, not pi_old, and each token's loss is weighted by TRL's truncated or masked importance weight
w = pi_old / pi_sampler (`sampler_importance_weights`; config.vllm_importance_sampling_correction).
"""

from __future__ import annotations

import math

import torch

from minigrpo.logprobs import masked_mean, masked_sum


def importance_ratio(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    level: str = "token",
) -> torch.Tensor:
    """rho = pi_theta / pi_old, per token (GRPO) or per sequence (GSPO).

    per_token_logps, old_per_token_logps, completion_mask: (N, T).
    "token" -> (N, T): exp(logp - logp_old).
    "sequence" -> (N, 1): exp(mean_t (logp - logp_old)), the geometric mean of
    the token ratios (GSPO, arXiv 2507.18071), one per completion.
    With num_iterations == 1, pi_old is the current policy detached: rho == 1
    in value, but its gradient is grad log pi, which is the whole point.
    """
    log_ratio = per_token_logps - old_per_token_logps  # (N, T)
    if level == "token":
        return torch.exp(log_ratio)  # (N, T)
    if level == "sequence":
        return torch.exp(masked_mean(log_ratio, completion_mask, dim=1)).unsqueeze(1)  # (N, 1)
    raise ValueError(f"importance_sampling_level={level!r}: use 'token' or 'sequence'.")


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> torch.Tensor:
    """PPO's clipped surrogate, min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A).

    ratio: (N, T) or (N, 1); advantages: (N,) -> (N, T) or (N, 1) (to be maximised).
    The min makes it pessimistic: once a token's probability has moved
    eps past where it started *in the direction the advantage asks for*, its
    gradient is zero. At rho == 1 this is exactly REINFORCE's A * rho.
    epsilon_high > epsilon_low is DAPO's clip-higher (keeps rare tokens alive).
    """
    advantages = advantages.unsqueeze(1)  # (N, 1)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantages
    return torch.min(unclipped, clipped)


def sampler_importance_weights(
    old_per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """TRL's correction for a sampler that is not the trainer: w = pi_old / pi_sampler, truncated or masked.

    Symbol                    | Shape  | Description
    --------------------------|--------|----------------------------------------------------------------
    old_per_token_logps       | (N, T) | log pi_old, the trainer's log-probs of the sampled tokens (no gradient)
    sampling_per_token_logps  | (N, T) | log pi_sampler, what the sampler (vLLM, a bf16 copy) gave them
    completion_mask           | (N, T) | 1 on tokens that count (with tools: times the tool mask)
    returns                   | (N, T) | token_* modes: one weight per token
                              | (N, 1) | sequence_* modes: one weight per completion

    The completions were drawn from pi_sampler, but the surrogate assumes they came from pi_old; the weight
    w = pi_old / pi_sampler makes the expectation right again (importance sampling), and bounding it keeps one
    rare token from dominating the step (Yao et al., "Your efficient RL framework secretly brings you off-policy
    RL training", 2025; TRL 1.16's vllm_importance_sampling_*):

        log w_t = (log pi_old - log pi_sampler) * m_t          token_*:    w_t = exp(log w_t)
        log w   = sum_t log w_t (a product of token weights)    sequence_*: w = exp(log w), one per completion
        *_truncate: w <- clamp(w, clip_min, clip_max)          *_mask: w <- 0 where w < clip_min or w > clip_max

    A token whose sampler log-prob is NaN (unknown) gets log w_t = 0, as in TRL. Pitfall: the sequence weight is
    the *product* of the token weights (a sum of logs), not GSPO's geometric mean: a long completion drifts further.
    """
    assert old_per_token_logps.shape == sampling_per_token_logps.shape == completion_mask.shape, "all (N, T)"
    log_weights = torch.nan_to_num((old_per_token_logps - sampling_per_token_logps) * completion_mask, nan=0.0)
    if mode in ("sequence_truncate", "sequence_mask"):
        log_weights = log_weights.sum(dim=-1, keepdim=True)  # (N, 1)
    elif mode not in ("token_truncate", "token_mask"):
        raise ValueError(
            f"vllm_importance_sampling_mode={mode!r}: use 'token_truncate', 'token_mask', 'sequence_truncate' or "
            "'sequence_mask'."
        )
    weights = torch.exp(log_weights)  # (N, T) or (N, 1)
    if mode.endswith("_truncate"):
        return torch.clamp(weights, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return weights.masked_fill((weights < low) | (weights > high), 0.0)


def kl_penalty(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta. (N, T) -> (N, T).

    With log_r = log pi_ref - log pi_theta (Schulman, "Approximating KL Divergence", 2020), the
    value (E over x ~ pi_theta) and, used as a loss, the expected gradient (minigrpo.course.kl_gradients):
      k1 = -log_r                  value unbiased, can be negative, high variance; gradient 0
      k2 = log_r^2 / 2             value biased, always >= 0; gradient of KL(pi_theta || pi_ref)
      k3 = exp(log_r) - log_r - 1  value unbiased, always >= 0, near pi_ref far less noisy than k1 (about
                                   as noisy as k2; DeepSeekMath); gradient of the *forward* KL(pi_ref || pi_theta)
    Multiplied by the ratio pi_theta / pi_old (use_bias_correction_kl), k3 keeps its value and
    takes the gradient of KL(pi_theta || pi_ref). For a completion of several tokens these gradients hold per
    position, with the prefix held fixed (course.kl_gradients.sequence_kl_gradients).
    """
    log_r = ref_per_token_logps - per_token_logps  # (N, T)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.exp(log_r) - log_r - 1
    raise ValueError(f"kl_estimator={estimator!r}: use 'k1', 'k2' or 'k3'.")


def aggregate_loss(
    per_token_loss: torch.Tensor,
    completion_mask: torch.Tensor,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    num_items_in_batch: int | None = None,
) -> torch.Tensor:
    """Reduce (N, T) per-token losses to one number; the loss types differ only in the normaliser.

    "grpo"    mean_i (1/|o_i|) sum_t l_it   per-sequence mean (DeepSeekMath): a
              token of a short answer weighs more than one of a long answer.
    "bnpo"    sum_it l_it / sum_it m_it      token mean over this micro-batch.
    "dapo"    sum_it l_it / num_items_in_batch   token mean over the *whole*
              step's tokens (DAPO), so micro-batching does not change it.
    "dr_grpo" sum_it l_it / (N * max_completion_length)   a constant (Dr. GRPO):
              no length bias at all.
    """
    assert per_token_loss.shape == completion_mask.shape, "per_token_loss and completion_mask must both be (N, T)"
    if loss_type == "grpo":
        return masked_mean(per_token_loss, completion_mask, dim=1).mean()
    if loss_type == "bnpo":
        return masked_mean(per_token_loss, completion_mask)
    if loss_type == "dapo":
        total_tokens = completion_mask.sum() if num_items_in_batch is None else num_items_in_batch
        return masked_sum(per_token_loss, completion_mask) / max(float(total_tokens), 1.0)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length (its constant normaliser).")
        return masked_sum(per_token_loss, completion_mask) / (per_token_loss.shape[0] * max_completion_length)
    raise ValueError(f"loss_type={loss_type!r}: use 'grpo', 'bnpo', 'dapo' or 'dr_grpo'.")


def clip_fractions(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
) -> dict[str, float]:
    """Fraction of tokens whose gradient the clip switched off (TRL's clip_ratio/* metrics)."""
    advantages = advantages.unsqueeze(1)  # (N, 1)
    low = ((ratio < 1 - epsilon_low) & (advantages < 0)).expand_as(completion_mask).float()  # (N, T)
    high = ((ratio > 1 + epsilon_high) & (advantages > 0)).expand_as(completion_mask).float()  # (N, T)
    return {
        "clip_ratio/low_mean": masked_mean(low, completion_mask).item(),
        "clip_ratio/high_mean": masked_mean(high, completion_mask).item(),
        "clip_ratio/region_mean": masked_mean(low + high, completion_mask).item(),
    }


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    ref_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    config,
    num_items_in_batch: int | None = None,
    sampling_per_token_logps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The full GRPO loss of one micro-batch: -(w * surrogate - beta * KL), aggregated (w = 1 unless corrected).

    Symbol               | Shape  | Description
    ---------------------|--------|-------------------------------------------------
    per_token_logps      | (n, T) | log pi_theta, with gradient
    old_per_token_logps  | (n, T) | log pi_old; None -> per_token_logps.detach()
    ref_per_token_logps  | (n, T) | log pi_ref; None when beta == 0
    advantages           | (n,)   | one advantage per completion
    completion_mask      | (n, T) | 1 on tokens that count
    sampling_per_token_logps | (n, T) | log pi_sampler when the sampler is not the trainer, else None
    returns              | ()     | the loss, and a dict of metrics (floats)

    With config.vllm_importance_sampling_correction and sampler log-probs, each token's surrogate loss (not the KL,
    as in TRL) is multiplied by sampler_importance_weights(pi_old, pi_sampler), which carries no gradient.
    """
    assert per_token_logps.shape == completion_mask.shape, "per_token_logps and completion_mask must both be (n, T)"
    assert advantages.shape == per_token_logps.shape[:1], "advantages must be (n,)"
    if old_per_token_logps is None:
        old_per_token_logps = per_token_logps.detach()
    ratio = importance_ratio(per_token_logps, old_per_token_logps, completion_mask, config.importance_sampling_level)
    surrogate = clipped_surrogate(ratio, advantages, config.epsilon_low, config.clip_epsilon_high)  # (n, T)
    per_token_loss = -surrogate.expand_as(per_token_logps)  # (n, T)
    metrics = clip_fractions(ratio, advantages, completion_mask, config.epsilon_low, config.clip_epsilon_high)
    if config.vllm_importance_sampling_correction and sampling_per_token_logps is not None:
        weights = sampler_importance_weights(
            old_per_token_logps.detach(),
            sampling_per_token_logps,
            completion_mask,
            config.vllm_importance_sampling_mode,
            config.vllm_importance_sampling_clip_min,
            config.vllm_importance_sampling_clip_max,
        )  # (n, T) or (n, 1)
        per_token_loss = per_token_loss * weights  # (n, T)
        # TRL's metric: the mean weight over completions (sequence_*) or over the tokens that count (token_*)
        counted = weights.flatten() if weights.shape[1] == 1 else weights[completion_mask.bool()]
        metrics["sampling/importance_sampling_ratio/mean"] = counted.mean().item() if counted.numel() else 0.0
    if config.beta != 0.0:
        kl = kl_penalty(per_token_logps, ref_per_token_logps, config.kl_estimator)  # (n, T)
        metrics["kl"] = masked_mean(kl.detach(), completion_mask).item()
        if config.use_bias_correction_kl:
            # TRL's use_bias_correction_kl: weight the KL by the importance ratio (1 in value on-policy, but its
            # gradient rho * grad(k3) + k3 * grad(log pi) is the reverse KL's; plain k3's is the forward KL's).
            kl = kl * ratio  # (n, T)
        per_token_loss = per_token_loss + config.beta * kl
    loss = aggregate_loss(
        per_token_loss, completion_mask, config.loss_type, config.max_completion_length, num_items_in_batch
    )
    return loss, metrics


def reinforce_loss(
    per_token_logps: torch.Tensor,
    rewards: torch.Tensor,
    completion_mask: torch.Tensor,
    baseline: str | float | torch.Tensor | None = None,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    num_items_in_batch: int | None = None,
) -> torch.Tensor:
    """REINFORCE as a loss (Williams, 1992): -(r_i - b) log pi_theta(o_it), per token, aggregated.

    Symbol           | Shape  | Description
    -----------------|--------|---------------------------------------------------------------
    per_token_logps  | (N, T) | log pi_theta of each completion token, with gradient
    rewards          | (N,)   | r_i, one per completion (or advantages already computed)
    completion_mask  | (N, T) | 1 on tokens that count
    baseline         |        | b: None (0: raw rewards), "mean" (the mean of the N rewards),
                     |        | a number, or an (N,) tensor (say, the group means); no gradient
    returns          | ()     | the loss, reduced over tokens as `aggregate_loss(loss_type)` does

    Minus its gradient, (r_i - b) grad log pi(o_i) scaled by the loss_type's
    normaliser, is REINFORCE's policy-gradient estimate. A baseline that does not
    depend on o_i leaves it unbiased and lowers its variance ("mean" includes r_i
    itself, which shrinks the estimate by (N - 1) / N: lesson 01). GRPO's clipped
    surrogate at ratio 1 (one update per rollout) has the same gradient for every
    loss_type, token or sequence ratio, but not the same value: the surrogate reads -A aggregated
    (0 on average), this reads -A log pi aggregated. Only gradients count.
    """
    assert per_token_logps.shape == completion_mask.shape, "per_token_logps and completion_mask must both be (N, T)"
    assert rewards.shape == per_token_logps.shape[:1], "rewards must be (N,), one per completion"
    if baseline is None:
        baseline = 0.0
    elif isinstance(baseline, str):
        if baseline != "mean":
            raise ValueError(f"baseline={baseline!r}: use None, 'mean', a number or an (N,) tensor.")
        baseline = rewards.mean()
    elif isinstance(baseline, torch.Tensor) and baseline.shape not in ((), rewards.shape):
        raise ValueError(f"baseline has shape {tuple(baseline.shape)}: give one number or one per completion, (N,).")
    weights = (rewards - baseline).detach()  # (N,): a weight, not a path for gradients
    per_token_loss = -weights.unsqueeze(1) * per_token_logps  # (N, T)
    return aggregate_loss(per_token_loss, completion_mask, loss_type, max_completion_length, num_items_in_batch)

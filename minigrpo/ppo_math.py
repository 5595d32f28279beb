"""PPO's math: small pure functions on (N, T) tensors, the equations of lesson 05 and exercise 07.

KL in the reward on the last real token, GAE (Schulman et al. 2016), whitening, the clipped value
and policy losses, the entropy bonus, and the critic's diagnostics. ``minigrpo.ppo`` builds the
critic, the config and the trainer on them (and re-exports them).
"""

from __future__ import annotations

import torch

from minigrpo.logprobs import masked_mean


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

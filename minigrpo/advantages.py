"""Stage 3: group-relative advantages.

GRPO replaces PPO's learned critic with the group itself: the G completions of
one prompt are scored, and each one's advantage is how much better it did than
its siblings (DeepSeekMath, arXiv 2402.03300, section 4.1.2):

    A_i = (r_i - mean(r)) / (std(r) + eps)          GRPO
    A_i = r_i - mean_{j != i} r_j                    RLOO (leave-one-out baseline; Kool et al. 2019)
    A_i = r_i - mean(r)                              Dr. GRPO (scale_rewards="none")

The same A_i is used for every token of completion i. Groups are rows of a
(B, G) tensor; row b holds the G rewards of prompt b (group-major order).
"""

from __future__ import annotations

import torch


def group_rewards(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(N,) rewards in group-major order -> (B, G); row b is prompt b's group."""
    assert rewards.dim() == 1, f"rewards must be (N,), got {tuple(rewards.shape)}"
    if rewards.numel() % num_generations != 0:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of G={num_generations}: "
            "N must be a multiple of num_generations."
        )
    return rewards.view(-1, num_generations)  # (B, G)


def group_baseline(grouped_rewards: torch.Tensor, baseline: str = "mean") -> torch.Tensor:
    """The baseline b_i each reward is compared with. (B, G) -> (B, G).

    "mean": the group mean (GRPO), the same for every member.
    "rloo": the mean of the *other* G - 1 rewards, so r_i never baselines itself (REINFORCE leave-one-out:
    Kool, van Hoof and Welling, "Buy 4 REINFORCE samples, get a baseline for free!", ICLR 2019 workshop;
    used for LLM fine-tuning by Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization
    for Learning from Human Feedback in LLMs", 2024).
    """
    G = grouped_rewards.shape[1]
    total = grouped_rewards.sum(dim=1, keepdim=True)  # (B, 1)
    if baseline == "mean":
        return (total / G).expand_as(grouped_rewards)  # (B, G)
    if baseline == "rloo":
        return (total - grouped_rewards) / (G - 1)  # (B, G)
    raise ValueError(f"baseline={baseline!r}: use 'mean' or 'rloo'.")


def reward_scale(
    grouped_rewards: torch.Tensor, scale_rewards: str = "group", ddof: int = 1, eps: float = 0.0
) -> torch.Tensor:
    """The denominator std + eps of each advantage. (B, G) -> broadcastable (B, 1) or (1, 1).

    "group": std of each group (GRPO); "batch": one std over all N rewards;
    "none": exactly 1, no eps (Dr. GRPO: dividing by std up-weights prompts
    that are almost always solved or almost never).
    ddof=1 is Bessel's correction (torch.std's default, TRL, CS336); ddof=0 is
    the population std (numpy.std's default). With G = 8 they differ by
    sqrt(8/7) = 1.069.
    """
    if scale_rewards == "group":
        return grouped_rewards.std(dim=1, keepdim=True, correction=ddof) + eps  # (B, 1)
    if scale_rewards == "batch":
        return grouped_rewards.flatten().std(correction=ddof).view(1, 1) + eps  # (1, 1)
    if scale_rewards == "none":
        return torch.ones_like(grouped_rewards[:1, :1])  # (1, 1)
    raise ValueError(f"scale_rewards={scale_rewards!r}: use 'group', 'batch' or 'none'.")


def zero_std_groups(grouped_rewards: torch.Tensor) -> torch.Tensor:
    """(B, G) -> (B,) bool: groups whose rewards are all equal (they carry no signal)."""
    return grouped_rewards.max(dim=1).values == grouped_rewards.min(dim=1).values


def group_relative_advantages(
    grouped_rewards: torch.Tensor,
    scale_rewards: str = "group",
    baseline: str = "mean",
    ddof: int = 1,
    eps: float = 1e-4,
) -> torch.Tensor:
    """A = (r - baseline) / (scale + eps), per group.

    Symbol     | Shape  | Description
    -----------|--------|---------------------------------------------
    r          | (B, G) | grouped_rewards, row b = the G rewards of prompt b
    returns    | (B, G) | advantages; each group's GRPO advantages sum to 0

    A group whose rewards are all equal gets exactly 0 (not NaN, and not the
    rounding noise of r - mean(r)): every completion was as good as its
    siblings, so there is nothing to learn from it.
    """
    assert grouped_rewards.dim() == 2, f"grouped_rewards must be (B, G), got {tuple(grouped_rewards.shape)}"
    assert grouped_rewards.shape[1] >= 2, "a group needs at least G = 2 completions"
    centred = grouped_rewards - group_baseline(grouped_rewards, baseline)  # (B, G)
    advantages = centred / reward_scale(grouped_rewards, scale_rewards, ddof, eps)  # (B, G)
    constant = zero_std_groups(grouped_rewards).unsqueeze(1)  # (B, 1)
    return torch.where(constant, torch.zeros_like(advantages), advantages)


def completion_advantages(rewards: torch.Tensor, config, num_generations: int | None = None) -> torch.Tensor:
    """Stage 3 as the trainer runs it: rewards (N,), group-major -> advantages (N,), one per completion.

    The groups are of num_generations (default config.num_generations; evaluation's eval_loss uses its own G');
    config gives scale_rewards, baseline, std_ddof and advantage_epsilon (GRPOConfig's fields).
    """
    grouped_rewards = group_rewards(rewards, num_generations or config.num_generations)  # (B, G)
    return group_relative_advantages(
        grouped_rewards, config.scale_rewards, config.baseline, config.std_ddof, config.advantage_epsilon
    ).flatten()  # (N,)

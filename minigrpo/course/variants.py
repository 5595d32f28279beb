"""GRPO's variants as config fields (lesson 07).

Dr. GRPO, DAPO, GSPO and RLOO are not new algorithms to this package: each is
a handful of GRPOConfig fields (the loss normaliser, the clip range, the
ratio's level, the baseline). ``VARIANTS`` names those fields. DAPO's
dynamic sampling is a field too (``dynamic_sampling=True``), but it changes
the loop rather than the loss: the filter and the refill loop are
``minigrpo.dynamic_sampling``'s ``informative_groups`` and ``fill_batch``, and
``GRPOTrainer.collect_informative_rollout`` runs them. DAPO's overlong reward
shaping is not a field either: it is one more reward function (its soft
overlong punishment, ``rewards.get_soft_overlong_punishment``), which
``variant_reward_funcs`` adds.

- ``Variant`` / ``VARIANTS`` / ``variant_config`` / ``config_diff``: the
  variants, and what each changes.
- ``variant_reward_funcs``: the reward functions and weights a variant trains
  with (DAPO's adds the soft overlong punishment).
- ``per_token_gradient_weights``: the weight each ``loss_type`` gives one
  token, read off autograd, which is where Dr. GRPO and DAPO differ from GRPO.

Notation: B prompts, G completions per prompt, N = B * G, T completion tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from minigrpo.config import GRPOConfig
from minigrpo.losses import aggregate_loss
from minigrpo.rewards import get_soft_overlong_punishment


# --- the variants, as config fields ------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """A GRPO variant: the GRPOConfig fields it changes, the paper it comes from, and, for DAPO, the share of
    max_completion_length over which its soft overlong punishment ramps from 0 to -1 (0: no length reward)."""

    overrides: dict = field(default_factory=dict)
    paper: str = ""
    overlong_cache_share: float = 0.0

    @property
    def dynamic_sampling(self) -> bool:
        """Whether the variant refills its batch with groups that carry signal (DAPO)."""
        return self.overrides.get("dynamic_sampling", False)


VARIANTS: dict[str, Variant] = {
    "GRPO": Variant({}, paper="DeepSeekMath, arXiv 2402.03300"),
    "Dr. GRPO": Variant(
        dict(scale_rewards="none", loss_type="dr_grpo"), paper="Understanding R1-Zero-Like Training, arXiv 2503.20783"
    ),
    "DAPO": Variant(
        dict(loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True, beta=0.0, dynamic_sampling=True),
        paper="DAPO, arXiv 2503.14476",
        # DAPO's ramp is 4096 of 20480 tokens, a fifth, placed after the 16384 it expects an answer to need. An
        # eighth here: on the tiny Qwen's 24 tokens the ramp (22-24) starts after its longest well-formed answer,
        # `<answer>` + three digits + `</answer>` + EOS = 21 tokens, which a fifth (5 tokens) would punish.
        overlong_cache_share=1 / 8,
    ),
    "GSPO": Variant(
        dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.0),
        paper="GSPO, arXiv 2507.18071",
    ),
    "RLOO": Variant(
        dict(baseline="rloo", scale_rewards="none"),
        paper="Kool et al. 2019 (Buy 4 REINFORCE samples); for LLMs: Back to Basics, arXiv 2402.14740",
    ),
}


def variant_config(name: str, base: GRPOConfig) -> GRPOConfig:
    """`base` with the fields of VARIANTS[name] changed."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)}.")
    return base.replace(**VARIANTS[name].overrides)


def soft_punish_cache(name: str, config: GRPOConfig) -> int:
    """L_cache of VARIANTS[name]'s soft overlong punishment at `config`'s max_completion_length (0: none)."""
    share = VARIANTS[name].overlong_cache_share
    return max(1, round(share * config.max_completion_length)) if share else 0


def variant_reward_funcs(name: str, config: GRPOConfig, reward_funcs=None) -> tuple[list, list[float]]:
    """The reward functions a variant trains with, and their weights (for config.replace(reward_weights=...)).

    reward_funcs: the task's (default: correctness and format, with config.reward_weights, or weight 1 each).
    DAPO adds its overlong reward shaping (arXiv 2503.14476, section 3.4, eq. 13): the soft overlong punishment
    of each completion's length, 0 up to max_completion_length - L_cache, then down to -1 at
    max_completion_length, with weight 1 (DAPO adds it to the correctness reward); the other variants change
    nothing here.
    """
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)}.")
    if reward_funcs is None:
        from minigrpo.tasks.arithmetic import correctness_reward, format_reward

        reward_funcs = [correctness_reward, format_reward]
    funcs = list(reward_funcs)
    weights = list(config.reward_weights) if config.reward_weights is not None else [1.0] * len(funcs)
    if len(weights) != len(funcs):
        raise ValueError(f"config.reward_weights has {len(weights)} entries for {len(funcs)} reward functions.")
    cache = soft_punish_cache(name, config)
    if cache:
        funcs.append(get_soft_overlong_punishment(config.max_completion_length, cache))
        weights.append(1.0)
    return funcs, weights


def config_diff(config: GRPOConfig, base: GRPOConfig | None = None) -> dict:
    """The fields of `config` that differ from `base` (default: the paper's, GRPOConfig.deepseekmath())."""
    base = base if base is not None else GRPOConfig.deepseekmath()
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(GRPOConfig)
        if getattr(config, f.name) != getattr(base, f.name)
    }


# --- loss normalisers, read off autograd --------------------------------------------
def per_token_gradient_weights(
    completion_mask: torch.Tensor, loss_type: str, max_completion_length: int | None = None
) -> torch.Tensor:
    """d loss / d (per-token loss) for each token: how much each token counts under `loss_type`. (N, T) -> (N, T).

    Computed by autograd through losses.aggregate_loss (so it is the package's
    own definition, not a copy): "grpo" gives 1 / (N |o_i|), "bnpo" and "dapo"
    1 / (total tokens), "dr_grpo" 1 / (N T_max). Padding gets 0.
    """
    per_token_loss = torch.zeros(completion_mask.shape, requires_grad=True)  # (N, T)
    loss = aggregate_loss(per_token_loss, completion_mask, loss_type, max_completion_length)
    (weights,) = torch.autograd.grad(loss, per_token_loss)
    return weights  # (N, T)

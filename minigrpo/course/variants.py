"""GRPO's variants as config fields (lesson 07).

Dr. GRPO, DAPO, GSPO and RLOO are not new algorithms to this package: each is
a handful of GRPOConfig fields (the loss normaliser, the clip range, the
ratio's level, the baseline). ``VARIANTS`` names those fields. DAPO's
dynamic sampling is a field too (``dynamic_sampling=True``), but it changes
the loop rather than the loss: the filter and the refill loop are
``minigrpo.dynamic_sampling``'s ``informative_groups`` and ``fill_batch``, and
``GRPOTrainer.collect_informative_rollout`` runs them.

- ``Variant`` / ``VARIANTS`` / ``variant_config`` / ``config_diff``: the
  variants, and what each changes.
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


# --- the variants, as config fields ------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """A GRPO variant: the GRPOConfig fields it changes, and the paper it comes from."""

    overrides: dict = field(default_factory=dict)
    paper: str = ""

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

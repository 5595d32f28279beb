"""GRPO's variants as config fields, and DAPO's dynamic-sampling filter (lesson 07).

Dr. GRPO, DAPO, GSPO and RLOO are not new algorithms to this package: each is
a handful of GRPOConfig fields (the loss normaliser, the clip range, the
ratio's level, the baseline). ``VARIANTS`` names those fields; only DAPO adds
a step the config cannot express, dynamic sampling, which here is reduced to
its filter: groups whose rewards are all equal are dropped before the update.

- ``Variant`` / ``VARIANTS`` / ``variant_config`` / ``config_diff``: the
  variants, and what each changes.
- ``dynamic_sampling_mask`` / ``select_completions`` /
  ``DynamicSamplingGRPOTrainer``: DAPO's filter.
- ``per_token_gradient_weights``: the weight each ``loss_type`` gives one
  token, read off autograd, which is where Dr. GRPO and DAPO differ from GRPO.

Notation: B prompts, G completions per prompt, N = B * G, T completion tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from minigrpo.advantages import group_rewards, zero_std_groups
from minigrpo.config import GRPOConfig
from minigrpo.losses import aggregate_loss
from minigrpo.rollout import Rollout
from minigrpo.trainer import GRPOTrainer


# --- the variants, as config fields ------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """A GRPO variant: the GRPOConfig fields it changes, and whether it filters zero-std groups."""

    overrides: dict = field(default_factory=dict)
    dynamic_sampling: bool = False
    paper: str = ""


VARIANTS: dict[str, Variant] = {
    "GRPO": Variant({}, paper="DeepSeekMath, arXiv 2402.03300"),
    "Dr. GRPO": Variant(
        dict(scale_rewards="none", loss_type="dr_grpo"), paper="Understanding R1-Zero-Like Training, arXiv 2503.20783"
    ),
    "DAPO": Variant(
        dict(loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True, beta=0.0),
        dynamic_sampling=True,
        paper="DAPO, arXiv 2503.14476",
    ),
    "GSPO": Variant(
        dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.0),
        paper="GSPO, arXiv 2507.18071",
    ),
    "RLOO": Variant(dict(baseline="rloo", scale_rewards="none"), paper="Back to Basics, arXiv 2402.14740"),
}


def variant_config(name: str, base: GRPOConfig) -> GRPOConfig:
    """`base` with the fields of VARIANTS[name] changed."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)}.")
    return base.replace(**VARIANTS[name].overrides)


def config_diff(config: GRPOConfig, base: GRPOConfig | None = None) -> dict:
    """The fields of `config` that differ from `base` (default: GRPOConfig()), as {name: value}."""
    base = base if base is not None else GRPOConfig()
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


# --- DAPO's dynamic sampling, as a filter ------------------------------------------
def dynamic_sampling_mask(grouped_rewards: torch.Tensor) -> torch.Tensor:
    """(B, G) rewards -> (B,) bool: True for the groups DAPO keeps (rewards not all equal).

    A group whose G rewards are equal has advantages exactly 0, so its
    completions add nothing to the policy gradient; they only add to the
    loss's normaliser (completions for "grpo", tokens for "dapo"), which
    shrinks the gradient of the groups that do carry signal. DAPO
    (arXiv 2503.14476, section 3.2) drops them and samples more prompts until
    the batch is full again; here we only drop them.
    """
    assert grouped_rewards.dim() == 2, f"grouped_rewards must be (B, G), got {tuple(grouped_rewards.shape)}"
    return ~zero_std_groups(grouped_rewards)


def select_completions(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """The rollout restricted to the completions where `rows` (N,) bool is True (n of them)."""
    assert rows.dtype == torch.bool and rows.shape == rollout.is_truncated.shape, "rows must be (N,) bool"
    index = rows.nonzero().squeeze(1)  # (n,)

    def pick(tensor):
        return None if tensor is None else tensor[index]

    return Rollout(
        prompt_ids=rollout.prompt_ids[index],  # (n, P)
        prompt_mask=rollout.prompt_mask[index],  # (n, P)
        completion_ids=rollout.completion_ids[index],  # (n, T)
        completion_mask=rollout.completion_mask[index],  # (n, T)
        is_truncated=rollout.is_truncated[index],  # (n,)
        completions=[rollout.completions[i] for i in index.tolist()],
        old_per_token_logps=pick(rollout.old_per_token_logps),
        ref_per_token_logps=pick(rollout.ref_per_token_logps),
    )


class DynamicSamplingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that drops zero-std groups before the update (DAPO's filter, without the refill).

    It overrides only ``optimize(rollout, rewards)``: the kept completions and
    their rewards go to GRPOTrainer.optimize unchanged. Logs
    ``dynamic_sampling/kept_fraction``; when every group is dropped the step
    takes no optimizer step (there is no signal to follow).
    """

    # Each rank would drop a different number of groups: DDP's gradient average and the step count would no
    # longer match one process's, and a rank with no group left would skip the all-reduce the others wait in.
    supports_distributed = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.config
        if config.per_device_train_batch_size != config.num_completions:
            raise ValueError(
                f"dynamic sampling leaves a varying number of completions per step, so the update must be one "
                f"micro-batch: set per_device_train_batch_size = N = {config.num_completions} "
                f"(it is {config.per_device_train_batch_size})."
            )

    def optimize(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        G = self.config.num_generations
        keep = dynamic_sampling_mask(group_rewards(rewards, G))  # (B,)
        metrics = {"dynamic_sampling/kept_fraction": keep.float().mean().item()}
        if not keep.any():
            return {**metrics, "loss": 0.0, "grad_norm": 0.0}
        rows = keep.repeat_interleave(G)  # (N,)
        metrics.update(super().optimize(select_completions(rollout, rows), rewards[rows]))
        return metrics

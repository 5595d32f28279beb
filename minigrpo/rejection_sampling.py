"""Rejection-sampling fine-tuning (expert iteration): sample, keep the best answers, fine-tune on them.

The comparison GRPO is measured against (CS336's GRPO assignment; STaR, arXiv 2203.14465; RAFT, arXiv
2304.06767): the same rollout of G completions per prompt and the same rewards, but instead of group-relative
advantages and a clipped ratio, a filter and the supervised loss pretrain-tiny uses,

    keep_i = [r_i == max_j r_j  and  max_j r_j > min_reward]      within each group of G
    L      = -(1 / sum_i keep_i |o_i|) sum_i keep_i sum_t log pi_theta(o_it | q, o_i<t)

the mean negative log-likelihood of the kept tokens (course.pretrain.sft_loss's mean cross-entropy; a test holds
the two equal). What the filter does with the groups GRPO cannot learn from (all rewards equal):

- all right (every r_i = 1): every completion is kept and imitated once more; GRPO's advantages are 0 there;
- all wrong (every r_i = 0 = min_reward): nothing is kept (imitating the best of wrong answers teaches wrong
  answers); GRPO's advantages are 0 there too;
- mixed: the right ones are kept; GRPO also pushes the wrong ones *down*, which filtering never does.

Notation: B prompts, G completions each, N = B * G rows (group-major), T completion tokens.
"""

from __future__ import annotations

import torch

from minigrpo.advantages import group_rewards
from minigrpo.logprobs import masked_sum
from minigrpo.models import precision_context
from minigrpo.rollout import Rollout
from minigrpo.run.schedule import micro_batches
from minigrpo.trainer import Trainer


def best_in_group_mask(grouped_rewards: torch.Tensor, min_reward: float = 0.0) -> torch.Tensor:
    """keep (B, G) bool: the completions whose reward is their group's maximum, in groups whose maximum is above
    min_reward. grouped_rewards: (B, G). A group of all-equal rewards is kept whole if they are above min_reward
    and dropped whole otherwise; exact equality, so rewards are compared as the reward functions computed them."""
    assert grouped_rewards.dim() == 2, "grouped_rewards must be (B, G)"
    best = grouped_rewards.max(dim=1, keepdim=True).values  # (B, 1)
    return (grouped_rewards == best) & (best > min_reward)  # (B, G)


def rejection_sampling_loss(
    per_token_logps: torch.Tensor, keep: torch.Tensor, completion_mask: torch.Tensor, num_kept_tokens: float
) -> torch.Tensor:
    """The NLL of the kept completions' tokens, divided by the step's kept-token count.

    Symbol           | Shape  | Description
    -----------------|--------|----------------------------------------------------------------
    per_token_logps  | (n, T) | log pi_theta of each completion token, with gradient
    keep             | (n,)   | bool: the completions kept (best_in_group_mask, flattened)
    completion_mask  | (n, T) | 1 on tokens that count
    num_kept_tokens  |        | kept tokens in the whole step (every micro-batch): the losses of a step's
                     |        | micro-batches then add up to its token mean, as sft_loss's mean cross-entropy
    returns          | ()     | the loss; 0 (and a zero gradient) when nothing is kept
    """
    assert per_token_logps.shape == completion_mask.shape, "per_token_logps and completion_mask must both be (n, T)"
    assert keep.shape == per_token_logps.shape[:1], "keep must be (n,)"
    kept_mask = completion_mask * keep.unsqueeze(1)  # (n, T)
    return -masked_sum(per_token_logps, kept_mask) / max(float(num_kept_tokens), 1.0)


class RejectionSamplingTrainer(Trainer):
    """Expert iteration on GRPOTrainer's loop: the same prompts, rollout, rewards, evaluation and checkpoints; the
    update keeps each group's best completions (best_in_group_mask) and takes one optimizer step on their NLL.

    Reads from the GRPOConfig: num_generations, prompts_per_step, per_device_train_batch_size (micro-batches),
    learning rate and schedule, max_grad_norm, mask_truncated_completions, and min_reward (below). It has no ratio,
    clip or KL: beta must be 0, num_iterations 1, and one optimizer step per generation."""

    min_reward = 0.0
    """A group whose best reward is not above this keeps nothing (with 0/1 correctness: a group of wrong answers)."""

    def _check_inputs(self) -> None:
        super()._check_inputs()
        config = self.config
        if config.beta != 0.0:
            raise ValueError(
                f"beta={config.beta}: rejection-sampling fine-tuning has no KL term. Set beta=0.0 "
                "(e.g. GRPOConfig.tiny_cpu(beta=0.0))."
            )
        if config.optimizer_steps_per_generation != 1:
            raise ValueError(
                f"{config.optimizer_steps_per_generation} optimizer steps per generation: rejection-sampling "
                "fine-tuning takes one. Set num_iterations=1 and give prompts_per_step (one step per generation)."
            )

    def update(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        """Keep the best of each group, then one optimizer step on their NLL, micro-batch by micro-batch."""
        config = self.config
        keep = best_in_group_mask(group_rewards(rewards, config.num_generations), self.min_reward).flatten()  # (N,)
        loss_mask = self.loss_mask(rollout)  # (N, T)
        num_kept_tokens = float((loss_mask * keep.unsqueeze(1)).sum())
        metrics = {"rft/kept_fraction": keep.float().mean().item(), "rft/kept_tokens": num_kept_tokens}
        if not keep.any():  # every group wrong: nothing to imitate, no optimizer step
            return metrics | {"loss": 0.0, "grad_norm": 0.0, "learning_rate": self.set_learning_rate(self.step)}
        self.optimizer.zero_grad(set_to_none=True)
        step_loss, entropy_sum = 0.0, 0.0
        for rows in micro_batches(len(keep), config.per_device_train_batch_size):
            if not keep[rows].any():
                continue  # no kept row here: no forward pass
            with precision_context(self.device, config.bf16):
                per_token_logps, entropy = self.policy_logps(rollout, rows)  # (n, T), (n, T)
            loss = rejection_sampling_loss(per_token_logps, keep[rows], loss_mask[rows], num_kept_tokens)
            self.backward(loss, f"completions {rows.start}-{rows.stop - 1}")
            step_loss += loss.item()
            entropy_sum += masked_sum(entropy.detach(), loss_mask[rows] * keep[rows].unsqueeze(1)).item()
        grad_norm = self.clip_gradients(self.trainable_parameters(), config.max_grad_norm)
        metrics["learning_rate"] = self.set_learning_rate(self.step)
        self.optimizer.step()
        entropy = entropy_sum / num_kept_tokens  # the kept tokens' mean entropy
        return metrics | {"loss": step_loss, "grad_norm": grad_norm, "entropy": entropy}

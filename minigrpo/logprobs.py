"""Per-token log-probabilities, entropy and masked reductions.

For a completion o of length T after a prompt q, the policy gradient needs
log pi_theta(o_t | q, o_<t) for every t: an (N, T) tensor. The logits that
produce it are (N, T, V), and V is large (151,936 for Qwen2.5): 16 completions
x 128 tokens of fp32 logits is 1.2 GB before any gradient. So we never build
them for the whole batch: the caller works in micro-batches, and inside one
micro-batch the vocabulary projection runs chunk by chunk of positions, each
chunk recomputed in the backward pass (activation checkpointing) instead of
being kept. Peak memory is then one chunk of logits, not N x T x V.

The shift. Position t of the model's output predicts token t + 1. The logits
that score completion token t therefore come from the position just before
it: hidden[:, P - 1 + t]. Getting this off by one is the classic silent bug
(the loss still goes down, on the wrong tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[index] without keeping a (R, V) log-softmax tensor.

    logits: (R, V) any float dtype; index: (R,) int64 -> (R,) fp32.
    Uses log p_k = z_k - logsumexp(z), computed in fp32.
    """
    logits = logits.float()
    picked = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1)  # (R,)
    return picked - torch.logsumexp(logits, dim=-1)  # (R,)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum_v p_v log p_v per row. (R, V) -> (R,) fp32."""
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (R, V)
    return -(log_probs.exp() * log_probs).sum(-1)  # (R,)


def _chunk_logps_and_entropy(hidden, labels, weight, bias, temperature: float):
    """Vocabulary projection of one chunk of positions. hidden (R, H), labels (R,) -> (R,), (R,)."""
    logits = F.linear(hidden, weight, bias) / temperature  # (R, V)
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (R, V) fp32, freed after the chunk
    logps = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (R,)
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # (R,)
    return logps, entropy


def completion_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` uses: (n, L) -> (n, L)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def per_token_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    temperature: float = 1.0,
    chunk_size: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of each of the last `logits_to_keep` tokens.

    Symbol          | Shape  | Description
    ----------------|--------|----------------------------------------------------
    input_ids       | (n, L) | prompt (left-padded) + completion (right-padded), L = P + T
    attention_mask  | (n, L) | 1 on real tokens
    logits_to_keep  | int    | T, the completion length
    returns         | (n, T) | log pi(o_t | q, o_<t) at `temperature` (fp32)
                    | (n, T) | entropy of pi(. | q, o_<t) (fp32)

    Gradients flow to the model when called with grad enabled.
    """
    assert input_ids.shape == attention_mask.shape, "input_ids and attention_mask must both be (n, L)"
    n, L = input_ids.shape
    T = logits_to_keep
    assert 0 < T < L, f"logits_to_keep={T} must be in (0, {L}): there must be at least one prompt token"
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=completion_position_ids(attention_mask),
        output_hidden_states=True,
        logits_to_keep=1,  # we project the hidden states ourselves, chunk by chunk
        use_cache=False,
    )
    hidden = output.hidden_states[-1][:, L - T - 1 : L - 1]  # (n, T, H): position t-1 predicts token t
    labels = input_ids[:, L - T :]  # (n, T)
    head = model.get_output_embeddings()
    flat_hidden, flat_labels = hidden.reshape(n * T, -1), labels.reshape(n * T)  # (n*T, H), (n*T,)
    logps, entropies = [], []
    for start in range(0, n * T, chunk_size):
        rows = slice(start, start + chunk_size)
        args = (flat_hidden[rows], flat_labels[rows], head.weight, head.bias, temperature)
        if torch.is_grad_enabled():
            chunk = checkpoint(_chunk_logps_and_entropy, *args, use_reentrant=False)
        else:
            chunk = _chunk_logps_and_entropy(*args)
        logps.append(chunk[0])
        entropies.append(chunk[1])
    return torch.cat(logps).view(n, T), torch.cat(entropies).view(n, T)  # (n, T), (n, T)


@torch.no_grad()
def batched_per_token_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int,
    temperature: float = 1.0,
    chunk_size: int = 4096,
) -> torch.Tensor:
    """per_token_logps without gradients, `batch_size` rows at a time (old / reference log-probs). -> (N, T)"""
    parts = [
        per_token_logps(
            model,
            input_ids[i : i + batch_size],
            attention_mask[i : i + batch_size],
            logits_to_keep,
            temperature,
            chunk_size,
        )[0]
        for i in range(0, input_ids.shape[0], batch_size)
    ]
    return torch.cat(parts)  # (N, T)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where mask == 1. values, mask: (N, T). Masked entries (even NaN/inf) contribute 0."""
    masked = torch.where(mask.bool(), values, torch.zeros_like(values))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where mask == 1; 0 (not NaN) where the mask is empty. (N, T) -> scalar or (N,)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)

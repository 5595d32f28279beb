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

import inspect

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits)[index] without keeping a (R, V) log-softmax tensor: THE log-prob kernel.

    Symbol        | Shape   | Description
    --------------|---------|----------------------------------------------------
    logits        | (R, V)  | any float dtype (any leading shape: (..., V))
    index         | (R,)    | int64, the token whose log-prob is wanted
    returns       | (R,)    | log p_index = z_index - logsumexp(z), in fp32
    with_entropy  |         | also return H = -sum_v p_v log p_v, (R,) fp32

    Every log-prob the package computes comes from here: lesson 02b and exercise 03
    teach it, and the update and sampling-time scoring (pi_old, pi_ref) reach it
    through per_token_logps, chunk by chunk of positions.
    """
    logits = logits.float()
    normalizer = torch.logsumexp(logits, dim=-1)  # (R,)
    logps = logits.gather(-1, index.unsqueeze(-1)).squeeze(-1) - normalizer  # (R,)
    if not with_entropy:
        return logps
    log_probs = logits - normalizer.unsqueeze(-1)  # (R, V)
    return logps, -(log_probs.exp() * log_probs).sum(-1)  # (R,), (R,)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum_v p_v log p_v per row. (R, V) -> (R,) fp32 (the kernel's entropy; the index does not enter it)."""
    any_token = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)  # (R,)
    return selective_log_softmax(logits, any_token, with_entropy=True)[1]


def _chunk_logps_and_entropy(hidden, labels, weight, bias, temperature: float):
    """Vocabulary projection of one chunk of positions. hidden (R, H), labels (R,) -> (R,), (R,)."""
    logits = F.linear(hidden, weight, bias) / temperature  # (R, V), freed after the chunk
    return selective_log_softmax(logits, labels, with_entropy=True)


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
    return project_to_logps(model, hidden, input_ids[:, L - T :], temperature, chunk_size)


def project_to_logps(
    model, hidden: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """The vocabulary projection, chunk by chunk: hidden (n, T, H) predicting labels (n, T) -> logps, entropy (n, T).

    Each chunk's logits go through selective_log_softmax, the one kernel. With
    gradients, each chunk is recomputed in the backward pass (activation
    checkpointing) so that only one chunk of (rows, V) logits ever exists.
    When everything fits in one chunk there is nothing to save by recomputing,
    and the chunk is kept instead.
    """
    n, T = labels.shape
    head = model.get_output_embeddings()
    flat_hidden, flat_labels = hidden.reshape(n * T, -1), labels.reshape(n * T)  # (n*T, H), (n*T,)
    recompute = torch.is_grad_enabled() and n * T > chunk_size
    logps, entropies = [], []
    for start in range(0, n * T, chunk_size):
        rows = slice(start, start + chunk_size)
        args = (flat_hidden[rows], flat_labels[rows], head.weight, head.bias, temperature)
        chunk = (
            checkpoint(_chunk_logps_and_entropy, *args, use_reentrant=False)
            if recompute
            else _chunk_logps_and_entropy(*args)
        )
        logps.append(chunk[0])
        entropies.append(chunk[1])
    return torch.cat(logps).view(n, T), torch.cat(entropies).view(n, T)  # (n, T), (n, T)


# --- the fast path: each prompt once per group (GRPOConfig.share_prompt_prefix) -------------------
def shares_prompt_prefix(config, rows_per_call: int) -> bool:
    """Whether a call on `rows_per_call` group-major rows runs each prompt once per group (sampling and scoring)."""
    G = config.num_generations
    return config.share_prompt_prefix and rows_per_call >= G and rows_per_call % G == 0


def prompt_cache_per_group(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, **kwargs):
    """Run each group's prompt once and repeat its KV cache G times: (model output of n/G rows, cache of n rows).

    prompt_ids, prompt_mask: (n, P), group-major, rows b*G .. b*G+G-1 equal. Sampling prefills with it
    (rollout.generate_completions) and scoring runs the completions on top of it (shared_prompt_per_token_logps).
    """
    G = num_generations
    output = model(
        input_ids=prompt_ids[::G],  # (n/G, P): one row per group
        attention_mask=prompt_mask[::G],
        position_ids=completion_position_ids(prompt_mask[::G]),
        logits_to_keep=1,
        use_cache=True,
        **kwargs,
    )
    cache = returned_cache(output)
    cache.batch_repeat_interleave(G)  # (n/G, ...) -> (n, ...)
    return output, cache


def shared_prompt_per_token_logps(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    num_generations: int,
    temperature: float = 1.0,
    chunk_size: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_logps, computing each group's shared prompt once instead of G times.

    Symbol           | Shape  | Description
    -----------------|--------|-------------------------------------------------------
    prompt_ids       | (n, P) | left-padded prompts, group-major: rows b*G .. b*G+G-1 are equal
    prompt_mask      | (n, P) | 1 on real prompt tokens
    completion_ids   | (n, T) | right-padded completions
    completion_mask  | (n, T) | 1 on real completion tokens
    returns          | (n, T) | log pi(o_t | q, o_<t) and the entropy, as per_token_logps

    The G completions of a group share their prompt, so its keys and values
    are the same G times over: run the prompt once per group (n / G rows),
    repeat its KV cache G times, and run only the completions on top of it.
    Gradients flow through the repeated cache into the prompt pass, so the
    result (values and gradients) equals per_token_logps up to float
    rounding, for about (P / G + T) / (P + T) of the work.
    """
    n, P = prompt_ids.shape
    G = num_generations
    assert n % G == 0, f"{n} rows are not whole groups of G={G}"
    prompts, cache = prompt_cache_per_group(model, prompt_ids, prompt_mask, G, output_hidden_states=True)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (n, P + T)
    completions = model(
        input_ids=completion_ids,
        attention_mask=attention_mask,
        position_ids=completion_position_ids(attention_mask)[:, P:],  # (n, T)
        output_hidden_states=True,
        logits_to_keep=1,
        use_cache=True,
        **{cache_argument(model): cache},
    )
    last_prompt_hidden = prompts.hidden_states[-1][:, -1:].repeat_interleave(G, dim=0)  # (n, 1, H) predicts o_0
    hidden = torch.cat([last_prompt_hidden, completions.hidden_states[-1][:, :-1]], dim=1)  # (n, T, H)
    return project_to_logps(model, hidden, completion_ids, temperature, chunk_size)


def cache_argument(model) -> str:
    """The name of the KV-cache argument: `cache` in recent transformers, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output):
    """The KV cache a forward pass with use_cache=True returned (`cache`, formerly `past_key_values`)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def rows_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    num_generations: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_logps of some rows (n, L) -> (n, T), (n, T), each group's prompt run once when the rows are
    whole groups of num_generations=G > 1 (shared_prompt_per_token_logps), else the plain path."""
    n, L = input_ids.shape
    P, G = L - logits_to_keep, num_generations
    if G > 1 and n % G == 0:
        ids, mask = input_ids, attention_mask
        return shared_prompt_per_token_logps(
            model, ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], G, temperature, chunk_size
        )
    return per_token_logps(model, input_ids, attention_mask, logits_to_keep, temperature, chunk_size)


def completion_logps(model, rollout, config, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(o_t | q, o_<t) and entropy, (n, T), of a rollout's rows `rows` under `model`: the update's forward pass.

    rollout: a minigrpo.rollout.Rollout (its prompt and completion ids and masks). With config.share_prompt_prefix
    and whole groups each group's prompt runs once. Gradients flow when grad is enabled.
    """
    input_ids, attention_mask = rollout.input_ids[rows], rollout.attention_mask[rows]  # (n, P + T)
    T = rollout.completion_ids.shape[1]
    G = config.num_generations if shares_prompt_prefix(config, input_ids.shape[0]) else 1
    return rows_logps(model, input_ids, attention_mask, T, config.temperature, config.logprob_chunk_size, G)


@torch.no_grad()
def batched_per_token_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    num_generations: int = 1,
) -> torch.Tensor:
    """per_token_logps without gradients, `batch_size` rows at a time: pi_old and pi_ref at sampling time. -> (N, T)

    num_generations=G > 1 says the rows are group-major, G copies of each
    prompt: a micro-batch of whole groups then runs each prompt once
    (rows_logps); any other micro-batch takes the plain path.
    """
    N = input_ids.shape[0]
    parts = [
        rows_logps(model, input_ids[i : i + batch_size], attention_mask[i : i + batch_size], logits_to_keep,
                   temperature, chunk_size, num_generations)[0]
        for i in range(0, N, batch_size)
    ]  # fmt: skip
    return torch.cat(parts)  # (N, T)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where mask == 1. values, mask: (N, T). Masked entries (even NaN/inf) contribute 0."""
    masked = torch.where(mask.bool(), values, torch.zeros_like(values))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where mask == 1; 0 (not NaN) where the mask is empty. (N, T) -> scalar or (N,)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)

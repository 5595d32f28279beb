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

    Every log-prob the package computes comes from here: lesson 02b and exercise 01
    teach it, and the update (completion_logps) and sampling-time scoring (pi_old,
    pi_ref: per_token_logps) reach it through project_to_logps, chunk by chunk of
    positions.
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


def _projected_chunk_logps(hidden, labels, weight, bias, temperature: float, with_entropy: bool):
    """The vocabulary projection and the kernel on one chunk of positions, hidden (R, H), labels (R,) -> (R,)
    [, (R,)]: the function activation checkpointing recomputes in the backward pass."""
    logits = F.linear(hidden, weight, bias) / temperature  # (R, V), freed after the chunk
    return selective_log_softmax(logits, labels, with_entropy)


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
    num_generations: int = 1,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob and entropy of each of the last `logits_to_keep` tokens.

    Symbol          | Shape  | Description
    ----------------|--------|----------------------------------------------------
    input_ids       | (n, L) | prompt (left-padded) + completion (right-padded), L = P + T
    attention_mask  | (n, L) | 1 on real tokens
    logits_to_keep  | int    | T, the completion length
    returns         | (n, T) | log pi(o_t | q, o_<t) at `temperature` (fp32)
                    | (n, T) | entropy of pi(. | q, o_<t) (fp32), or None without with_entropy

    num_generations=G > 1 says the rows are group-major, G copies of each prompt: when they are whole groups, each
    group's prompt runs once (shared_prompt_hidden_states). Gradients flow to the model when grad is enabled.
    """
    assert input_ids.shape == attention_mask.shape, "input_ids and attention_mask must both be (n, L)"
    hidden = predicting_hidden_states(model, input_ids, attention_mask, logits_to_keep, num_generations)  # (n, T, H)
    labels = input_ids[:, -logits_to_keep:]  # (n, T)
    return project_to_logps(model, hidden, labels, temperature, chunk_size, with_entropy)


def completion_logps(
    model, rollout, config, rows: slice = slice(None), with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(o_t | q, o_<t) and entropy, (n, T), of a rollout's rows `rows` under `model`: the update's forward pass.

    rollout: a minigrpo.rollout.Rollout (its prompt and completion ids and masks). With config.share_prompt_prefix
    and whole groups each group's prompt runs once. Gradients flow when grad is enabled. per_token_logps on the
    rollout's rows, written out so that the update reaches the kernel in as few calls as it can.
    """
    input_ids, attention_mask = rollout.input_ids[rows], rollout.attention_mask[rows]  # (n, P + T)
    T = rollout.completion_ids.shape[1]
    G = config.num_generations if shares_prompt_prefix(config, input_ids.shape[0]) else 1
    hidden = predicting_hidden_states(model, input_ids, attention_mask, T, G)  # (n, T, H)
    labels = input_ids[:, -T:]  # (n, T)
    return project_to_logps(model, hidden, labels, config.temperature, config.logprob_chunk_size, with_entropy)


def predicting_hidden_states(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, num_generations: int = 1
) -> torch.Tensor:
    """The last layer's hidden states that predict the last T = logits_to_keep tokens: (n, L) -> (n, T, H).

    The shift: position t - 1 predicts token t, so the states are those of positions P - 1 .. L - 2. With
    num_generations=G > 1 and whole groups of rows, each group's prompt runs once (shared_prompt_hidden_states)."""
    n, L = input_ids.shape
    T, G = logits_to_keep, num_generations
    assert 0 < T < L, f"logits_to_keep={T} must be in (0, {L}): there must be at least one prompt token"
    if G > 1 and n % G == 0:
        P = L - T
        ids, mask = input_ids, attention_mask
        return shared_prompt_hidden_states(model, ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], G)
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=completion_position_ids(attention_mask),
        output_hidden_states=True,
        logits_to_keep=1,  # we project the hidden states ourselves, chunk by chunk
        use_cache=False,
    )
    return output.hidden_states[-1][:, L - T - 1 : L - 1]  # (n, T, H): position t-1 predicts token t


def project_to_logps(
    model,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The vocabulary projection, chunk by chunk: hidden (n, T, H) predicting labels (n, T) -> logps, entropy (n, T)
    (entropy None without with_entropy: scoring pi_old and pi_ref throws it away, so it is not computed).

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
    chunks = []
    for start in range(0, n * T, chunk_size):
        rows = slice(start, start + chunk_size)
        if recompute:
            args = (flat_hidden[rows], flat_labels[rows], head.weight, head.bias, temperature, with_entropy)
            chunks.append(checkpoint(_projected_chunk_logps, *args, use_reentrant=False))
        else:  # the same two lines as _projected_chunk_logps, one call fewer on the way to the kernel
            logits = F.linear(flat_hidden[rows], head.weight, head.bias) / temperature  # (R, V)
            chunks.append(selective_log_softmax(logits, flat_labels[rows], with_entropy))
    if not with_entropy:
        return torch.cat(chunks).view(n, T), None  # (n, T)
    logps, entropies = zip(*chunks, strict=True)
    return torch.cat(logps).view(n, T), torch.cat(entropies).view(n, T)  # (n, T), (n, T)


# --- the fast path: each prompt once per group (GRPOConfig.share_prompt_prefix) -------------------
def shares_prompt_prefix(config, rows_per_call: int) -> bool:
    """Whether a call on `rows_per_call` group-major rows runs each prompt once per group (sampling and scoring)."""
    G = config.num_generations
    return config.share_prompt_prefix and rows_per_call >= G and rows_per_call % G == 0


def prompt_cache_per_group(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int, **kwargs):
    """Run each group's prompt once and repeat its KV cache G times: (model output of n/G rows, cache of n rows).

    prompt_ids, prompt_mask: (n, P), group-major, rows b*G .. b*G+G-1 equal. Sampling prefills with it
    (rollout.generate_completions) and scoring runs the completions on top of it (shared_prompt_hidden_states).
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


def shared_prompt_hidden_states(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    num_generations: int,
) -> torch.Tensor:
    """predicting_hidden_states, computing each group's shared prompt once instead of G times. -> (n, T, H)

    Symbol           | Shape  | Description
    -----------------|--------|-------------------------------------------------------
    prompt_ids       | (n, P) | left-padded prompts, group-major: rows b*G .. b*G+G-1 are equal
    prompt_mask      | (n, P) | 1 on real prompt tokens
    completion_ids   | (n, T) | right-padded completions
    completion_mask  | (n, T) | 1 on real completion tokens
    returns          | (n, T, H) | the hidden states that predict each completion token

    The G completions of a group share their prompt, so its keys and values
    are the same G times over: run the prompt once per group (n / G rows),
    repeat its KV cache G times, and run only the completions on top of it.
    Gradients flow through the repeated cache into the prompt pass, so the
    log-probs (values and gradients) equal the plain path's up to float
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
    return torch.cat([last_prompt_hidden, completions.hidden_states[-1][:, :-1]], dim=1)  # (n, T, H)


def cache_argument(model) -> str:
    """The name of the KV-cache argument: `cache` in recent transformers, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(output):
    """The KV cache a forward pass with use_cache=True returned (`cache`, formerly `past_key_values`)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


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
    """per_token_logps without gradients or entropy, `batch_size` rows at a time: pi_old and pi_ref at sampling
    time. -> (N, T)

    num_generations=G > 1 says the rows are group-major, G copies of each
    prompt: a micro-batch of whole groups then runs each prompt once; any
    other micro-batch takes the plain path.
    """
    N = input_ids.shape[0]
    parts = [
        per_token_logps(model, input_ids[i : i + batch_size], attention_mask[i : i + batch_size], logits_to_keep,
                        temperature, chunk_size, num_generations, with_entropy=False)[0]
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

"""Stage 1: group sampling. Each prompt is repeated G times and completed by the policy.

Rollouts are group-major: row b*G + g is completion g of prompt b, so a (N,)
tensor becomes the (B, G) groups with a plain .view(B, G).

Prompts are left-padded (so every prompt ends where generation begins) and
completions right-padded (so every completion starts at the same column). A
completion ends at its first EOS token; the EOS counts (the model must learn
to stop), the padding after it does not. A completion with no EOS ran out of
max_completion_length: it is *truncated*.

There is one sampling path: each group of G completions is drawn from its own
torch.Generator, seeded per group (GroupSeededSampling), with every sampling
option of the config applied there. The completions of group b then depend on
its seed alone, not on the other groups in the batch, so one process and K
data-parallel processes sample the same completions for the same seeds. With
no seeds given, one per group is drawn from torch's global generator, so
torch.manual_seed(s) before a call still makes it reproducible.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import torch
from transformers import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minigrpo.logprobs import (
    batched_per_token_logps,
    cache_argument,
    completion_logps,  # noqa: F401 (the update's forward pass lives in logprobs; lessons import it from here too)
    prompt_cache_per_group,
    shares_prompt_prefix,
)
from minigrpo.models import precision_context
from minigrpo.time_limits import time_limit
from minigrpo.tool_calling import Episodes, run_episodes


def _padded(side: str):
    """A (N, width) Rollout field, padded on `side` ("left" for prompts, "right" for completions)."""
    return field(metadata={"padded": side})


@dataclass
class Rollout:
    """One step's sampled completions and everything the loss needs about them.

    Symbol               | Shape  | Description
    ---------------------|--------|------------------------------------------------
    prompt_ids           | (N, P) | left-padded prompt tokens, each prompt G times
    prompt_mask          | (N, P) | 1 on real prompt tokens
    completion_ids       | (N, T) | right-padded completion tokens
    completion_mask      | (N, T) | 1 up to and including the first EOS
    is_truncated         | (N,)   | True when no EOS within max_completion_length
    old_per_token_logps  | (N, T) | log pi_old, or None with one optimizer step per generation
    ref_per_token_logps  | (N, T) | log pi_ref, or None when beta == 0
    sampling_per_token_logps | (N, T) | log pi_sampler when a sampler other than the policy drew the completions
                         |        | (vLLM, a bf16 copy: with_sampler_logps), else None (the sampler is the policy)
    completions          | N str  | decoded completions (special tokens removed)
    tool_mask            | (N, T) | with tools: 1 on the model's tokens, 0 on the tools' results; else None
    conversations        | N lists | with tools: each episode as TRL's messages (what reward functions get)
    tool_calls           | (N,)   | with tools: the tool calls each episode made
    tool_failures        | (N,)   | with tools: those whose result was an error

    With tools a completion is an episode (minigrpo.tool_calling): completion_mask is 1 on every token up to the
    last turn's EOS, the tools' included (they are attended to), and is_truncated says the last turn has no EOS.
    trained_mask is what the loss counts.
    """

    prompt_ids: torch.Tensor = _padded("left")
    prompt_mask: torch.Tensor = _padded("left")
    completion_ids: torch.Tensor = _padded("right")
    completion_mask: torch.Tensor = _padded("right")
    is_truncated: torch.Tensor = field()
    completions: list[str] = field()
    old_per_token_logps: torch.Tensor | None = field(default=None, metadata={"padded": "right"})
    ref_per_token_logps: torch.Tensor | None = field(default=None, metadata={"padded": "right"})
    sampling_per_token_logps: torch.Tensor | None = field(default=None, metadata={"padded": "right"})
    tool_mask: torch.Tensor | None = field(default=None, metadata={"padded": "right"})
    conversations: list[list[dict]] | None = None
    tool_calls: torch.Tensor | None = None
    tool_failures: torch.Tensor | None = None

    @property
    def trained_mask(self) -> torch.Tensor:
        """(N, T) the tokens the policy wrote: the completion mask, times the tool mask in an episode."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)  # (N, P + T)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)  # (N, P + T)

    def completion_id_lists(self) -> list[list[int]]:
        """Each completion's token ids without padding (what TRL passes as completion_ids)."""
        lengths = self.completion_mask.sum(1).tolist()
        return [ids[: int(n)] for ids, n in zip(self.completion_ids.tolist(), lengths, strict=True)]

    def select(self, index: torch.Tensor) -> Rollout:
        """The rows `index` (n,) int64, in that order: every field, the decoded texts included."""

        def take(value):
            if value is None:
                return None
            return [value[i] for i in index.tolist()] if isinstance(value, list) else value[index]

        return Rollout(**{f.name: take(getattr(self, f.name)) for f in fields(self)})

    @staticmethod
    def concat(rollouts: list[Rollout], pad_token_id: int) -> Rollout:
        """Several rollouts as one, rows in order: prompts left-padded to the widest P, completions right-padded to
        the widest T (padding is masked out: 0 in the masks and log-probs, pad_token_id in ids). A field that is
        None in any of them is None."""
        assert rollouts, "Rollout.concat needs at least one rollout"

        def join(spec):
            values = [getattr(r, spec.name) for r in rollouts]
            if any(v is None for v in values):
                return None
            if isinstance(values[0], list):
                return [item for v in values for item in v]
            side = spec.metadata.get("padded")
            if side is None:
                return torch.cat(values)  # (N,)
            width, fill = max(v.shape[1] for v in values), pad_token_id if spec.name.endswith("_ids") else 0

            def pad(v: torch.Tensor) -> torch.Tensor:
                missing = width - v.shape[1]
                return torch.nn.functional.pad(v, (missing, 0) if side == "left" else (0, missing), value=fill)

            return torch.cat([pad(v) for v in values])  # (N, width)

        return Rollout(**{spec.name: join(spec) for spec in fields(Rollout)})


def repeat_for_group(items: list, num_generations: int) -> list:
    """[a, b] -> [a, a, ..., b, b, ...], each item G times (group-major)."""
    return [item for item in items for _ in range(num_generations)]


CHAT_TEMPLATE_SECONDS = 10.0
"""The longest one prompt's chat template may take to render (a real template takes milliseconds)."""


def render_prompts(tokenizer, prompts: list, tools: Sequence[Callable] | None = None) -> list[str]:
    """Chat messages -> text through the tokenizer's chat template (which lists `tools`, when given, as the
    model's own template does); plain strings pass through.

    A chat template is a program that comes with the model folder (Jinja, sandboxed by transformers: no file or
    code access, range() capped at 100,000), but nested loops can still run for hours: each prompt's rendering is
    bounded by CHAT_TEMPLATE_SECONDS, after which TimeoutError names the template and the prompt."""
    texts = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            texts.append(prompt)
            continue
        with time_limit(CHAT_TEMPLATE_SECONDS, functools.partial(_chat_template_too_slow, index)):
            # tools=None, never []: some templates write their tool preamble for an empty list (TRL does the same)
            texts.append(
                tokenizer.apply_chat_template(prompt, tools=tools or None, tokenize=False, add_generation_prompt=True)
            )
    return texts


def _chat_template_too_slow(index: int) -> TimeoutError:
    return TimeoutError(
        f"the tokenizer's chat template took more than {CHAT_TEMPLATE_SECONDS:g} s to render prompt {index}: it loops "
        "too long. Fix tokenizer.chat_template (or use the model's original tokenizer)."
    )


def tokenize_prompts(
    tokenizer, prompts: list, max_prompt_length: int | None, device, tools: Sequence[Callable] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, (n, P). Fails when a prompt is longer than max_prompt_length (None:
    no limit)."""
    texts = render_prompts(tokenizer, prompts, tools)
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    check_prompt_length(encoded["input_ids"].shape[1], max_prompt_length, "a prompt")
    return encoded["input_ids"].to(device), encoded["attention_mask"].to(device)


def check_prompt_length(longest: int, max_prompt_length: int | None, which: str) -> None:
    """Refuse prompts longer than max_prompt_length (None: no limit), saying what to change. which: the prompt(s)."""
    if max_prompt_length is not None and longest > max_prompt_length:
        raise ValueError(
            f"{which} is {longest} tokens long but max_prompt_length={max_prompt_length}: raise max_prompt_length "
            f"to at least {longest}, set it to None (no limit, as in TRL), or shorten the prompts."
        )


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token id that ends a completion (Qwen2.5 stops on <|im_end|> and <|endoftext|>)."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) ids -> mask (N, T) that is 1 up to and including the first EOS, and is_truncated (N,).

    A completion with no EOS keeps every token and is truncated.
    """
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # (N, T)
    has_eos = is_eos.any(dim=1)  # (N,)
    T = completion_ids.shape[1]
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T, dtype=torch.long))  # (N,)
    positions = torch.arange(T, device=completion_ids.device).unsqueeze(0)  # (1, T)
    completion_mask = (positions <= first_eos.unsqueeze(1)).long()  # (N, T)
    return completion_mask, ~has_eos


# transformers 4.x (4.56 among them) replaces a generation field left at its global default (repetition_penalty 1.0,
# top_k 50) by the model's own (Qwen's 1.05, 20) unless generate gets use_model_defaults=False; 5.x fills in only the
# fields left None, and has no such argument. Read from GenerationMixin: a PeftModel's generate takes **kwargs.
GENERATE_HAS_USE_MODEL_DEFAULTS = "use_model_defaults" in inspect.signature(GenerationMixin.generate).parameters


def generation_config_for(
    config, model, tokenizer, greedy: bool = False, max_new_tokens: int | None = None
) -> GenerationConfig:
    """The GenerationConfig `generate` runs with: greedy decoding in both cases, at most `max_new_tokens` tokens
    (default config.max_completion_length; an episode's later turns get what is left of it).

    greedy=True (evaluation): plain greedy decoding, with config.repetition_penalty.
    greedy=False (sampling): greedy decoding that changes nothing, because
    GroupSeededSampling applies every sampling option itself and leaves the drawn
    token the only finite score. repetition_penalty is 1.0 there on purpose:
    `generate` applies a penalty even when greedy, so it would count twice.

    Built from scratch on purpose: Qwen2.5-Instruct's own generation_config
    samples with top_k=20, top_p=0.8 and repetition_penalty=1.05. `generate`
    fills in only the fields we leave None (generate_completions tells
    transformers 4.x to do the same), and top_k / top_p only act when it
    samples, which it never does here.
    """
    options = dict(
        do_sample=False,
        max_new_tokens=config.max_completion_length if max_new_tokens is None else max_new_tokens,
        eos_token_id=eos_token_ids(model, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        repetition_penalty=config.repetition_penalty if greedy else 1.0,
    )
    if use_fast_generation(config):
        # One cache size for every call (the longest prompt plus the completion), so the compiled decoding
        # step is built once instead of again whenever a batch's prompts are longer than before.
        options.update(
            cache_implementation="static", max_cache_len=config.max_prompt_length + config.max_completion_length
        )
    return GenerationConfig(**options)


def use_fast_generation(config) -> bool:
    """The static-cache fast path: opt-in (``GRPOConfig.fast_generation=True``), meant for CUDA.

    With a static (fixed-size, preallocated) KV cache, transformers' `generate`
    compiles the decoding step by itself on CUDA: torch.compile with
    CompileConfig's default mode "reduce-overhead", i.e. CUDA graphs, which
    removes the per-kernel launch cost that dominates decoding a small model
    (GenerationConfig.disable_compile would switch it off). The first calls
    are slow (compilation); later ones replay the graph. It stays off by default
    until `bench/gpu_check.py` has shown on a GPU that it gives the plain path's tokens.
    """
    return bool(config.fast_generation)


def sampling_warpers(config, prompt_mask: torch.Tensor) -> LogitsProcessorList:
    """The config's sampling options as transformers' processors, in the order `generate` applies them.

    repetition_penalty first (a processor), then the warpers temperature,
    top_k, top_p, min_p (GenerationMixin._get_logits_processor). An option at
    its "off" value is left out: repetition_penalty 1.0, temperature 1.0,
    top_k 0, top_p 1.0, min_p None or 0. GRPOConfig's defaults (TRL's) leave
    every option off, so completions come from pi_theta itself, the very
    distribution the log-probs are computed for (at any `temperature`, the
    log-probs use it too); the other options (TRL's names) sample from
    something else, as they do in TRL.
    prompt_mask: (N, P) left-padded. As in `generate`, the penalty counts the
    prompt's tokens as already seen, but not its left padding.
    """
    warpers = LogitsProcessorList()
    if config.repetition_penalty != 1.0:
        left_padding = (prompt_mask == 0).sum(dim=1)  # (N,)
        penalty = float(config.repetition_penalty)  # transformers refuses an int
        warpers.append(RepetitionPenalty(penalty, left_padding))
    if config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k != 0:
        warpers.append(TopKLogitsWarper(config.top_k))
    if config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(config.top_p))
    if config.min_p:
        warpers.append(MinPLogitsWarper(config.min_p))
    return warpers


class RepetitionPenalty(LogitsProcessor):
    """CTRL's repetition penalty, as transformers 5 applies it, with each row's left padding not counted as text.

    Every token already in a row (its prompt and its completion so far) gets
    its score divided by `penalty` where the score is positive and multiplied
    by it where negative, so penalty > 1 makes repeating less likely. The
    padding in front of a shorter prompt is not text the model has seen: its
    positions are left out, as transformers 5's `generate` leaves them out
    (`RepetitionPenaltyLogitsProcessor(prompt_ignore_length=...)` with a tensor,
    which transformers 4.x lacks; minigrpo supports both).

    Symbol        | Shape  | Description
    --------------|--------|------------------------------------------------
    left_padding  | (N,)   | number of padding positions in front of each row
    input_ids     | (N, L) | the rows so far: left-padded prompt, then completion
    scores        | (N, V) | next-token scores
    """

    def __init__(self, penalty: float, left_padding: torch.Tensor):
        self.penalty = penalty
        self.left_padding = left_padding

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab_size = scores.shape[-1]
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (L,)
        is_padding = positions[None, :] < self.left_padding.to(input_ids.device)[:, None]  # (N, L)
        # Padding (and any id the head cannot produce) points at one extra column, dropped at the end.
        seen = input_ids.masked_fill(is_padding, vocab_size).clamp(max=vocab_size)  # (N, L)
        scores = torch.nn.functional.pad(scores, (0, 1))  # (N, V + 1)
        seen_scores = scores.gather(1, seen)  # (N, L)
        penalized = torch.where(seen_scores < 0, seen_scores * self.penalty, seen_scores / self.penalty)
        return scores.scatter(1, seen, penalized)[:, :vocab_size]  # (N, V)


class GroupSeededSampling(LogitsProcessor):
    """Samples the G rows of each group from that group's own torch.Generator, for a `generate` run greedily.

    The completions of group b then depend on its seed alone, not on which
    other groups share the batch: data-parallel ranks holding different groups
    sample exactly what one process holding them all would (minigrpo.run.distributed
    derives the seeds from the step and the group's index). At each step `warp`
    applies every sampling option of the config (sampling_warpers), a token is
    drawn from the softmax of the warped scores, then it gets score 0 and every
    other token -inf, so greedy decoding picks it.

    The draw is the exponential form of the Gumbel-max trick, the one
    torch.multinomial itself uses for a single sample: with q_v ~ Exp(1)
    independent, argmax_v p_v / q_v is token v with probability p_v. Drawing
    it ourselves lets one call per group fill the noise of many steps at once
    (NOISE_BLOCK_ELEMENTS), instead of one multinomial call per group per
    token; on the CPU the tokens are the very ones torch.multinomial(p, 1)
    would draw from the same generators (tests/test_rollout.py checks it).

    Symbol       | Shape     | Description
    -------------|-----------|------------------------------------------------
    prompt_mask  | (N, P)    | left-padded prompt mask, N = B * G rows, group-major
    group_seeds  | B ints    | one seed per group
    noise        | (k, N, V) | Exp(1) noise of the next k steps, group b's rows from group b's generator
    """

    NOISE_BLOCK_ELEMENTS = 2**22
    """At most this many noise values (16 MiB in fp32) are drawn ahead, and never past max_completion_length
    (each value costs time to draw); at least one step's are."""

    def __init__(self, config, prompt_mask: torch.Tensor, group_seeds: list[int], num_generations: int):
        if len(group_seeds) * num_generations != prompt_mask.shape[0]:
            raise ValueError(
                f"{len(group_seeds)} group seeds x num_generations={num_generations} != {prompt_mask.shape[0]} rows: "
                "pass one seed per group of G rows."
            )
        self.warpers = sampling_warpers(config, prompt_mask)
        self.generators = [torch.Generator(prompt_mask.device).manual_seed(int(seed)) for seed in group_seeds]
        self.num_generations = num_generations
        self.steps_left = config.max_completion_length  # generate makes at most this many sampling steps
        self.noise: list[torch.Tensor] = []  # the next steps' (N, V) noise, in order

    def warp(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(N, V) next-token scores -> (N, V) scores the tokens are sampled from."""
        return self.warpers(input_ids, scores)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = self.warp(input_ids, scores).float().softmax(dim=-1)  # (N, V)
        tokens = (probs / self.next_noise(probs)).argmax(dim=-1, keepdim=True)  # (N, 1): token v w.p. p_v
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens, 0.0)  # (N, V)

    def next_noise(self, probs: torch.Tensor) -> torch.Tensor:
        """This step's Exp(1) noise, (N, V) like probs: drawn k steps at a time, each group from its generator."""
        if not self.noise:
            N, V = probs.shape
            steps = max(1, min(self.steps_left, self.NOISE_BLOCK_ELEMENTS // (N * V)))
            self.steps_left -= steps
            G = self.num_generations
            # Group b's (steps, G, V) block uses its generator exactly as `steps` calls of multinomial on (G, V) would
            blocks = [probs.new_empty(steps, G, V).exponential_(generator=g) for g in self.generators]
            self.noise = list(torch.cat(blocks, dim=1).unbind(0))  # steps x (N, V), rows group-major
        return self.noise.pop(0)


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompt_ids,
    prompt_mask,
    config,
    greedy: bool = False,
    num_generations: int = 1,
    group_seeds: list[int] | None = None,
    max_new_tokens: int | None = None,
) -> torch.Tensor:
    """model.generate with the KV cache -> completion ids (n, T), T <= max_new_tokens (default
    config.max_completion_length).

    num_generations=G says the rows are G copies of each prompt (group-major);
    with config.share_prompt_prefix their prompt is then prefilled once per group.
    Sampling (greedy=False) always goes through GroupSeededSampling. group_seeds:
    one seed per group of G rows (the trainer derives them from seed, step and
    group index); None draws them from torch's global generator, so
    torch.manual_seed(s) before the call reproduces it. greedy=True ignores them.
    """
    if len(prompt_ids) % num_generations != 0:
        raise ValueError(f"{len(prompt_ids)} rows are not whole groups of num_generations={num_generations}.")
    was_training = model.training
    model.eval()
    with precision_context(prompt_ids.device, config.bf16):
        generation_config = generation_config_for(config, model, tokenizer, greedy, max_new_tokens)
        options = {}
        if GENERATE_HAS_USE_MODEL_DEFAULTS:
            options["use_model_defaults"] = False
        if not greedy:
            if group_seeds is None:
                group_seeds = torch.randint(0, 2**62, (len(prompt_ids) // num_generations,)).tolist()  # (B,)
            sampler = GroupSeededSampling(config, prompt_mask, group_seeds, num_generations)
            options["logits_processor"] = LogitsProcessorList([sampler])
        if shares_prompt_prefix(config, num_generations) and generation_config.cache_implementation is None:
            options[cache_argument(model)] = prefill_shared_prompts(model, prompt_ids, prompt_mask, num_generations)
        sequences = model.generate(
            input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config, **options
        )
    model.train(was_training)
    return sequences[:, prompt_ids.shape[1] :]  # (n, T)


def prefill_shared_prompts(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, num_generations: int):
    """The KV cache of every prompt token but the last, computed once per group and repeated G times
    (GRPOConfig.share_prompt_prefix).

    prompt_ids, prompt_mask: (n, P), rows b*G .. b*G+G-1 equal. `generate` then
    starts from this cache: it runs the last prompt token and samples the
    G completions of each group independently, as without the cache.
    """
    return prompt_cache_per_group(model, prompt_ids[:, :-1], prompt_mask[:, :-1], num_generations)[1]


def sample_completions(
    model,
    tokenizer,
    prompts: list,
    config,
    num_generations: int = 1,
    group_seeds: list[int] | None = None,
    tools: Sequence[Callable] | None = None,
    greedy: bool = False,
) -> Rollout:
    """B prompts -> the Rollout of their N = B * G completions: ids, masks and texts, no log-probs yet.

    Each prompt is rendered and tokenized once, then repeated G times (group-major). With tools, each completion
    is an episode (complete_episodes); greedy=True decodes greedily (evaluation), else each group samples from
    its seed."""
    device = next(model.parameters()).device
    G = num_generations
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, config.max_prompt_length, device, tools)
    prompt_ids, prompt_mask = (x.repeat_interleave(G, dim=0) for x in (prompt_ids, prompt_mask))  # (N, P)
    if tools and group_seeds is None and not greedy:  # the episodes' later turns derive their seeds from these
        group_seeds = torch.randint(0, 2**62, (len(prompt_ids) // G,)).tolist()  # as generate_completions draws
    completion_ids = generate_completions(
        model, tokenizer, prompt_ids, prompt_mask, config, greedy, num_generations=G, group_seeds=group_seeds
    )
    if tools:
        seeds = None if greedy else group_seeds
        return complete_episodes(model, tokenizer, prompt_ids, prompt_mask, completion_ids, config, tools, seeds, G)
    completion_mask, is_truncated = completion_mask_from_eos(completion_ids, eos_token_ids(model, tokenizer))
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        is_truncated=is_truncated,
        completions=[],
    )
    rollout.completions = tokenizer.batch_decode(rollout.completion_id_lists(), skip_special_tokens=True)
    return rollout


def complete_episodes(
    model,
    tokenizer,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    first_turns: torch.Tensor,
    config,
    tools: Sequence[Callable],
    group_seeds: list[int] | None,
    num_generations: int,
) -> Rollout:
    """The episodes that start with the sampled first turns (N, T0): tool calls run and later turns generated by
    tool_calling.run_episodes. A later turn of row r is sampled from its own seed, a hash of (its group's seed,
    r's place in the group, the turn), so a row's episode depends on its group's seed alone, as a first turn does.
    group_seeds None: greedy decoding (evaluation)."""
    eos_ids, pad_id = eos_token_ids(model, tokenizer), tokenizer.pad_token_id
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask, strict=True)]

    def generate_turns(contexts: list[list[int]], rows: list[int], turn: int) -> list[list[int]]:
        ids, mask = left_padded(contexts, pad_id, prompt_ids.device)  # (n, L)
        seeds = None if group_seeds is None else [turn_seed(group_seeds, row, num_generations, turn) for row in rows]
        used = [len(context) - len(prompts[row]) for context, row in zip(contexts, rows, strict=True)]
        longest = config.max_completion_length - min(used)  # the most any of them may still write
        new = generate_completions(
            model, tokenizer, ids, mask, config, greedy=seeds is None, group_seeds=seeds, max_new_tokens=longest
        )
        return token_lists(new, eos_ids)

    context = getattr(model.config, "max_position_embeddings", None)
    first = token_lists(first_turns, eos_ids)
    episodes = run_episodes(prompts, first, generate_turns, tokenizer, tools, config, context)
    return episode_rollout(episodes, prompt_ids, prompt_mask, eos_ids, pad_id, tokenizer)


def episode_rollout(episodes: Episodes, prompt_ids, prompt_mask, eos_ids: list[int], pad_id: int, tokenizer) -> Rollout:
    """The episodes' token lists as the Rollout's right-padded (N, T) tensors. An episode is truncated when its
    last turn has no EOS."""
    device = prompt_ids.device
    lengths = torch.tensor([len(ids) for ids in episodes.completion_ids], device=device)  # (N,)
    T = max(1, int(lengths.max()))
    completion_ids = right_padded(episodes.completion_ids, pad_id, T, device)  # (N, T)
    is_truncated = torch.tensor([not ids or ids[-1] not in eos_ids for ids in episodes.completion_ids], device=device)
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=(torch.arange(T, device=device) < lengths.unsqueeze(1)).long(),  # (N, T)
        is_truncated=is_truncated,
        completions=tokenizer.batch_decode(episodes.completion_ids, skip_special_tokens=True),
        tool_mask=right_padded(episodes.tool_mask, 0, T, device),  # (N, T)
        conversations=episodes.conversations,
        tool_calls=torch.tensor(episodes.tool_calls, device=device),
        tool_failures=torch.tensor(episodes.tool_failures, device=device),
    )


def token_lists(completion_ids: torch.Tensor, eos_ids: list[int]) -> list[list[int]]:
    """(n, T) generated ids -> n lists, each up to and including its first EOS (all T ids when it has none)."""
    lengths = completion_mask_from_eos(completion_ids, eos_ids)[0].sum(1).tolist()
    return [row[: int(n)] for row, n in zip(completion_ids.tolist(), lengths, strict=True)]


def left_padded(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> left-padded ids and attention mask, (n, L) each, L the longest."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in rows], device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=device)
    return ids, mask


def right_padded(rows: list[list[int]], fill: int, width: int, device) -> torch.Tensor:
    """Token lists -> (n, width), each row followed by `fill`."""
    return torch.tensor([row + [fill] * (width - len(row)) for row in rows], dtype=torch.long, device=device)


def turn_seed(group_seeds: list[int], row: int, num_generations: int, turn: int) -> int:
    """The seed of row `row`'s turn `turn` (1, 2, ...): a hash of its group's seed, its place in the group and the
    turn, so it does not depend on which other rows called a tool."""
    group, place = divmod(row, num_generations)
    digest = hashlib.sha256(f"{group_seeds[group]}/{place}/{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def sample_group_rollout(
    model,
    tokenizer,
    prompts: list,
    config,
    ref_model=None,
    group_seeds: list[int] | None = None,
    num_generations: int | None = None,
    with_old_logps: bool | None = None,
    tools: Sequence[Callable] | None = None,
) -> Rollout:
    """Stage 1 end to end: B prompts -> N = B * G completions with masks and log-probs.

    group_seeds: B seeds, one per group (see GroupSeededSampling); None draws
    them from torch's global generator (see generate_completions).
    num_generations: G, default config.num_generations (evaluation samples
    config.num_generations_eval).
    old log-probs are computed only when num_iterations > 1 (otherwise the
    current log-probs, detached, are pi_old exactly, and a forward pass is
    saved), or when with_old_logps=True (evaluation's loss reads them);
    reference log-probs only when beta > 0.
    tools: Python functions the model may call (TRL's tools=): each completion is then an episode
    (sample_completions).
    """
    device = next(model.parameters()).device
    G = config.num_generations if num_generations is None else num_generations
    rollout = sample_completions(model, tokenizer, prompts, config, G, group_seeds, tools)
    completion_ids = rollout.completion_ids
    input_ids, attention_mask, T = rollout.input_ids, rollout.attention_mask, completion_ids.shape[1]
    options = dict(
        batch_size=config.per_device_train_batch_size,
        temperature=config.temperature,
        chunk_size=config.logprob_chunk_size,
        num_generations=G if config.share_prompt_prefix else 1,
    )
    if with_old_logps is None:  # later steps are off-policy: the ratio needs pi_old
        with_old_logps = config.optimizer_steps_per_generation > 1
    with precision_context(device, config.bf16):
        if with_old_logps:
            rollout.old_per_token_logps = batched_per_token_logps(model, input_ids, attention_mask, T, **options)
        if config.beta != 0.0:
            rollout.ref_per_token_logps = batched_per_token_logps(ref_model, input_ids, attention_mask, T, **options)
    return rollout


@torch.no_grad()
def with_sampler_logps(rollout: Rollout, sampler_model, config) -> Rollout:
    """The rollout with `sampling_per_token_logps` (N, T): log pi_sampler of each completion token under
    `sampler_model`, the model that drew them when it is not the policy (say a bf16 copy, as a vLLM engine is a
    copy in its own kernels and precision). The loss then corrects for the difference when
    config.vllm_importance_sampling_correction is on (losses.sampler_importance_weights). Padding gets 0."""
    device = next(sampler_model.parameters()).device
    logps = batched_per_token_logps(
        sampler_model,
        rollout.input_ids.to(device),
        rollout.attention_mask.to(device),
        rollout.completion_ids.shape[1],
        batch_size=config.per_device_train_batch_size,
        temperature=config.temperature,
        chunk_size=config.logprob_chunk_size,
    )  # (N, T)
    rollout.sampling_per_token_logps = (logps.float() * rollout.completion_mask).to(rollout.completion_ids.device)
    return rollout

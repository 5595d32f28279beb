"""GRPO in one file: the whole algorithm minigrpo teaches, from a prompt to an updated policy.

    python examples/grpo_single_file.py --fast   # 3 small steps: a smoke test, under a minute on a laptop CPU
    python examples/grpo_single_file.py          # trains the bundled tiny Qwen as `python -m minigrpo train` does

Written the way cleanrl's ppo.py and nanoGPT's train.py are: the arguments in one dataclass, one small function per
equation, the loop on one screen. It computes what the package computes (tests/test_single_file.py checks its
advantages, loss, gradients and updated weights against minigrpo's, for every loss_type, on- and off-policy, with
and without the KL term), but it uses none of the package's algorithm: only the bundled tiny Qwen's loader and the
arithmetic task (its problems and reward functions). Copy it into your own project and change what you like.

Notation (lesson 00): B prompts per step, G completions per prompt, N = B * G completions, P prompt tokens,
T completion tokens, V vocabulary. Rows are group-major: row b * G + g is completion g of prompt b.

    each step                                                       the lesson (notebooks/)
    1. sample G completions per prompt; mask up to the first EOS    02_group_sampling, 02b_from_prompt_to_logprobs
    2. score each completion with the reward functions              02c_rewards_and_verifiers
    3. group-relative advantages                                    03_group_relative_advantages
    4. per-token log-probs; clipped surrogate minus beta * KL       02b_from_prompt_to_logprobs, 04_grpo_objective
    5. micro-batches, gradient clipping, AdamW, the schedule        06_train_qwen_on_arithmetic

The choices the package leaves to its config are fixed here to the tiny preset's (and the paper's): the group's mean
as the baseline, its Bessel-corrected std as the scale, the k3 KL not weighted by the ratio, one ratio per token,
no top-k / top-p. Lesson 07 shows the variants (Dr. GRPO, DAPO, GSPO, RLOO) as changes to those choices.

Completions here are single turns: a tool-calling episode changes no equation above, only which tokens the mask
counts, and its loop of parsing, tools and budgets would double this file (minigrpo/tool_calling.py has it).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

# The bundled tiny Qwen ("tiny"; a Hub id or a local folder loads through AutoModelForCausalLM) and the task:
# seeded arithmetic problems with held-out test problems, and the two rule-based rewards.
from minigrpo.models import load_model_and_tokenizer
from minigrpo.tasks.arithmetic import REWARD_WEIGHTS, correctness_reward, format_reward, make_arithmetic_dataset

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass
class Args:
    """Every value is GRPOConfig.tiny_cpu()'s (minigrpo/config.py: TINY_CPU on top of DEEPSEEKMATH_ALGORITHM), the
    default of `python -m minigrpo train`; the data sizes are that command's (minigrpo/__main__.py)."""

    model: str = "tiny"  # the bundled tiny Qwen (0.26M parameters, byte-level Qwen2 tokenizer), or a Hub id / folder
    seed: int = 0  # the prompt order, the sampling and the training data
    train_size: int = 2000  # training problems (make_arithmetic_dataset(..., "train", seed))
    eval_size: int = 200  # held-out problems (make_arithmetic_dataset(..., "test", seed=0)), scored greedily
    # --- the group (stage 1)
    prompts_per_step: int = 16  # B
    num_generations: int = 8  # G, completions per prompt (DeepSeekMath: 64)
    per_device_train_batch_size: int = 128  # completions per micro-batch in the update (memory only)
    max_prompt_length: int = 96  # a longer prompt is an error
    max_completion_length: int = 24  # T_max, new tokens per completion; also Dr. GRPO's constant normaliser
    temperature: float = 1.0  # sampling temperature; the log-probs are computed at the same temperature
    # --- advantages (stage 3)
    advantage_epsilon: float = 1e-4  # eps in (r - mean) / (std + eps)
    # --- the objective (stage 4)
    beta: float = 0.04  # KL coefficient (DeepSeekMath 0.04); 0 drops the KL term and the reference model
    epsilon: float = 0.2  # the ratio is clipped below at 1 - epsilon
    epsilon_high: float = 0.2  # ... and above at 1 + epsilon_high (DAPO's clip-higher: 0.28)
    loss_type: str = "grpo"  # how per-token losses are averaged: grpo | bnpo | dr_grpo | dapo (see aggregate)
    num_iterations: int = 1  # mu, optimizer steps per rollout; 1 = on-policy (ratio 1 in value)
    # --- the optimizer and its schedule (stage 5)
    learning_rate: float = 3e-4  # a 0.26M-parameter model takes far larger steps than a 0.5B one (1e-6)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # clip the global gradient norm to this (0: no clipping)
    warmup_steps: int = 0  # linear warm-up of the learning rate
    lr_scheduler_type: str = "linear"  # after warm-up: "linear" or "cosine" decay to 0 at max_steps, or "constant"
    max_steps: int = 200  # optimizer steps
    # --- evaluation
    eval_steps: int = 25  # greedy held-out accuracy every this many steps and at the end (0: only at the end)
    eval_batch_size: int = 256  # prompts per greedy `generate` call

    def __post_init__(self) -> None:
        N, micro = self.prompts_per_step * self.num_generations, self.per_device_train_batch_size
        if self.num_generations < 2:
            raise ValueError(f"num_generations={self.num_generations}: a group needs at least 2 completions.")
        if micro < N and N % micro != 0:
            raise ValueError(
                f"per_device_train_batch_size={micro} does not divide N = {self.prompts_per_step} x "
                f"{self.num_generations} = {N} completions into equal micro-batches: choose a divisor of {N}."
            )
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r}: choose one of {', '.join(LOSS_TYPES)}.")
        if self.lr_scheduler_type not in ("linear", "cosine", "constant"):
            raise ValueError(f"lr_scheduler_type={self.lr_scheduler_type!r}: choose 'linear', 'cosine' or 'constant'.")


FAST = dict(max_steps=3, prompts_per_step=4, num_generations=4, per_device_train_batch_size=8, train_size=64,
            eval_size=32, eval_steps=0)  # fmt: skip
"""--fast: 3 steps of 4 prompts x G=4 in two micro-batches of 8, 32 held-out problems: every stage runs, too few
steps to learn anything."""


@dataclass
class Rollout:
    """One step's completions and what the loss needs about them (lesson 02b).

    prompt_ids, prompt_mask           (N, P) left-padded: every prompt ends where its completion starts
    completion_ids, completion_mask   (N, T) right-padded; the mask is 1 up to and including the first EOS
    old_logps                         (N, T) log pi_old, or None when num_iterations == 1 (then pi_old = pi_theta)
    ref_logps                         (N, T) log pi_ref, or None when beta == 0
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    old_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None


# --- stage 1: group sampling (lessons 02, 02b) -------------------------------------------------------------------
def tokenize_prompts(tokenizer, prompts: list, max_prompt_length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Chat messages -> left-padded prompt ids and mask, (n, P), through the model's own chat template."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    if encoded["input_ids"].shape[1] > max_prompt_length:
        raise ValueError(
            f"a prompt is {encoded['input_ids'].shape[1]} tokens long, more than max_prompt_length="
            f"{max_prompt_length}: raise max_prompt_length or shorten the prompts."
        )
    return encoded["input_ids"].to(device), encoded["attention_mask"].to(device)


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the model's generation EOS ids (Qwen: <|im_end|>, <|endoftext|>) and the
    tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


@torch.no_grad()
def generate(model, tokenizer, prompt_ids, prompt_mask, args: Args, greedy: bool = False) -> torch.Tensor:
    """(n, P) prompts -> (n, T) completion ids, T <= max_completion_length: sampled at `temperature` from the whole
    distribution (the policy gradient assumes samples of pi_theta itself), or greedy for evaluation. The
    GenerationConfig is built from scratch, every sampling option set: a real Qwen's own would sample with top_k=20
    and top_p=0.8, from a distribution that is not the one the log-probs are computed for."""
    sampling = {} if greedy else dict(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)
    config = GenerationConfig(
        **sampling,
        max_new_tokens=args.max_completion_length,
        eos_token_id=eos_token_ids(model, tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config)
    return sequences[:, prompt_ids.shape[1] :]  # (n, T): generate returns prompt + completion


def completion_mask(completion_ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """(N, T) ids -> (N, T) mask, 1 up to and including the first EOS. The EOS counts (the model must learn to stop),
    the padding after it does not; a completion with no EOS was cut at max_completion_length and keeps every token."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # (N, T)
    T = completion_ids.shape[1]
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), T)  # (N,): T when there is none
    positions = torch.arange(T, device=completion_ids.device)  # (T,)
    return (positions[None, :] <= first_eos[:, None]).long()  # (N, T)


def decode(tokenizer, completion_ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """(N, T) ids -> N texts: each completion's counted tokens (up to its first EOS), special tokens dropped."""
    lengths = mask.sum(dim=1).tolist()
    rows = [ids[:n] for ids, n in zip(completion_ids.tolist(), lengths, strict=True)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


# --- stage 2: rewards (lesson 02c) --------------------------------------------------------------------------------
def score(completions: list[str], answers: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """N completion texts -> rewards (N,) = 1.0 * correct + 0.1 * well-formed (REWARD_WEIGHTS), and correct (N,).
    The reward functions have TRL's signature f(prompts, completions, completion_ids, **columns)."""
    correct = torch.tensor(correctness_reward(None, completions, answer=answers))  # (N,)
    well_formed = torch.tensor(format_reward(None, completions))  # (N,)
    return REWARD_WEIGHTS[0] * correct + REWARD_WEIGHTS[1] * well_formed, correct


# --- stage 3: group-relative advantages (lesson 03) ---------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, num_generations: int, eps: float) -> torch.Tensor:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group (DeepSeekMath, section 4.1.2). (N,) -> (N,).

    Each completion is compared with its G - 1 siblings: the group is the critic. std is Bessel-corrected (ddof=1:
    torch's default and TRL's; numpy.std's default is ddof=0). A group whose rewards are all equal gets exactly 0,
    not the rounding noise of r - mean(r) divided by eps: it has nothing to teach.
    """
    grouped = rewards.view(-1, num_generations)  # (B, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (B, G)
    advantages = centred / (grouped.std(dim=1, keepdim=True) + eps)  # (B, G)
    all_equal = (grouped.max(dim=1).values == grouped.min(dim=1).values)[:, None]  # (B, 1)
    return torch.where(all_equal, 0.0, advantages).flatten()  # (N,), every token of o_i gets A_i


# --- stage 4: per-token log-probs and the GRPO loss (lessons 02b, 04) --------------------------------------------
def per_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float):
    """log pi(o_t | q, o_<t) for every completion token, (n, T), with gradients when grad is enabled.

    The shift: the output at position j predicts token j + 1, so completion token t (at position P + t) is scored
    by the logits at position P + t - 1. The T + 1 last positions' logits are kept and the last one, which predicts
    the token after the completion, is dropped. Off by one, the loss still goes down, on the wrong tokens.
    Position ids count real tokens only (left padding skipped), as `generate` counts them; the logits are divided
    by the sampling temperature, so these are the log-probs of the distribution the tokens were drawn from.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (n, P + T)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (n, P + T)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # (n, P + T)
    T = completion_ids.shape[1]
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=T + 1
    ).logits[:, :-1]  # (n, T, V): row t predicts completion token t
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (n, T, V)
    return log_probs.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (n, T)


def rows_logps(model, rollout: Rollout, rows: slice, args: Args) -> torch.Tensor:
    """per_token_logps of the rollout's completions in `rows` (a micro-batch), (n, T)."""
    return per_token_logps(
        model,
        rollout.prompt_ids[rows],
        rollout.prompt_mask[rows],
        rollout.completion_ids[rows],
        rollout.completion_mask[rows],
        args.temperature,
    )


def row_slices(N: int, size: int) -> list[slice]:
    """N rows in micro-batches of `size` rows (the last one may be smaller)."""
    return [slice(start, start + size) for start in range(0, N, size)]


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(n, T) -> (n,): the sum over each row's counted tokens. torch.where, not values * mask: a padding position's
    inf (an overflowing KL) times 0 would be NaN."""
    return torch.where(mask.bool(), values, 0.0).sum(dim=1)  # (n,)


def aggregate(per_token_loss, mask, loss_type: str, max_completion_length: int, step_tokens: int) -> torch.Tensor:
    """(n, T) per-token losses -> one number. The loss types differ only in what the token sums are divided by:

    grpo     mean_i (1/|o_i|) sum_t l_it       DeepSeekMath eq. 3: a token of a short answer weighs more
    bnpo     sum_it l_it / sum_it m_it         the tokens of this micro-batch
    dapo     sum_it l_it / step_tokens         the tokens of the whole optimizer step (DAPO, section 3.3)
    dr_grpo  sum_it l_it / (n * T_max)         a constant (Dr. GRPO): no length bias at all
    """
    token_sums = masked_sum(per_token_loss, mask)  # (n,)
    if loss_type == "grpo":
        return (token_sums / mask.sum(dim=1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return token_sums.sum() / mask.sum().clamp(min=1)
    if loss_type == "dapo":
        return token_sums.sum() / max(step_tokens, 1)
    return token_sums.sum() / (len(mask) * max_completion_length)  # dr_grpo


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, args: Args, step_tokens: int) -> torch.Tensor:
    """-J for one micro-batch of n completions, DeepSeekMath eq. 3 (to be minimised):

        J = agg_it [ min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i) - beta KL_it ]
        rho_it = pi_theta / pi_old = exp(logps - old_logps)                 the ratio
        KL_it  = pi_ref / pi_theta - log(pi_ref / pi_theta) - 1             k3, eq. 4 (always >= 0)

    logps (n, T) with gradients; old_logps, ref_logps (n, T) or None; advantages (n,); mask (n, T).
    On-policy (old_logps None) pi_old is pi_theta detached: rho is 1 in value, so the loss reads about 0, but its
    gradient is A grad log pi, REINFORCE's (lesson 04, section 5). The min makes the surrogate pessimistic: once a
    token's probability has moved epsilon past pi_old in the direction A asks for, its gradient is 0.
    """
    if old_logps is None:
        old_logps = logps.detach()
    ratio = torch.exp(logps - old_logps)  # (n, T)
    A = advantages[:, None]  # (n, 1)
    surrogate = torch.min(ratio * A, torch.clamp(ratio, 1 - args.epsilon, 1 + args.epsilon_high) * A)  # (n, T)
    per_token_loss = -surrogate  # (n, T)
    if args.beta != 0.0:
        log_r = ref_logps - logps  # (n, T): log pi_ref / pi_theta
        per_token_loss = per_token_loss + args.beta * (torch.exp(log_r) - log_r - 1)  # (n, T)
    return aggregate(per_token_loss, mask, args.loss_type, args.max_completion_length, step_tokens)


# --- stage 5: the update (lesson 06) ------------------------------------------------------------------------------
def lr_at(step: int, args: Args) -> float:
    """The learning rate of optimizer step `step` (0, 1, ...), as transformers' schedules compute it: step / W of
    the rate during W warm-up steps, then the rate, or a decay to 0 at max_steps: "linear" a straight line, "cosine"
    half a cosine wave."""
    if step < args.warmup_steps:
        return args.learning_rate * step / args.warmup_steps
    if args.lr_scheduler_type == "linear":
        return args.learning_rate * max(0.0, (args.max_steps - step) / max(1, args.max_steps - args.warmup_steps))
    if args.lr_scheduler_type == "cosine":
        progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)  # 0 -> 1 through the decay
        return args.learning_rate * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return args.learning_rate


def make_optimizer(model, args: Args) -> torch.optim.AdamW:
    """AdamW over every weight of the policy (the reference model is a separate, frozen copy)."""
    betas = (args.adam_beta1, args.adam_beta2)
    return torch.optim.AdamW(model.parameters(), args.learning_rate, betas=betas, weight_decay=args.weight_decay)


def grpo_update(model, optimizer, rollout: Rollout, advantages: torch.Tensor, args: Args) -> tuple[float, float]:
    """One optimizer step on the whole rollout, in micro-batches whose gradients add up. Returns (loss, grad norm).

    The scaling makes the accumulated gradient that of one batch of all N completions: grpo, bnpo and dr_grpo
    are means over a micro-batch, so each of the M equal micro-batches counts 1/M; dapo already divides every
    micro-batch by the tokens of the whole step, so its micro-batch losses simply add up.
    """
    micro_batches = row_slices(len(advantages), args.per_device_train_batch_size)
    step_tokens = int(rollout.completion_mask.sum())  # dapo's normaliser
    scale = 1.0 if args.loss_type == "dapo" else 1.0 / len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    step_loss = 0.0
    for rows in micro_batches:
        logps = rows_logps(model, rollout, rows, args)  # (n, T)
        old = None if rollout.old_logps is None else rollout.old_logps[rows]
        ref = None if rollout.ref_logps is None else rollout.ref_logps[rows]
        loss = scale * grpo_loss(logps, old, ref, advantages[rows], rollout.completion_mask[rows], args, step_tokens)
        loss.backward()  # the gradients of the micro-batches add up in .grad
        step_loss += loss.item()
    max_norm = args.max_grad_norm if args.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()  # the norm before clipping
    if not math.isfinite(grad_norm):
        raise FloatingPointError(f"the gradient norm is {grad_norm}: the update was not applied; lower learning_rate.")
    optimizer.step()
    return step_loss, grad_norm


# --- the loop -----------------------------------------------------------------------------------------------------
@torch.no_grad()
def batched_logps(model, rollout: Rollout, args: Args) -> torch.Tensor:
    """log-probs (N, T) of the rollout's completions under `model` (pi_old or pi_ref), without gradients."""
    rows = row_slices(len(rollout.completion_ids), args.per_device_train_batch_size)
    return torch.cat([rows_logps(model, rollout, part, args) for part in rows])  # (N, T)


def collect_rollout(model, ref_model, tokenizer, batch: dict, args: Args) -> tuple[Rollout, torch.Tensor, float]:
    """Stages 1 and 2 for B prompts: N = B * G completions, their masks and log-probs, rewards (N,), accuracy."""
    G = args.num_generations
    prompts = [p for p in batch["prompt"] for _ in range(G)]  # each prompt G times, group-major
    answers = [a for a in batch["answer"] for _ in range(G)]
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, args.max_prompt_length, model.device)
    completion_ids = generate(model, tokenizer, prompt_ids, prompt_mask, args)  # (N, T)
    mask = completion_mask(completion_ids, eos_token_ids(model, tokenizer))  # (N, T)
    rollout = Rollout(prompt_ids, prompt_mask, completion_ids, mask)
    rewards, correct = score(decode(tokenizer, completion_ids, mask), answers)
    if args.num_iterations > 1:  # later passes are off-policy: the ratio needs pi_old, fixed now
        rollout.old_logps = batched_logps(model, rollout, args)
    if args.beta != 0.0:
        rollout.ref_logps = batched_logps(ref_model, rollout, args)
    return rollout, rewards.to(model.device), correct.mean().item()


def evaluate(model, tokenizer, dataset, args: Args) -> float:
    """Greedy accuracy on held-out problems: the fraction whose greedy completion gives the right answer."""
    correct = []
    for start in range(0, len(dataset), args.eval_batch_size):
        batch = dataset[start : start + args.eval_batch_size]
        prompt_ids, prompt_mask = tokenize_prompts(tokenizer, batch["prompt"], args.max_prompt_length, model.device)
        completion_ids = generate(model, tokenizer, prompt_ids, prompt_mask, args, greedy=True)  # (n, T)
        mask = completion_mask(completion_ids, eos_token_ids(model, tokenizer))  # (n, T)
        correct += correctness_reward(None, decode(tokenizer, completion_ids, mask), answer=batch["answer"])
    return sum(correct) / len(correct)


def prompt_batches(num_prompts: int, batch_size: int, seed: int):
    """Endless batches of dataset indices: a fresh seeded permutation of the prompts each epoch."""
    order, epoch = [], 0
    while True:
        while len(order) < batch_size:
            generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
            order += torch.randperm(num_prompts, generator=generator).tolist()
            epoch += 1
        yield order[:batch_size]
        order = order[batch_size:]


def train(args: Args) -> dict:
    """Train with GRPO; print a line per step and the held-out accuracy. Returns the accuracies and the steps' logs."""
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model_and_tokenizer(args.model, device)
    # pi_ref: a frozen copy of the starting policy, that the KL term keeps pi_theta near (not needed when beta = 0)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if args.beta != 0.0 else None
    train_data = make_arithmetic_dataset(args.train_size, "train", seed=args.seed)
    eval_data = make_arithmetic_dataset(args.eval_size, "test", seed=0)
    optimizer = make_optimizer(model, args)
    accuracy_before = evaluate(model, tokenizer, eval_data, args)
    print(f"{args.model}: {args.max_steps} steps of {args.prompts_per_step} prompts x G={args.num_generations} on "
          f"{device}; held-out accuracy {accuracy_before:.3f}")  # fmt: skip
    batches = prompt_batches(len(train_data), args.prompts_per_step, args.seed)
    step, history, accuracy = 0, [], None
    while step < args.max_steps:
        started = time.perf_counter()
        rollout, rewards, train_accuracy = collect_rollout(model, ref_model, tokenizer, train_data[next(batches)], args)
        advantages = group_advantages(rewards, args.num_generations, args.advantage_epsilon)  # (N,)
        for _ in range(args.num_iterations):  # mu optimizer steps on this rollout; pi_old stays the sampling policy
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, args)
            loss, grad_norm = grpo_update(model, optimizer, rollout, advantages, args)
            step += 1
        log = dict(step=step, reward=rewards.mean().item(), accuracy=train_accuracy, loss=loss, grad_norm=grad_norm,
                   lr=lr_at(step - 1, args), seconds=time.perf_counter() - started)  # fmt: skip
        due = args.eval_steps > 0 and step // args.eval_steps > (step - args.num_iterations) // args.eval_steps
        if due or step >= args.max_steps:
            log["eval_accuracy"] = accuracy = evaluate(model, tokenizer, eval_data, args)
        history.append(log)
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in log.items()))
    print(f"accuracy before: {accuracy_before:.3f} after: {accuracy:.3f}")
    return {"accuracy_before": accuracy_before, "accuracy_after": accuracy, "history": history}


def parse_args(argv: list[str] | None = None) -> Args:
    """--fast, and one --flag per Args field (--learning-rate 1e-4, --loss-type dapo, ...)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="3 small steps and 32 held-out problems: a smoke test")
    for field in dataclasses.fields(Args):
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=argparse.SUPPRESS)
    options = vars(parser.parse_args(argv))
    fast = options.pop("fast")
    return Args(**{**(FAST if fast else {}), **options})


if __name__ == "__main__":
    train(parse_args())

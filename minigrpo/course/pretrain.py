"""Make the bundled tiny Qwen: a short supervised fine-tune on arithmetic.

    python -m minigrpo pretrain-tiny

A randomly initialised model knows nothing, and RL cannot learn from a group
whose rewards are all 0. Instruct models arrive partly competent; this script
gives the tiny model the same starting point: it learns the answer format and
gets some sums right (it stops at the first check at or above 30% held-out accuracy), leaving room
for GRPO to improve it. Seeded and deterministic on the CPU: the same command
reproduces the checkpoint shipped in minigrpo/assets/tiny-qwen.

`build_sft_batch` is the general piece (any prompts and completions, any
tokenizer): the supervised fine-tuning batch with its masks, shifted by one.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from minigrpo.config import GRPOConfig
from minigrpo.models import TINY_MODEL_DIR, build_tiny_model, build_tiny_tokenizer, count_parameters
from minigrpo.rollout import render_prompts
from minigrpo.run.evaluation import evaluate_model
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset
from minigrpo.tokenization import save_tokenizer


def build_sft_batch(
    prompts: list[str], completions: list[str], tokenizer, extra_pad_columns: int = 0
) -> dict[str, torch.Tensor]:
    """A next-token batch for supervised fine-tuning: learn the completion, given the prompt.

    Each prompt and its completion are tokenized *separately* and concatenated, so
    the boundary is exactly where a rollout puts it (tokenizing the joined text could
    merge the last prompt characters with the first completion characters into one
    token). The rows are right-padded with the pad token to the longest row (plus
    `extra_pad_columns`), L tokens wide, then shifted by one: position t reads token
    t and is trained to predict token t + 1.

    Symbol          | Shape      | Description
    ----------------|------------|----------------------------------------------------------
    prompts         | n strings  | the prompt texts, already rendered (chat template applied)
    completions     | n strings  | the target texts; end them with the EOS token to teach stopping
    input_ids       | (n, L - 1) | long: every row but its last token (what the model reads)
    labels          | (n, L - 1) | long: every row but its first token (what it should predict)
    response_mask   | (n, L - 1) | bool: True where labels holds a completion token (its EOS
                    |            | included), False on prompt tokens and padding
    attention_mask  | (n, L - 1) | long: 1 on the real tokens of input_ids, 0 on padding

    The loss is the cross-entropy of labels where response_mask is True; the
    prompt is context, not a target. The attention mask comes from the lengths,
    never from `input_ids != pad`: many tokenizers use the EOS as their pad token.
    `extra_pad_columns` > 0 pads every row further (pretrain-tiny uses 1: see there).
    """
    if isinstance(prompts, str) or isinstance(completions, str):
        raise TypeError("prompts and completions must be lists of strings (one per row), not a single string.")
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions: give one completion per prompt.")
    if extra_pad_columns < 0:
        raise ValueError(f"extra_pad_columns={extra_pad_columns}: give 0 (the default) or more.")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token: set tokenizer.pad_token (Qwen's is <|endoftext|>).")
    rows, completion_flags = [], []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        if not prompt_ids:
            raise ValueError(
                f"prompt {i} is empty: the first completion token would have no token to be predicted from."
            )
        rows.append(prompt_ids + completion_ids)
        completion_flags.append([False] * len(prompt_ids) + [True] * len(completion_ids))
    width = max(map(len, rows)) + extra_pad_columns  # L
    lengths = torch.tensor([len(row) for row in rows])  # (n,)
    token_ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])  # (n, L)
    is_completion = torch.tensor([flags + [False] * (width - len(flags)) for flags in completion_flags])  # (n, L)
    is_real = torch.arange(width) < lengths.unsqueeze(1)  # (n, L)
    return {
        "input_ids": token_ids[:, :-1],  # (n, L - 1)
        "labels": token_ids[:, 1:],  # (n, L - 1)
        "response_mask": is_completion[:, 1:],  # (n, L - 1)
        "attention_mask": is_real[:, :-1].long(),  # (n, L - 1)
    }


def sft_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the completion tokens: -mean log pi(label | tokens before it), over response_mask."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (n, L - 1, V)
    targets = batch["labels"].masked_fill(~batch["response_mask"], -100)  # (n, L - 1); -100 is ignored
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def arithmetic_sft_batch(tokenizer, prompts: list, answers: list[str]) -> dict[str, torch.Tensor]:
    """The warm-up's rows: the chat-rendered problem, then '<answer>N</answer><|im_end|>'.

    One extra pad column makes input_ids the whole rows, (n, longest row): the model
    reads the same ids, and the loss covers the same positions, as with transformers'
    `labels=` loss (which pads its labels by one and shifts them), the way the bundled
    checkpoint was trained. Without it the predictions would be the same but summed
    over one column fewer, in a different order, and the weights would differ in
    their last bits: this script would no longer reproduce the checkpoint exactly.
    """
    completions = [f"<answer>{answer}</answer>{tokenizer.eos_token}" for answer in answers]
    return build_sft_batch(render_prompts(tokenizer, prompts), completions, tokenizer, extra_pad_columns=1)


def pretrain_tiny(
    output_dir: str | Path = TINY_MODEL_DIR,
    max_steps: int = 1500,
    target_accuracy: float = 0.3,
    eval_every: int = 25,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    warmup_steps: int = 100,
    seed: int = 0,
) -> dict:
    """Build the tiny Qwen, fine-tune it on sums until held-out accuracy first reaches
    `target_accuracy` (checked every `eval_every` steps), save it, return its metrics.

    Stopping early is the point: GRPO needs a model that is right sometimes, not always.
    """
    torch.manual_seed(seed)
    random.seed(seed)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed)
    train = make_arithmetic_dataset(n=max_steps * batch_size, split="train", seed=seed + 1000)
    test = make_arithmetic_dataset(n=200, split="test", seed=seed)
    eval_config = GRPOConfig.tiny_cpu()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))
    print(
        f"tiny Qwen: {count_parameters(model):,} parameters; SFT on batches of {batch_size} sums "
        f"until held-out accuracy >= {target_accuracy}"
    )
    started = time.perf_counter()
    metrics = {"eval_accuracy": 0.0}
    for step in range(max_steps):
        model.train()
        rows = train[step * batch_size : (step + 1) * batch_size]
        loss = sft_loss(model, arithmetic_sft_batch(tokenizer, rows["prompt"], rows["answer"]))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % eval_every == 0:
            model.eval()
            metrics = evaluate_model(model, tokenizer, test, [correctness_reward], eval_config)
            print(
                f"step {step + 1:4d}  loss {loss.item():.3f}  held-out accuracy {metrics['eval_accuracy']:.3f}"
                f"  ({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
            if metrics["eval_accuracy"] >= target_accuracy:
                break
    model.eval()
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    save_tokenizer(tokenizer, output_dir)  # readable by transformers 4 and 5 alike
    print(f"held-out accuracy {metrics['eval_accuracy']:.3f} after {step + 1} steps; saved to {output_dir}")
    return metrics

"""Make the bundled tiny Qwen: a short supervised fine-tune on arithmetic.

    python -m minigrpo pretrain-tiny

A randomly initialised model knows nothing, and RL cannot learn from a group
whose rewards are all 0. Instruct models arrive partly competent; this script
gives the tiny model the same starting point: it learns the answer format and
gets some sums right (it stops at the first check at or above 30% held-out accuracy), leaving room
for GRPO to improve it. Seeded and deterministic on the CPU: the same command
reproduces the checkpoint shipped in minigrpo/assets/tiny-qwen.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from minigrpo.config import GRPOConfig
from minigrpo.evaluation import evaluate_model
from minigrpo.models import TINY_MODEL_DIR, build_tiny_model, build_tiny_tokenizer, count_parameters
from minigrpo.rollout import render_prompts
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset


def sft_batch(tokenizer, prompts: list, answers: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + '<answer>N</answer><|im_end|>', right-padded; labels are -100 except on the answer."""
    rows, label_rows = [], []
    for prompt_text, answer in zip(render_prompts(tokenizer, prompts), answers, strict=True):
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        target_ids = tokenizer(f"<answer>{answer}</answer>{tokenizer.eos_token}", add_special_tokens=False)["input_ids"]
        rows.append(prompt_ids + target_ids)
        label_rows.append([-100] * len(prompt_ids) + target_ids)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (n, L)
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in label_rows])  # (n, L)
    attention_mask = (torch.arange(width) < torch.tensor([len(r) for r in rows]).unsqueeze(1)).long()  # (n, L)
    return input_ids, attention_mask, labels


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
    metrics = {"eval/accuracy": 0.0}
    for step in range(max_steps):
        model.train()
        rows = train[step * batch_size : (step + 1) * batch_size]
        input_ids, attention_mask, labels = sft_batch(tokenizer, rows["prompt"], rows["answer"])
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % eval_every == 0:
            model.eval()
            metrics = evaluate_model(model, tokenizer, test, [correctness_reward], eval_config)
            print(
                f"step {step + 1:4d}  loss {loss.item():.3f}  held-out accuracy {metrics['eval/accuracy']:.3f}"
                f"  ({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
            if metrics["eval/accuracy"] >= target_accuracy:
                break
    model.eval()
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    print(f"held-out accuracy {metrics['eval/accuracy']:.3f} after {step + 1} steps; saved to {output_dir}")
    return metrics

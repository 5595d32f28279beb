"""Peak memory of one GRPO step, split into weights, gradients, optimizer state and activations.

    python bench/memory.py --model qwen0.5b-shape --preset t4       # does GRPOConfig.qwen_t4() fit a T4?
    python bench/memory.py --model qwen0.5b-shape --preset default  # GRPOConfig() defaults, the default GPU config
    python bench/memory.py --model tiny --preset tiny               # seconds, on the CPU
    python bench/memory.py --quick                                  # the same, one thread: the smoke test
    python bench/memory.py --model qwen0.5b-shape --preset t4 --lora          # the same with LoRA (r=16)
    python bench/memory.py --model qwen1.5b-shape --preset lora-t4 --lora     # GRPOConfig.qwen1_5b_lora_t4()

On a GPU with native bf16 (A100, H100) add --fp32 to measure a T4's precision (the preset with bf16=False: fp32,
no autocast, an fp32 reference copy): the T4 figures in minutes instead of an hour of CPU.

LoRA (--lora, --lora-rank): adapters of rank r on q, k, v, o, gate, up and down (minigrpo.models.lora_config,
TRL's and Unsloth's usual targets); only they have gradients and AdamW state, and the reference
log-probs come from the same model with the adapters off, so there is no reference copy.

The step is the trainer's own: rollout (generation), reference log-probs, then the update (policy
forward + backward per micro-batch, gradient clipping, AdamW step). The model is Qwen2.5-0.5B's shape
with random weights and the real Qwen2.5 tokenizer (built offline, `minigrpo.tokenization.qwen25_tokenizer`),
so no Hub access is needed; prompts are the arithmetic task's, rendered with Qwen's chat template.

Worst case, on purpose: every completion is forced to max_completion_length (min_new_tokens), so
sequences, the KV cache and activations are as long as the preset allows.

Only the first micro-batches of the update (--update-micro-batches, default 1), then the optimizer
step: every micro-batch has the same size and gradients accumulate in place, so the update's peak is
reached within its first micro-batch (or at the optimizer step, which is measured); the others only
repeat it. This keeps a 0.5B step within minutes on a CPU. Pass --update-micro-batches 0 for all.

How bytes are counted: live tensor storages (minigrpo.measuring.memory.TensorMemoryTracker), on the CPU and the
GPU alike; on CUDA torch.cuda.max_memory_allocated is printed beside it. On the CPU AdamW is switched
to its foreach implementation, the CUDA default, whose temporaries (a parameter-sized sqrt of the
second moment) count at the optimizer step as they would on a GPU. Not counted: the CUDA context and
the caching allocator's reserve (add ~0.5-1 GiB on a real GPU), kernels' internal scratch buffers.

The last line printed is one JSON summary, in bytes (its keys are in docs/performance.md; tests/test_bench.py runs
--quick).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2ForCausalLM

from minigrpo.config import GRPOConfig
from minigrpo.measuring.measure import QWEN_SHAPE, qwen_shape_config
from minigrpo.measuring.memory import (
    TensorMemoryTracker,
    format_bytes,
    gradients,
    optimizer_state,
    peak_breakdown,
    storage_bytes,
)
from minigrpo.models import load_model_and_tokenizer, lora_config, set_gradient_checkpointing
from minigrpo.tasks.arithmetic import REWARD_WEIGHTS, correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.tokenization import qwen25_tokenizer

PRESETS = {
    "t4": GRPOConfig.qwen_t4,
    "lora-t4": GRPOConfig.qwen1_5b_lora_t4,
    "default": GRPOConfig,  # the bare defaults: TRL's
    "tiny": GRPOConfig.tiny_cpu,
}
QWEN_1_5B_SHAPE = "qwen1.5b-shape"
# Qwen2.5-1.5B-Instruct's config.json where it differs from 0.5B's (1.54B parameters, embeddings tied).
QWEN_SHAPES = {
    QWEN_SHAPE: {},
    QWEN_1_5B_SHAPE: dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
    ),
}


def qwen_shape_model(tokenizer, device, shape: str = QWEN_SHAPE) -> Qwen2ForCausalLM:
    """Qwen2.5-0.5B- or 1.5B-Instruct's architecture (494M / 1.54B parameters) with random weights, fp32."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = qwen_shape_config(
        eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **QWEN_SHAPES[shape]
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id)
    return model.to(device)


def full_length_generate(generate, length: int, *args, generation_config=None, **kwargs):
    """`generate` with min_new_tokens=length: the worst case, every completion as long as the preset allows."""
    generation_config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    generation_config.min_new_tokens = length
    return generate(*args, generation_config=generation_config, **kwargs)


def build(
    model_name: str,
    preset: str,
    device: torch.device,
    output_dir: str,
    tokenizer_cache: str | None,
    lora_rank: int | None = None,
    fp32: bool = False,
):
    """The trainer of one measured step: the model, the preset (1 step, no eval, no checkpoints), the data.
    lora_rank: LoRA adapters of this rank (lora_config's targets), or None for full fine-tuning.
    fp32: bf16=False, a T4's precision wherever it runs."""
    from minigrpo import GRPOTrainer

    if model_name in QWEN_SHAPES:
        tokenizer = qwen25_tokenizer(tokenizer_cache)
        model = qwen_shape_model(tokenizer, device, model_name)
    else:
        model, tokenizer = load_model_and_tokenizer(model_name, device)
    config = PRESETS[preset](max_steps=1, eval_steps=0, save_steps=0, output_dir=output_dir)
    config = config.replace(reward_weights=list(REWARD_WEIGHTS), **({"bf16": False} if fp32 else {}))
    model.generate = functools.partial(full_length_generate, model.generate, config.max_completion_length)
    set_gradient_checkpointing(model, config.gradient_checkpointing)  # what the trainer does at init
    dataset = make_arithmetic_dataset(n=64, seed=0)
    peft_config = lora_config(r=lora_rank, lora_alpha=2 * lora_rank) if lora_rank else None
    trainer = GRPOTrainer(
        model,
        [correctness_reward, format_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    if device.type == "cpu":
        for group in trainer.optimizer.param_groups:
            group["foreach"] = True  # the CUDA default: count its temporaries as a GPU would have them
    return trainer


def weights_bytes(trainer) -> int:
    """Policy + reference weights; a LoRA reference (the policy with its adapters off) shares every storage."""
    modules = [m for m in (trainer.model, trainer.ref_model) if m is not None]
    return storage_bytes([t for m in modules for t in (*m.parameters(), *m.buffers())])


def measure_step(trainer, update_micro_batches: int = 1) -> dict:
    """One step with the tracker on: {"rollout": breakdown, "update": breakdown, ...} in bytes."""
    from minigrpo.advantages import group_relative_advantages, group_rewards

    config, device = trainer.config, trainer.device
    weights = weights_bytes(trainer)
    result = {"weights": weights}
    cuda = device.type == "cuda"
    with TensorMemoryTracker() as tracker:
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        rollout, rewards, _ = trainer.collect_rollout()
        result["rollout"] = peak_breakdown(tracker, weights, [], [])
        result["rollout"]["seconds"] = time.perf_counter() - started
        if cuda:
            result["rollout"]["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        tracker.reset_peak()
        rows_kept = tracker.live_bytes  # the rollout's tensors (ids, masks, reference log-probs) stay live
        grouped = group_rewards(rewards, config.num_generations)  # (B, G)
        advantages = group_relative_advantages(
            grouped, config.scale_rewards, config.baseline, config.std_ddof, config.advantage_epsilon
        ).flatten()  # (N,)
        N, mb = advantages.shape[0], config.per_device_train_batch_size
        rows = N if update_micro_batches <= 0 else min(N, update_micro_batches * mb)
        started = time.perf_counter()
        trainer.grpo_step(rollout, advantages[:rows], trainer.loss_mask(rollout))
        result["update"] = peak_breakdown(
            tracker, weights, gradients([trainer.model]), optimizer_state(trainer.optimizer)
        )
        result["update"]["seconds"] = time.perf_counter() - started
        result["update"]["rollout_tensors"] = rows_kept
        if cuda:
            result["update"]["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    result["update"]["activations"] -= rows_kept  # rollout tensors kept for the update are not activations
    result["micro_batches_measured"] = rows // mb
    result["micro_batches_in_step"] = N // mb
    result["sequence_length"] = rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
    result["completion_length"] = rollout.completion_ids.shape[1]
    result["peak"] = max(result["rollout"]["total"], result["update"]["total"])
    result["trainable_parameters"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    result["parameters"] = sum(p.numel() for p in trainer.model.parameters())
    return result


def logprob_chunk_bytes(config: GRPOConfig, vocab_size: int) -> int:
    """About three (rows, V) fp32 tensors at once (logits, log-softmax, its exp) for one chunk of positions."""
    return 3 * config.logprob_chunk_size * vocab_size * 4


def report(result: dict, trainer, args) -> str:
    config = trainer.config
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    training = f"LoRA r={args.lora_rank}" if args.lora else "full fine-tuning"
    reference = "the policy with its adapters off (no copy)" if args.lora else "a copy"
    lines = [
        f"{training}: {result['trainable_parameters']:,} of {result['parameters']:,} parameters trained; "
        f"reference: {reference if config.beta else 'none (beta=0)'}",
        f"model {args.model}, preset {args.preset}: B={config.prompts_per_step} prompts x G={config.num_generations}, "
        f"micro-batch {config.per_device_train_batch_size}, sequences of {result['sequence_length']} tokens "
        f"({result['completion_length']} completion tokens, forced to full length), "
        f"gradient_checkpointing={config.gradient_checkpointing}, device {trainer.device}",
        f"update measured over {result['micro_batches_measured']} of {result['micro_batches_in_step']} "
        "micro-batches + the optimizer step (all micro-batches are the same size; gradients accumulate in place)",
        "",
        f"{'phase':<10} {'weights':>11} {'gradients':>11} {'optimizer':>11} {'activations':>11} {'peak':>11}",
    ]
    for phase in ("rollout", "update"):
        r = result[phase]
        lines.append(
            f"{phase:<10} {format_bytes(r['weights']):>11} {format_bytes(r['gradients']):>11} "
            f"{format_bytes(r['optimizer_state']):>11} {format_bytes(r['activations']):>11} "
            f"{format_bytes(r['total']):>11}"
        )
        if "cuda_max_memory_allocated" in r:
            lines.append(f"{'':<10} torch.cuda.max_memory_allocated: {format_bytes(r['cuda_max_memory_allocated'])}")
    lines += [
        "",
        f"peak of live tensors in the step: {format_bytes(result['peak'])}"
        f"  (weights = policy + reference; activations include temporaries, of which one log-prob chunk of "
        f"{config.logprob_chunk_size} positions x V={vocab} is about "
        f"{format_bytes(logprob_chunk_bytes(config, vocab)).strip()};"
        f" rollout tensors kept for the update: {format_bytes(result['update']['rollout_tensors'])}, in the peak)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shapes = ", ".join(f'"{name}"' for name in QWEN_SHAPES)
    parser.add_argument("--model", default="tiny", help=f'"tiny", {shapes} or a local model folder')
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--lora", action="store_true", help="LoRA adapters instead of full fine-tuning")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank r (alpha = 2r)")
    parser.add_argument("--update-micro-batches", type=int, default=1, help="micro-batches of the update (0 = all)")
    parser.add_argument(
        "--fp32",
        action="store_true",
        help="no bf16 autocast even where the GPU has it: a T4's precision, to measure T4 figures on an A100/H100",
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    parser.add_argument("--tokenizer-cache", default=None, help="folder to save / reuse the built Qwen2.5 tokenizer")
    parser.add_argument("--json-out", default=None, help="also write the figures (bytes) to this JSON file")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="the tiny model at the tiny preset on the CPU, 1 thread")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.preset, args.device, args.threads, args.lora = "tiny", "tiny", "cpu", 1, False
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    with tempfile.TemporaryDirectory() as output_dir:
        lora_rank = args.lora_rank if args.lora else None
        trainer = build(args.model, args.preset, device, output_dir, args.tokenizer_cache, lora_rank, args.fp32)
        result = measure_step(trainer, args.update_micro_batches)
    print(report(result, trainer, args))
    result.update(model=args.model, preset=args.preset, device=str(device), lora_rank=lora_rank)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    print(json.dumps(headline(result)))
    return 0


def headline(result: dict) -> dict:
    """The last line printed: the step's peak and its parts at the update's peak, in bytes."""
    update = result["update"]
    return {
        "model": result["model"],
        "preset": result["preset"],
        "device": result["device"],
        "lora_rank": result["lora_rank"],
        "peak_bytes": result["peak"],
        "rollout_peak_bytes": result["rollout"]["total"],
        "update_peak_bytes": update["total"],
        "weights_bytes": update["weights"],
        "gradients_bytes": update["gradients"],
        "optimizer_state_bytes": update["optimizer_state"],
        "activations_bytes": update["activations"],
        "completion_length": result["completion_length"],
        "trainable_parameters": result["trainable_parameters"],
    }


if __name__ == "__main__":
    sys.exit(main())

"""One GPU acceptance command: does the real-model path work, fit and run fast on this GPU?

    python bench/gpu_check.py --json-out gpu_check.json   # any single CUDA GPU, no Hub access, < 8 minutes
    python bench/gpu_check.py --dry-run                   # on a CPU: print the plan, check the imports

The model is Qwen2.5-0.5B-Instruct's shape with random weights (494M parameters) and the real Qwen2.5
tokenizer built offline (`minigrpo.tokenization.qwen25_tokenizer`, from the `dashscope` package of the test
extra); TRL comes from the bench extra (`pip install -e ".[test,bench]"`). Every completion is forced
to its full length (min_new_tokens), so the numbers are the worst case and the same for both trainers.

Checks, each recorded in the JSON even when another fails:
  vs_trl      minigrpo vs TRL's GRPOTrainer: seconds per step (median of the steps after the first),
              generated tokens / s and peak memory; 8 prompts x G=8 x 128 new tokens, beta 0.04
  t4_preset   GRPOConfig.qwen_t4() one step in fp32 (as on a T4: no bf16 autocast) with the process capped
              at 15 GiB (torch.cuda.set_per_process_memory_fraction): "fits" or "OOM", and its peak
  fast_path   greedy tokens of the static-cache compiled decode (fast_generation=True) equal the plain
              path's (fp32; both from the same prompts)
  ppo_vs_grpo peak memory of one PPO step and one GRPO step at Qwen shape (same batch as vs_trl)
"""

from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2ForCausalLM

GiB = 1024**3
T4_MEMORY = 15 * GiB
BATCH = dict(prompts_per_step=8, num_generations=8, max_completion_length=128, beta=0.04)
PLAN = {
    "vs_trl": "minigrpo vs TRL GRPOTrainer, 3 steps each: step time, tokens/s, peak memory (8 prompts x G=8 x 128)",
    "t4_preset": "GRPOConfig.qwen_t4(), 1 step, fp32, process capped at 15 GiB: fits or OOM",
    "fast_path": "fast_generation=True greedy tokens == plain path greedy tokens (fp32, 8 prompts x 32 tokens)",
    "ppo_vs_grpo": "peak memory of 1 PPO step vs 1 GRPO step at Qwen shape",
}


# --- building blocks ---------------------------------------------------------------------------------
def qwen_shape(tokenizer, device) -> Qwen2ForCausalLM:
    """Qwen2.5-0.5B-Instruct's architecture, random weights, fp32, with Qwen's EOS and padding."""
    from minigrpo.measuring.measure import qwen_shape_config

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = qwen_shape_config(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id)
    return model.to(device)


def full_length(model, length: int):
    """Make `model.generate` run every completion to `length` new tokens (the worst case, and equal work)."""
    generate = model.generate

    def forced(*args, generation_config=None, **kwargs):
        generation_config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
        generation_config.min_new_tokens = length
        return generate(*args, generation_config=generation_config, **kwargs)

    model.generate = forced
    return model


def fp32_as_on_a_t4() -> None:
    """No bf16 autocast and an fp32 reference model, as minigrpo runs on a T4."""
    import minigrpo.models

    minigrpo.models.native_bf16 = lambda device: False


def free_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def dataset(n: int):
    from minigrpo.tasks.arithmetic import make_arithmetic_dataset

    return make_arithmetic_dataset(n=n, seed=0)


def minigrpo_steps(tokenizer, config, steps: int, trainer_class=None) -> dict:
    """`steps` GRPO (or PPO) steps of a fresh Qwen-shape model: seconds per step, tokens/s, peak bytes."""
    from minigrpo import GRPOTrainer
    from minigrpo.models import set_gradient_checkpointing
    from minigrpo.tasks.arithmetic import correctness_reward

    free_memory()
    model = full_length(qwen_shape(tokenizer, "cuda"), config.max_completion_length)
    set_gradient_checkpointing(model, config.gradient_checkpointing)
    trainer = (trainer_class or GRPOTrainer)(
        model, [correctness_reward], config, dataset(64), processing_class=tokenizer
    )
    times, tokens_per_second = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        metrics = trainer.training_step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        generated = metrics["completions/mean_length"] * config.num_completions
        tokens_per_second.append(generated / metrics["time/rollout"])
    del trainer, model
    return step_figures(times, tokens_per_second)


def step_figures(times: list[float], tokens_per_second: list[float]) -> dict:
    """Median step time and generation speed (the first step, which compiles and warms up, left out when there
    are more), and the peak of allocated GPU memory; the same figures for both trainers."""
    return {
        "seconds_per_step": statistics.median(times[1:] or times),
        "generated_tokens_per_second": statistics.median(tokens_per_second[1:] or tokens_per_second),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / GiB,
        "step_times": times,
    }


def trl_steps(tokenizer, config, steps: int, output_dir: str) -> dict:
    """The same steps with TRL's GRPOTrainer (config mapped by minigrpo.measuring.crosscheck.trl_config)."""
    import trl
    from transformers import TrainerCallback

    from minigrpo.measuring.crosscheck import trl_config
    from minigrpo.tasks.arithmetic import correctness_reward

    free_memory()
    model = full_length(qwen_shape(tokenizer, "cuda"), config.max_completion_length)
    args = trl_config(config.replace(max_steps=steps), "cuda", output_dir)
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=[correctness_reward], args=args, train_dataset=dataset(64), processing_class=tokenizer
    )
    rollout = {"seconds": 0.0, "tokens": 0.0}
    generate_and_score = trainer._generate_and_score_completions

    def timed(inputs):
        started = time.perf_counter()
        output = generate_and_score(inputs)
        torch.cuda.synchronize()
        rollout["seconds"] += time.perf_counter() - started
        rollout["tokens"] += float(output["completion_mask"].sum())
        return output

    trainer._generate_and_score_completions = timed
    times, tokens_per_second = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            rollout.update(seconds=0.0, tokens=0.0)
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            torch.cuda.synchronize()
            times.append(time.perf_counter() - self.started)
            tokens_per_second.append(rollout["tokens"] / max(rollout["seconds"], 1e-9))

    trainer.add_callback(Clock())
    trainer.train()
    del trainer, model
    return step_figures(times, tokens_per_second)


# --- the checks ----------------------------------------------------------------------------------------
def check_vs_trl(tokenizer, workdir: str) -> dict:
    from minigrpo.config import GRPOConfig

    config = GRPOConfig(**BATCH, per_device_train_batch_size=16, output_dir=f"{workdir}/minigrpo")
    return {"minigrpo": minigrpo_steps(tokenizer, config, 3), "trl": trl_steps(tokenizer, config, 3, f"{workdir}/trl")}


def check_t4_preset(tokenizer, workdir: str) -> dict:
    from minigrpo.config import GRPOConfig

    fp32_as_on_a_t4()
    config = GRPOConfig.qwen_t4(max_steps=1, eval_steps=0, save_steps=0, output_dir=f"{workdir}/t4")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, T4_MEMORY / total))
    try:
        result = minigrpo_steps(tokenizer, config, 1)
        return {"verdict": "fits", "peak_memory_gib": result["peak_memory_gib"], "seconds": result["step_times"][0]}
    except torch.cuda.OutOfMemoryError as error:
        return {"verdict": "OOM", "error": str(error).splitlines()[0]}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        free_memory()


def check_fast_path(tokenizer) -> dict:
    from minigrpo.config import GRPOConfig
    from minigrpo.rollout import generate_completions, tokenize_prompts

    fp32_as_on_a_t4()
    free_memory()
    model = qwen_shape(tokenizer, "cuda")
    prompts = dataset(8)["prompt"]
    tokens = {}
    for fast in (False, True):
        config = GRPOConfig(max_completion_length=32, fast_generation=fast, share_prompt_prefix=False)
        ids, mask = tokenize_prompts(tokenizer, prompts, config.max_prompt_length, "cuda")
        started = time.perf_counter()
        for _ in range(2):  # the second call of the fast path replays the compiled graph
            completion = generate_completions(model, tokenizer, ids, mask, config, greedy=True)
        tokens[fast] = completion.cpu()
        tokens[f"seconds_{fast}"] = time.perf_counter() - started
    plain, fast = tokens[False], tokens[True]
    same = plain.shape == fast.shape and torch.equal(plain, fast)
    width = min(plain.shape[1], fast.shape[1])
    differ = (plain[:, :width] != fast[:, :width]).any(0).nonzero()
    del model
    return {
        "equal": same,
        "first_differing_position": None if same or not len(differ) else int(differ[0]),
        "seconds_plain_two_calls": tokens["seconds_False"],
        "seconds_fast_two_calls": tokens["seconds_True"],
    }


def check_ppo_vs_grpo(tokenizer, workdir: str) -> dict:
    from minigrpo.config import GRPOConfig
    from minigrpo.ppo import PPOConfig, PPOTrainer

    grpo = GRPOConfig(**BATCH, per_device_train_batch_size=16, output_dir=f"{workdir}/grpo")
    ppo = PPOConfig(**BATCH, per_device_train_batch_size=16, output_dir=f"{workdir}/ppo")
    return {
        "grpo_peak_memory_gib": minigrpo_steps(tokenizer, grpo, 1)["peak_memory_gib"],
        "ppo_peak_memory_gib": minigrpo_steps(tokenizer, ppo, 1, PPOTrainer)["peak_memory_gib"],
    }


def dry_run() -> int:
    """The plan, and every import the real run needs (TRL, the tokenizer's vocabulary, the trainers)."""
    import trl  # noqa: F401

    from minigrpo.config import GRPOConfig
    from minigrpo.measuring.crosscheck import trl_config  # noqa: F401
    from minigrpo.measuring.measure import qwen_shape_config  # noqa: F401
    from minigrpo.ppo import PPOConfig, PPOTrainer  # noqa: F401
    from minigrpo.tokenization import qwen_bpe_ranks

    GRPOConfig.qwen_t4()
    GRPOConfig(**BATCH, per_device_train_batch_size=16)
    print(f"Qwen2.5 vocabulary: {len(qwen_bpe_ranks())} BPE ranks; TRL {trl.__version__}; torch {torch.__version__}")
    for name, what in PLAN.items():
        print(f"  {name:<12} {what}")
    print("dry run: imports OK (run without --dry-run on a CUDA GPU)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json-out", default="gpu_check.json", help="where the results go (written after each check)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and check the imports (CPU is fine)")
    parser.add_argument("--only", nargs="*", choices=sorted(PLAN), help="run only these checks")
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run()
    if not torch.cuda.is_available():
        print("no CUDA GPU here: run on a GPU, or pass --dry-run to check the setup on a CPU.", file=sys.stderr)
        return 2
    from minigrpo.tokenization import qwen25_tokenizer

    results = {"gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0))}
    results["torch"] = torch.__version__
    tokenizer = qwen25_tokenizer()
    out = Path(args.json_out)
    with tempfile.TemporaryDirectory() as workdir:
        checks = {
            "vs_trl": functools.partial(check_vs_trl, tokenizer, workdir),
            "ppo_vs_grpo": functools.partial(check_ppo_vs_grpo, tokenizer, workdir),
            "t4_preset": functools.partial(check_t4_preset, tokenizer, workdir),  # fp32 from here on
            "fast_path": functools.partial(check_fast_path, tokenizer),
        }
        for name, check in checks.items():
            if args.only and name not in args.only:
                continue
            started = time.perf_counter()
            try:
                results[name] = check()
            except Exception as error:  # record and go on: one failed check must not hide the others
                results[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
            results[name]["check_seconds"] = time.perf_counter() - started
            out.write_text(json.dumps(results, indent=2))
            print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if k != 'traceback'})}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

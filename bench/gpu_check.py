"""One GPU acceptance command: does the real-model path work, fit and run fast on this GPU?

    python bench/gpu_check.py --json-out gpu_check.json   # any single CUDA GPU, no Hub access, < 8 minutes
    python bench/gpu_check.py --dry-run                   # on a CPU: the imports, then every check for one step
                                                          # of the tiny Qwen (seconds; its figures mean nothing)

The model is Qwen2.5-0.5B-Instruct's shape with random weights (494M parameters) and the real Qwen2.5
tokenizer built offline (`minigrpo.tokenization.qwen25_tokenizer`, from the `dashscope` package of the test
extra); TRL comes from the bench extra (`pip install -e ".[test,bench]"`). Every completion is forced
to its full length (min_new_tokens), so the numbers are the worst case and the same for both trainers.

Checks, each recorded in the JSON even when another fails:
  vs_trl      minigrpo vs TRL's GRPOTrainer: seconds per step (median of the steps after the first),
              generated tokens / s and peak memory; 8 prompts x G=8 x 128 new tokens, beta 0.04
  t4_preset   GRPOConfig.qwen_t4() one step in fp32 (bf16=False, as on a T4: no bf16 autocast) with the
              process capped at 15 GiB (torch.cuda.set_per_process_memory_fraction): "fits" or "OOM", and its peak
  fast_path   greedy tokens of the static-cache compiled decode (fast_generation=True) equal the plain
              path's (fp32; both from the same prompts)
  ppo_vs_grpo peak memory of one PPO step and one GRPO step at Qwen shape (same batch as vs_trl)

--dry-run is the CPU stand-in: the same checks on the bundled tiny Qwen, one step each, with 2 prompts x G=4 and
8 tokens, peak RSS instead of GPU memory and no memory cap, so that the whole script is exercised where there is
no GPU (tests/test_bench.py runs it). The last line printed is one JSON summary (its keys are in docs/performance.md).
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
PLAN = {
    "vs_trl": "minigrpo vs TRL GRPOTrainer, 3 steps each: step time, tokens/s, peak memory (8 prompts x G=8 x 128)",
    "t4_preset": "GRPOConfig.qwen_t4(), 1 step, fp32, process capped at 15 GiB: fits or OOM",
    "fast_path": "fast_generation=True greedy tokens == plain path greedy tokens (fp32, 8 prompts x 32 tokens)",
    "ppo_vs_grpo": "peak memory of 1 PPO step vs 1 GRPO step at Qwen shape",
}
SIZES = {
    # the acceptance run: Qwen2.5-0.5B's shape on a CUDA GPU
    "gpu": dict(model="qwen0.5b-shape", device="cuda", steps=3, micro_batch=16, fast_prompts=8, fast_tokens=32,
                batch=dict(prompts_per_step=8, num_generations=8, max_completion_length=128, beta=0.04), t4={}),
    # --dry-run: the same code on the bundled tiny Qwen on the CPU, one step each
    "cpu": dict(model="tiny", device="cpu", steps=1, micro_batch=8, fast_prompts=2, fast_tokens=8,
                batch=dict(prompts_per_step=2, num_generations=4, max_completion_length=8, beta=0.04),
                t4=dict(prompts_per_step=2, max_completion_length=8)),
}  # fmt: skip


# --- building blocks ---------------------------------------------------------------------------------
def load_tokenizer(size: dict):
    """Qwen2.5's real tokenizer (built offline) for the Qwen shape; the tiny Qwen's own for the CPU stand-in."""
    if size["model"] == "tiny":
        from minigrpo import load_model_and_tokenizer

        return load_model_and_tokenizer("tiny", "cpu")[1]
    from minigrpo.tokenization import qwen25_tokenizer

    return qwen25_tokenizer()


def build_model(size: dict, tokenizer):
    """A fresh model of the size's kind: the tiny Qwen, or Qwen2.5-0.5B-Instruct's architecture with random
    weights, fp32, with Qwen's EOS and padding."""
    if size["model"] == "tiny":
        from minigrpo import load_model_and_tokenizer

        return load_model_and_tokenizer("tiny", "cpu")[0]
    from minigrpo.measuring.measure import qwen_shape_config

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = qwen_shape_config(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id)
    return model.to(size["device"])


def full_length(model, length: int):
    """Make `model.generate` run every completion to `length` new tokens (the worst case, and equal work)."""
    generate = model.generate

    def forced(*args, generation_config=None, **kwargs):
        generation_config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
        generation_config.min_new_tokens = length
        return generate(*args, generation_config=generation_config, **kwargs)

    model.generate = forced
    return model


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free_memory(device: str) -> None:
    """Release what the last check held and start a new peak (GPU: allocated bytes; CPU: the RSS high-water mark)."""
    from minigrpo.measuring.measure import reset_peak_rss

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_rss()


def peak_memory_gib(device: str) -> float:
    """GPU: peak allocated since free_memory; CPU: peak RSS of the process since then."""
    from minigrpo.measuring.measure import rss_bytes

    return (torch.cuda.max_memory_allocated() if device == "cuda" else rss_bytes("VmHWM")) / GiB


def dataset(n: int):
    from minigrpo.tasks.arithmetic import make_arithmetic_dataset

    return make_arithmetic_dataset(n=n, seed=0)


def minigrpo_steps(size: dict, tokenizer, config, trainer_class=None) -> dict:
    """size["steps"] GRPO (or PPO) steps of a fresh model: seconds per step, tokens/s, peak memory."""
    from minigrpo import GRPOTrainer
    from minigrpo.tasks.arithmetic import correctness_reward

    device = size["device"]
    free_memory(device)
    model = full_length(build_model(size, tokenizer), config.max_completion_length)
    trainer = (trainer_class or GRPOTrainer)(
        model, [correctness_reward], config, dataset(64), processing_class=tokenizer
    )
    times, tokens_per_second = [], []
    for _ in range(size["steps"]):
        synchronize(device)
        started = time.perf_counter()
        rollout, rewards, metrics = trainer.collect_rollout()  # one step of train()'s loop: sample and score,
        metrics.update(trainer.update(rollout, rewards))  # then update
        synchronize(device)
        times.append(time.perf_counter() - started)
        generated = metrics["completions/mean_length"] * config.num_completions
        tokens_per_second.append(generated / metrics["time/rollout"])
    del trainer, model
    return step_figures(times, tokens_per_second, device)


def step_figures(times: list[float], tokens_per_second: list[float], device: str) -> dict:
    """Median step time and generation speed (the first step, which compiles and warms up, left out when there
    are more), and the peak memory; the same figures for both trainers."""
    return {
        "seconds_per_step": statistics.median(times[1:] or times),
        "generated_tokens_per_second": statistics.median(tokens_per_second[1:] or tokens_per_second),
        "peak_memory_gib": peak_memory_gib(device),
        "step_times": times,
    }


def trl_steps(size: dict, tokenizer, config, output_dir: str) -> dict:
    """The same steps with TRL's GRPOTrainer (config mapped by minigrpo.measuring.crosscheck.trl_config)."""
    import trl
    from transformers import TrainerCallback

    from minigrpo.measuring.crosscheck import trl_config
    from minigrpo.tasks.arithmetic import correctness_reward

    device = size["device"]
    free_memory(device)
    model = full_length(build_model(size, tokenizer), config.max_completion_length)
    args = trl_config(config.replace(max_steps=size["steps"]), device, output_dir)
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=[correctness_reward], args=args, train_dataset=dataset(64), processing_class=tokenizer
    )
    rollout = {"seconds": 0.0, "tokens": 0.0}
    generate_and_score = trainer._generate_and_score_completions  # TRL's rollout, wrapped to time it

    def timed(inputs):
        started = time.perf_counter()
        output = generate_and_score(inputs)
        synchronize(device)
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
            synchronize(device)
            times.append(time.perf_counter() - self.started)
            tokens_per_second.append(rollout["tokens"] / max(rollout["seconds"], 1e-9))

    trainer.add_callback(Clock())
    trainer.train()
    del trainer, model
    return step_figures(times, tokens_per_second, device)


# --- the checks ----------------------------------------------------------------------------------------
def check_vs_trl(size: dict, tokenizer, workdir: str) -> dict:
    from minigrpo import GRPOConfig

    config = GRPOConfig(**size["batch"], per_device_train_batch_size=size["micro_batch"], max_steps=size["steps"],
                        output_dir=f"{workdir}/minigrpo")  # fmt: skip
    minigrpo = minigrpo_steps(size, tokenizer, config)
    trl = trl_steps(size, tokenizer, config, f"{workdir}/trl")
    return {"minigrpo": minigrpo, "trl": trl, "step_time_ratio": minigrpo["seconds_per_step"] / trl["seconds_per_step"]}


def check_t4_preset(size: dict, tokenizer, workdir: str) -> dict:
    """qwen_t4() in fp32 (bf16=False: a T4 has no native bf16), one step; on a GPU capped at a T4's 15 GiB."""
    from minigrpo import GRPOConfig

    config = GRPOConfig.qwen_t4(bf16=False, max_steps=1, eval_strategy="no", save_strategy="no",
                                output_dir=f"{workdir}/t4", **size["t4"])  # fmt: skip
    one_step = dict(size, steps=1)
    if size["device"] != "cuda":  # no cap on a CPU: the step runs, and says nothing about a T4
        result = minigrpo_steps(one_step, tokenizer, config)
        return {"verdict": "ran (no memory cap on a CPU)", "peak_memory_gib": result["peak_memory_gib"],
                "seconds": result["step_times"][0]}  # fmt: skip
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, T4_MEMORY / total))
    try:
        result = minigrpo_steps(one_step, tokenizer, config)
        return {"verdict": "fits", "peak_memory_gib": result["peak_memory_gib"], "seconds": result["step_times"][0]}
    except torch.cuda.OutOfMemoryError as error:
        return {"verdict": "OOM", "error": str(error).splitlines()[0]}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        free_memory("cuda")


def check_fast_path(size: dict, tokenizer) -> dict:
    from minigrpo import GRPOConfig
    from minigrpo.rollout import generate_completions, tokenize_prompts

    device = size["device"]
    free_memory(device)
    model = build_model(size, tokenizer)
    prompts = dataset(size["fast_prompts"])["prompt"]
    tokens = {}
    for fast in (False, True):
        # the static cache is sized from max_prompt_length, which the bare config leaves unset (None, as TRL)
        config = GRPOConfig(max_prompt_length=256, max_completion_length=size["fast_tokens"], fast_generation=fast,
                            share_prompt_prefix=False, bf16=False)  # fmt: skip
        ids, mask = tokenize_prompts(tokenizer, prompts, config.max_prompt_length, device)
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


def check_ppo_vs_grpo(size: dict, tokenizer, workdir: str) -> dict:
    from minigrpo import GRPOConfig
    from minigrpo.ppo import PPOConfig, PPOTrainer

    batch = dict(size["batch"], per_device_train_batch_size=size["micro_batch"], max_steps=1)
    one_step = dict(size, steps=1)
    grpo = GRPOConfig(**batch, output_dir=f"{workdir}/grpo")
    ppo = PPOConfig(**batch, output_dir=f"{workdir}/ppo")
    return {
        "grpo_peak_memory_gib": minigrpo_steps(one_step, tokenizer, grpo)["peak_memory_gib"],
        "ppo_peak_memory_gib": minigrpo_steps(one_step, tokenizer, ppo, PPOTrainer)["peak_memory_gib"],
    }


def check_imports() -> None:
    """Every import the GPU run needs (TRL, the Qwen2.5 tokenizer's vocabulary, the trainers), and the plan."""
    import trl

    from minigrpo import GRPOConfig
    from minigrpo.measuring.crosscheck import trl_config  # noqa: F401
    from minigrpo.measuring.measure import qwen_shape_config  # noqa: F401
    from minigrpo.ppo import PPOConfig, PPOTrainer  # noqa: F401
    from minigrpo.tokenization import qwen_bpe_ranks

    GRPOConfig.qwen_t4()
    print(f"Qwen2.5 vocabulary: {len(qwen_bpe_ranks())} BPE ranks; TRL {trl.__version__}; torch {torch.__version__}")
    for name, what in PLAN.items():
        print(f"  {name:<12} {what}")
    print("dry run: imports OK; now each check for one step of the tiny Qwen on the CPU")


def headline(results: dict) -> dict:
    """The last line printed: one figure or verdict per check (None where a check did not run or failed)."""
    get = lambda check, *keys: functools.reduce(  # noqa: E731
        lambda d, k: d.get(k) if isinstance(d, dict) else None, keys, results.get(check)
    )
    return {
        "gpu": results["gpu"],
        "dry_run": results["dry_run"],
        "minigrpo_seconds_per_step": get("vs_trl", "minigrpo", "seconds_per_step"),
        "trl_seconds_per_step": get("vs_trl", "trl", "seconds_per_step"),
        "step_time_ratio": get("vs_trl", "step_time_ratio"),
        "minigrpo_peak_memory_gib": get("vs_trl", "minigrpo", "peak_memory_gib"),
        "trl_peak_memory_gib": get("vs_trl", "trl", "peak_memory_gib"),
        "t4_preset_verdict": get("t4_preset", "verdict"),
        "t4_preset_peak_memory_gib": get("t4_preset", "peak_memory_gib"),
        "fast_path_equal": get("fast_path", "equal"),
        "grpo_peak_memory_gib": get("ppo_vs_grpo", "grpo_peak_memory_gib"),
        "ppo_peak_memory_gib": get("ppo_vs_grpo", "ppo_peak_memory_gib"),
        "failed": sorted(name for name in PLAN if "error" in results.get(name, {})),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json-out", default="gpu_check.json", help="where the results go (written after each check)")
    parser.add_argument(
        "--dry-run", action="store_true", help="on a CPU: the imports, then each check for one step of the tiny Qwen"
    )
    parser.add_argument("--only", nargs="*", choices=sorted(PLAN), help="run only these checks")
    args = parser.parse_args(argv)
    if args.dry_run:
        check_imports()
    elif not torch.cuda.is_available():
        print("no CUDA GPU here: run on a GPU, or pass --dry-run to check the setup on a CPU.", file=sys.stderr)
        return 2
    size = SIZES["cpu" if args.dry_run else "gpu"]
    device = size["device"]
    results = {"gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "dry_run": args.dry_run}
    if device == "cuda":
        results["capability"] = list(torch.cuda.get_device_capability(0))
    results["torch"] = torch.__version__
    tokenizer = load_tokenizer(size)
    out = Path(args.json_out)
    with tempfile.TemporaryDirectory() as workdir:
        checks = {
            "vs_trl": functools.partial(check_vs_trl, size, tokenizer, workdir),
            "ppo_vs_grpo": functools.partial(check_ppo_vs_grpo, size, tokenizer, workdir),
            "t4_preset": functools.partial(check_t4_preset, size, tokenizer, workdir),
            "fast_path": functools.partial(check_fast_path, size, tokenizer),
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
    print(json.dumps(headline(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

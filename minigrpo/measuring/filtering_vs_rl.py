"""Rejection-sampling fine-tuning (filtering your own samples) against GRPO: the runs and the table of
bench/rft_vs_grpo.py and lesson 06b.

Both algorithms start from the bundled tiny Qwen and see the same training prompts in the same order, the same
number of sampled completions per step (B prompts x G) and the same learning rate and schedule; for each seed,
each run is scored on the same held-out problems: greedy accuracy, and pass@k / maj@k from n samples per problem.
The untrained model ("before") is scored the same way. Intervals: a percentile bootstrap over seeds and problems
(intervals.bootstrap_interval); the difference RFT - GRPO is bootstrapped seed by seed (seed s of each).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from minigrpo.config import GRPOConfig
from minigrpo.measuring.intervals import bootstrap_interval
from minigrpo.measuring.measure import reset_peak_rss, rss_bytes, run_in_fresh_process, training_problems
from minigrpo.models import load_model_and_tokenizer, pick_device
from minigrpo.rejection_sampling import RejectionSamplingTrainer
from minigrpo.run.evaluation import greedy_completions, maj_at_k_curve, pass_at_k, sample_answers
from minigrpo.tasks.arithmetic import correctness_reward, extract_answer, make_arithmetic_dataset
from minigrpo.trainer import GRPOTrainer

ALGORITHMS = ("before", "rft", "grpo")


def run_config(algorithm: str, seed: int, steps: int, prompts: int, generations: int, output_dir: str) -> GRPOConfig:
    """The tiny preset at the bench's size; RFT has no KL term (beta 0), GRPO keeps the preset's (0.04)."""
    config = GRPOConfig.tiny_cpu(
        seed=seed, max_steps=steps, prompts_per_step=prompts, num_generations=generations,
        per_device_train_batch_size=prompts * generations, eval_steps=0, save_steps=0, save_strategy="no",
        output_dir=f"{output_dir}/{algorithm}-seed{seed}", overwrite_output_dir=True,
    )  # fmt: skip
    return config.replace(beta=0.0) if algorithm == "rft" else config


def per_problem_scores(model, tokenizer, problems, samples: int, ks: list[int], config, seed: int) -> dict:
    """Each held-out problem's greedy correctness (0/1), and its pass@k and maj@k from `samples` samples:
    {"greedy": [P], "pass@k": [[P] per k], "maj@k": [[P] per k]}."""
    truths = [int(answer) for answer in problems["answer"]]
    greedy = [extract_answer(text) for text in greedy_completions(model, tokenizer, list(problems["prompt"]), config)]
    answers = sample_answers(model, tokenizer, list(problems["prompt"]), samples, config, seed=seed)
    curves = [maj_at_k_curve(sampled, truth) for sampled, truth in zip(answers, truths, strict=True)]  # P x (n,)
    correct = [sum(a == truth for a in sampled) for sampled, truth in zip(answers, truths, strict=True)]
    return {
        "greedy": [float(a == t) for a, t in zip(greedy, truths, strict=True)],
        "pass@k": [[pass_at_k(samples, c, k) for c in correct] for k in ks],
        "maj@k": [[float(curve[k - 1]) for curve in curves] for k in ks],
    }


def run_one(algorithm: str, seed: int, steps: int, prompts: int, generations: int, problems: int, samples: int,
            train_size: int = 2000, output_dir: str = "runs/rft_vs_grpo") -> dict:  # fmt: skip
    """Train one algorithm with one seed ("before": no training) and score it; meant for a fresh process, so that
    its peak memory (VmHWM minus the RSS before the model loaded, on a CPU) is its own."""
    torch.manual_seed(seed)
    device = pick_device()
    baseline = rss_bytes("VmRSS")
    reset_peak_rss()
    model, tokenizer = load_model_and_tokenizer("tiny")
    config = run_config(algorithm, seed, steps, prompts, generations, output_dir)
    result = {"algorithm": algorithm, "seed": seed, "step_seconds": None, "kept_fraction": None}
    if algorithm != "before":
        train_data, _ = training_problems(train_size)
        trainer_class = RejectionSamplingTrainer if algorithm == "rft" else GRPOTrainer
        trainer = trainer_class(model, [correctness_reward], config, train_data, processing_class=tokenizer)
        trainer.train()
        history = trainer.state.log_history
        result["step_seconds"] = float(np.median([row["step_time"] for row in history]))
        result["train_reward"] = [row["reward"] for row in history]
        if algorithm == "rft":
            result["kept_fraction"] = float(np.mean([row["rft/kept_fraction"] for row in history]))
    result["peak_memory_mib"] = (rss_bytes("VmHWM") - baseline) / 2**20 if device.type == "cpu" else None
    held_out = make_arithmetic_dataset(200, "test").select(range(problems))  # lesson 06's held-out problems
    ks = [k for k in (2**i for i in range(samples.bit_length())) if k <= samples]
    result |= {"ks": ks, **per_problem_scores(model, tokenizer, held_out, samples, ks, config, seed=1000 + seed)}
    return result


def summarize(runs: list[dict]) -> dict:
    """Per algorithm: greedy accuracy, pass@k and maj@k (mean and bootstrap interval over seeds and problems),
    median step seconds and peak memory; and RFT - GRPO, seed by seed."""
    by_algorithm = {a: sorted((r for r in runs if r["algorithm"] == a), key=lambda r: r["seed"]) for a in ALGORITHMS}
    ks = runs[0]["ks"]
    summary = {"ks": ks, "seeds": [r["seed"] for r in by_algorithm["grpo"]], "algorithms": {}}
    for algorithm, rows in by_algorithm.items():
        if not rows:
            continue
        entry = {"greedy": bootstrap_interval([r["greedy"] for r in rows])}
        for metric in ("pass@k", "maj@k"):
            entry[metric] = [bootstrap_interval([r[metric][i] for r in rows]) for i in range(len(ks))]
        steps = [r["step_seconds"] for r in rows if r["step_seconds"] is not None]
        entry["step_seconds"] = float(np.median(steps)) if steps else None
        entry["peak_memory_mib"] = float(np.median([r["peak_memory_mib"] or 0.0 for r in rows]))
        kept = [r["kept_fraction"] for r in rows if r["kept_fraction"] is not None]
        entry["kept_fraction"] = float(np.mean(kept)) if kept else None
        summary["algorithms"][algorithm] = entry
    rft, grpo = by_algorithm["rft"], by_algorithm["grpo"]
    if rft and grpo:
        difference = lambda key, i=None: [  # noqa: E731
            (np.array(a[key] if i is None else a[key][i]) - np.array(b[key] if i is None else b[key][i])).tolist()
            for a, b in zip(rft, grpo, strict=True)
        ]
        summary["rft_minus_grpo"] = {
            "greedy": bootstrap_interval(difference("greedy")),
            "pass@k": [bootstrap_interval(difference("pass@k", i)) for i in range(len(ks))],
            "maj@k": [bootstrap_interval(difference("maj@k", i)) for i in range(len(ks))],
        }
    return summary


def format_table(summary: dict) -> str:
    """The lesson's table: one row per algorithm and metric, mean [low, high]; then RFT - GRPO."""

    def cell(interval: dict) -> str:
        return f"{interval['mean']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"

    ks, lines = summary["ks"], []
    n = len(ks) - 1  # the largest k, n
    names = {"before": "before (no training)", "rft": "RFT (filtering)", "grpo": "GRPO"}
    header = f"{'':<21}{'greedy accuracy':>24}{'pass@1':>24}{f'pass@{ks[n]}':>24}{f'maj@{ks[n]}':>24}"
    lines.append(header)
    rows = dict(summary["algorithms"])
    if "rft_minus_grpo" in summary:
        rows["rft_minus_grpo"] = summary["rft_minus_grpo"]
        names["rft_minus_grpo"] = "RFT - GRPO"
    for algorithm, entry in rows.items():
        cells = (entry["greedy"], entry["pass@k"][0], entry["pass@k"][n], entry["maj@k"][n])
        lines.append(f"{names[algorithm]:<21}" + "".join(f"{cell(c):>24}" for c in cells))
    lines.append("")
    lines.append(f"{'':<21}{'step (s, median)':>18}{'peak RSS (MiB)':>16}{'kept':>8}")
    for algorithm, entry in summary["algorithms"].items():
        step = "-" if entry["step_seconds"] is None else f"{entry['step_seconds']:.2f}"
        kept = "-" if entry["kept_fraction"] is None else f"{entry['kept_fraction']:.2f}"
        lines.append(f"{names[algorithm]:<21}{step:>18}{entry['peak_memory_mib']:>16.0f}{kept:>8}")
    return "\n".join(lines)


def compare(seeds: list[int], steps: int, prompts: int, generations: int, problems: int, samples: int,
            train_size: int = 2000, fresh_processes: bool = True, verbose: bool = True) -> dict:  # fmt: skip
    """Every algorithm with every seed (each in a fresh process unless fresh_processes=False), then summarize."""
    runs = []
    for algorithm in ALGORITHMS:
        for seed in seeds:
            started = time.perf_counter()
            arguments = dict(algorithm=algorithm, seed=seed, steps=steps, prompts=prompts, generations=generations,
                             problems=problems, samples=samples, train_size=train_size)  # fmt: skip
            if fresh_processes:
                runs.append(run_in_fresh_process("minigrpo.measuring.filtering_vs_rl", "run_one", arguments))
            else:
                runs.append(run_one(**arguments))
            if verbose:
                greedy = np.mean(runs[-1]["greedy"])
                print(f"{algorithm} seed {seed}: greedy accuracy {greedy:.3f} ({time.perf_counter() - started:.0f} s)")
    return {"runs": runs, "summary": summarize(runs)}

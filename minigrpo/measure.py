"""Measuring code for the benchmarks: memory readers, fresh-process runs, the Qwen-shaped model, PPO vs GRPO.

Shared by ``bench/ppo_vs_grpo.py``, ``bench/vs_trl.py``, lesson 05 and the
tests. Nothing here is part of the algorithms: it loads models, trains them,
reads the clock and the memory, and formats tables.

Peak memory. On a GPU, ``torch.cuda.max_memory_allocated``. On a CPU, the
resident set size (RSS) of this process from ``/proc/self/status``: VmRSS now,
VmHWM the peak since the last reset (Linux resets it through
``/proc/self/clear_refs``), so a peak can be measured from a baseline taken
after the libraries are loaded. Two runs in one process would hide each
other's peak (freed memory stays with the allocator), hence one fresh Python
process per run (``run_in_fresh_process``).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from minigrpo.config import GRPOConfig
from minigrpo.intervals import band, mean_interval, value_at
from minigrpo.models import load_model_and_tokenizer, pick_device
from minigrpo.ppo import PPOConfig, PPOTrainer
from minigrpo.tasks.arithmetic import REWARD_WEIGHTS, correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.tokenization import qwen25_tokenizer
from minigrpo.trainer import GRPOTrainer, Trainer

ALGORITHMS = ("grpo", "ppo")
QWEN_SHAPE = "qwen0.5b-shape"  # Qwen2.5-0.5B's architecture with random weights: no Hub needed


# --- memory ----------------------------------------------------------------------------------------------
def rss_bytes(field: str = "VmRSS") -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(match.group(1)) * 1024


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS (since Linux 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_memory_mib(device: str) -> dict:
    """{"peak_rss_mib": the process's peak RSS since it started, and on CUDA "peak_gpu_mib": peak allocated}."""
    report = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # ru_maxrss is in KiB
    if device.startswith("cuda"):
        report["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return report


# --- a fresh process per run -------------------------------------------------------------------------------
_CHILD = (  # python -c _CHILD module function '<json arguments>' <result file>
    "import importlib, json, sys; function = getattr(importlib.import_module(sys.argv[1]), sys.argv[2]); "
    "json.dump(function(**json.loads(sys.argv[3])), open(sys.argv[4], 'w'))"
)


def run_in_fresh_process(module: str, function: str, arguments: dict) -> dict:
    """module.function(**arguments) in a new Python process; returns its JSON-able result.

    Raises RuntimeError with the end of the child's stderr when it fails.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        command = [sys.executable, "-c", _CHILD, module, function, json.dumps(arguments), out]
        done = subprocess.run(command, capture_output=True, env=_child_environment())
        if done.returncode != 0:
            raise RuntimeError(f"{module}.{function} failed in its process:\n{done.stderr.decode()[-3000:]}")
        with open(out) as f:
            return json.load(f)


def _child_environment() -> dict:
    """This process's environment, with this copy of minigrpo first on the path (works without installing)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else root + os.pathsep + path}


# --- the Qwen-shaped model ---------------------------------------------------------------------------------


def qwen_shape_config(vocab_size: int = 151_936, **overrides) -> Qwen2Config:
    """Qwen2.5-0.5B-Instruct's configuration (494M parameters, its config.json), for a random-init model built
    offline. Token ids (eos, pad, bos) depend on the tokenizer: pass them as overrides."""
    shape = dict(
        vocab_size=vocab_size,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        max_window_layers=21,
        sliding_window=32768,
        use_sliding_window=False,
        attention_dropout=0.0,
        initializer_range=0.02,
    )
    return Qwen2Config(**{**shape, **overrides})


def load_benchmark_model(name: str, device=None, **shape_overrides):
    """ "tiny", a Hub id / path, or "qwen0.5b-shape": Qwen2.5-0.5B's shape with random weights and Qwen2.5's
    real tokenizer, built offline (`tokenization.qwen25_tokenizer`; memory and time are what it measures)."""
    if name != QWEN_SHAPE:
        return load_model_and_tokenizer(name, device)
    tokenizer = qwen25_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = qwen_shape_config(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    for key, value in shape_overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id)
    return model.to(device if device is not None else pick_device()), tokenizer


# --- PPO vs GRPO (bench/ppo_vs_grpo.py and lesson 05) -----------------------------------------------------
def parameter_counts(trainer: Trainer) -> dict[str, dict[str, int]]:
    """Parameters held in memory per model: {"policy": {"trainable", "frozen"}, "reference": ..., "critic": ...}."""
    models = {"policy": trainer.model, "reference": trainer.ref_model, "critic": getattr(trainer, "critic", None)}
    return {
        name: {
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "frozen": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        }
        for name, model in models.items()
        if model is not None
    }


def _curve(history: list[dict], completions_per_step: int) -> dict[str, list]:
    """Per step: completions generated so far, training seconds so far (step_time, evaluation excluded),
    mean reward, held-out accuracy (None between evaluations), the critic's explained variance (PPO)."""
    seconds, elapsed = [], 0.0
    for m in history:
        elapsed += m.get("step_time", 0.0)
        seconds.append(elapsed)
    return {
        "completions": [m["step"] * completions_per_step for m in history],
        "seconds": seconds,
        "reward": [m["reward"] for m in history],
        "eval/accuracy": [m.get("eval/accuracy") for m in history],
        "values/explained_variance": [m.get("values/explained_variance") for m in history],
    }


def training_problems(train_size: int, validation_size: int = 0, seed: int = 0):
    """(train, validation): `validation_size` distinct training-split problems held back, and the training
    problems without any of them (make_arithmetic_dataset samples with replacement, so a problem can repeat;
    every copy of a validation problem leaves the training set). The test split is never touched."""
    problems = make_arithmetic_dataset(train_size + validation_size, "train", seed=seed)
    distinct = list(dict.fromkeys(problems["question"]))  # in order of first appearance
    if validation_size > len(distinct) // 2:
        raise ValueError(
            f"validation_size={validation_size} is more than half of the {len(distinct)} distinct problems: "
            "lower it or raise train_size."
        )
    held_back = set(distinct[len(distinct) - validation_size :]) if validation_size else set()
    first_row = {}
    for row, question in enumerate(problems["question"]):
        first_row.setdefault(question, row)
    validation_rows = sorted(first_row[q] for q in held_back)
    train_rows = [row for row, question in enumerate(problems["question"]) if question not in held_back]
    return problems.select(train_rows), problems.select(validation_rows)


def _seconds_per_step(history: list[dict]) -> dict[str, float]:
    """Mean seconds per step: rollout (generate + reference / old log-probs), scoring (reward functions,
    and for PPO the critic's values, the KL-in-reward and GAE), update (the gradient passes)."""
    mean = lambda key: sum(m.get(key, 0.0) for m in history) / len(history)  # noqa: E731
    return {
        "rollout": mean("time/rollout"),
        "scoring": mean("time/rewards") + mean("time/scoring"),
        "update": mean("time/update") - mean("time/scoring"),
    }


def run_algorithm(
    algorithm: str,
    model: str = "tiny",
    config_overrides: dict | None = None,
    train_size: int = 2000,
    eval_size: int = 200,
    output_dir: str = "runs/ppo_vs_grpo",
    evaluate_on: str = "test",
    validation_size: int = 0,
) -> dict:
    """Train one algorithm and measure it; meant to run alone in a fresh process (see compare_ppo_grpo).

    evaluate_on="test": eval/accuracy is on `eval_size` held-out test problems; "validation": on the
    `validation_size` training problems held back from training (training_problems), for choosing
    hyper-parameters without ever looking at the test set. Training never sees the validation problems
    (when validation_size > 0) in either case, so tuning and final runs train on the same problems.

    Peak memory: on a GPU, torch.cuda.max_memory_allocated since just before
    the model was loaded. On a CPU, the peak resident set size (VmHWM) minus
    the RSS just before the model was loaded (Python, torch and the datasets
    are the same for both algorithms and are not training memory).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}: choose 'grpo' or 'ppo'.")

    if evaluate_on not in ("test", "validation"):
        raise ValueError(f"evaluate_on={evaluate_on!r}: choose 'test' or 'validation'.")
    if evaluate_on == "validation" and validation_size < 1:
        raise ValueError("evaluate_on='validation' needs validation_size >= 1 problems held back from training.")
    train_data, validation_data = training_problems(train_size, validation_size)
    eval_data = validation_data if evaluate_on == "validation" else make_arithmetic_dataset(eval_size, "test", seed=0)
    device = pick_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        baseline = rss_bytes("VmRSS")
        reset_peak_rss()
    policy, tokenizer = load_benchmark_model(model, device)
    config_class, trainer_class = (GRPOConfig, GRPOTrainer) if algorithm == "grpo" else (PPOConfig, PPOTrainer)
    overrides = {"reward_weights": list(REWARD_WEIGHTS), "save_steps": 0, **(config_overrides or {})}
    if "per_device_train_batch_size" not in overrides:  # the preset's micro-batch must divide N = B * G
        defaults = config_class.for_model(model)
        n = overrides.get("prompts_per_step", defaults.prompts_per_step)
        n *= overrides.get("num_generations", defaults.num_generations)
        overrides["per_device_train_batch_size"] = math.gcd(n, defaults.per_device_train_batch_size)
    # a measurement is repeated (a notebook re-run): it replaces the earlier one in its folder
    config = config_class.for_model(
        model, **{**overrides, "output_dir": f"{output_dir}/{algorithm}", "overwrite_output_dir": True}
    )
    reward_funcs = [correctness_reward, format_reward]  # the first one is eval/accuracy
    trainer = trainer_class(policy, reward_funcs, config, train_data, eval_data, processing_class=tokenizer)
    accuracy_before = trainer.evaluate()["eval/accuracy"]
    started = time.perf_counter()
    history = trainer.train()
    seconds = time.perf_counter() - started
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = rss_bytes("VmHWM") - baseline
    return {
        "params": parameter_counts(trainer),
        "peak_memory_bytes": int(peak),
        "seconds_per_step": _seconds_per_step(history),
        "curve": _curve(history, config.num_completions),
        "accuracy_before": accuracy_before,
        "accuracy": next((m["eval/accuracy"] for m in reversed(history) if "eval/accuracy" in m), accuracy_before),
        "train_seconds": seconds,
        "config": {k: v for k, v in asdict(config).items() if not isinstance(v, list)},
    }


def compare_ppo_grpo(
    model: str = "tiny",
    max_steps: int = 60,
    eval_steps: int = 15,
    train_size: int = 2000,
    eval_size: int = 200,
    output_dir: str = "runs/ppo_vs_grpo",
    verbose: bool = True,
    ppo_overrides: dict | None = None,
    **config_overrides,
) -> dict:
    """GRPO and PPO on the same model, task, prompts and completions per step, each in a fresh process.

    A fresh Python process per algorithm, so that one's freed memory cannot
    hide the other's peak. `config_overrides` go to both configs, `ppo_overrides` (critic_learning_rate, lam,
    vf_coef, ...) to PPO's only. Returns {"device", "model", "algorithms": {"grpo":
    {...}, "ppo": {...}}} with, per algorithm, parameters per model, peak
    memory, seconds per step (rollout / scoring / update) and the reward and
    held-out accuracy curves against generated completions.
    """
    results = {"device": pick_device().type, "model": model, "algorithms": {}}
    if torch.cuda.is_available():
        results["device_name"] = torch.cuda.get_device_name(0)
    overrides = dict(max_steps=max_steps, eval_steps=eval_steps, **config_overrides)
    for algorithm in ALGORITHMS:
        arguments = dict(
            algorithm=algorithm,
            model=model,
            config_overrides={**overrides, **(ppo_overrides or {})} if algorithm == "ppo" else overrides,
            train_size=train_size,
            eval_size=eval_size,
            output_dir=output_dir,
        )
        started = time.perf_counter()
        results["algorithms"][algorithm] = run_in_fresh_process("minigrpo.measure", "run_algorithm", arguments)
        if verbose:
            print(f"{algorithm}: {max_steps} steps in {time.perf_counter() - started:.0f} s (fresh process)")
    return results


def summary(results: dict) -> dict:
    """The headline numbers: peak memory of each, their ratio (GRPO / PPO), final held-out accuracy of each."""
    grpo, ppo = results["algorithms"]["grpo"], results["algorithms"]["ppo"]
    return {
        "grpo_peak_mem": grpo["peak_memory_bytes"],
        "ppo_peak_mem": ppo["peak_memory_bytes"],
        "peak_memory_ratio": round(grpo["peak_memory_bytes"] / ppo["peak_memory_bytes"], 3),
        "grpo_accuracy": grpo["accuracy"],
        "ppo_accuracy": ppo["accuracy"],
        "completions": grpo["curve"]["completions"][-1],
        "device": results["device"],
        "model": results["model"],
    }


def format_table(results: dict) -> str:
    """A plain-text table of the comparison (one column per algorithm)."""
    grpo, ppo = results["algorithms"]["grpo"], results["algorithms"]["ppo"]
    count = lambda r, kind: sum(m[kind] for m in r["params"].values())  # noqa: E731
    models = lambda r: " + ".join(r["params"])  # noqa: E731
    rows = [
        ("models in memory", models(grpo), models(ppo)),
        ("trainable parameters", f"{count(grpo, 'trainable'):,}", f"{count(ppo, 'trainable'):,}"),
        ("frozen parameters", f"{count(grpo, 'frozen'):,}", f"{count(ppo, 'frozen'):,}"),
        ("peak memory (MB)", f"{grpo['peak_memory_bytes'] / 2**20:.1f}", f"{ppo['peak_memory_bytes'] / 2**20:.1f}"),
    ]
    for part in ("rollout", "scoring", "update"):
        rows.append((f"s/step {part}", f"{grpo['seconds_per_step'][part]:.2f}", f"{ppo['seconds_per_step'][part]:.2f}"))
    rows += [
        ("completions generated", f"{grpo['curve']['completions'][-1]:,}", f"{ppo['curve']['completions'][-1]:,}"),
        ("held-out accuracy before", f"{grpo['accuracy_before']:.3f}", f"{ppo['accuracy_before']:.3f}"),
        ("held-out accuracy after", f"{grpo['accuracy']:.3f}", f"{ppo['accuracy']:.3f}"),
        ("mean reward, last step", f"{grpo['curve']['reward'][-1]:.3f}", f"{ppo['curve']['reward'][-1]:.3f}"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'GRPO':>14}  {'PPO':>22}"]
    lines += [f"{name:{width}}  {g:>14}  {p:>22}" for name, g, p in rows]
    ratio = grpo["peak_memory_bytes"] / ppo["peak_memory_bytes"]
    lines.append(f"peak memory GRPO / PPO = {ratio:.2f} ({results['device']}, model {results['model']})")
    return "\n".join(lines)


# --- several seeds: intervals, tuning on a validation split, equal completions and equal time -------------------
def study_summary(runs: dict[str, list[dict]], last_steps: int = 5) -> dict:
    """Per algorithm, over its seeds: mean and 95% interval of held-out accuracy at equal completions (the end
    of every run) and at equal wall-clock, peak memory, seconds per step (rollout / scoring / update), the
    critic's explained variance (mean of its last `last_steps` steps), and the parameter counts.

    Equal wall-clock: tau = the longest run of the faster algorithm (training seconds, evaluation excluded).
    Every run is read at its last evaluation at or before tau, so the faster algorithm is read at its end
    and the slower one wherever it had got to by then (value_at).
    """
    total_seconds = {name: [r["curve"]["seconds"][-1] for r in results] for name, results in runs.items()}
    faster = min(total_seconds, key=lambda name: sum(total_seconds[name]) / len(total_seconds[name]))
    tau = max(total_seconds[faster])
    summary = {"equal_time_seconds": tau, "faster": faster, "algorithms": {}}
    for name, results in runs.items():
        at_tau = [
            value_at(r["curve"]["seconds"], r["curve"]["eval/accuracy"], tau, r["accuracy_before"]) for r in results
        ]
        entry = {
            "accuracy_equal_completions": mean_interval([r["accuracy"] for r in results]),
            "accuracy_equal_time": mean_interval(at_tau),
            "accuracy_before": mean_interval([r["accuracy_before"] for r in results]),
            "peak_memory_mib": mean_interval([r["peak_memory_bytes"] / 2**20 for r in results]),
            "seconds_per_step": {
                part: mean_interval([r["seconds_per_step"][part] for r in results])
                for part in ("rollout", "scoring", "update")
            },
            "completions": results[0]["curve"]["completions"][-1],
            "params": results[0]["params"],
            "learning_rate": results[0]["config"]["learning_rate"],
        }
        variances = [[v for v in r["curve"]["values/explained_variance"] if v is not None] for r in results]
        if all(variances):
            entry["explained_variance_final"] = mean_interval(
                [sum(v[-last_steps:]) / len(v[-last_steps:]) for v in variances]
            )
        summary["algorithms"][name] = entry
    return summary


def tune_learning_rate(
    algorithm: str, learning_rates: list[float], tuning_seeds: list[int], run_arguments: dict, verbose: bool = True
) -> dict:
    """Each learning rate of the grid trained with each tuning seed and scored by final accuracy on the
    validation split of the *training* problems (never the test set). Runs in this process: only accuracy is
    read, not memory. Returns {"scores": {lr: mean validation accuracy}, "best": the lr with the highest
    (the first of the grid on a tie)}."""
    if len(learning_rates) == 1:  # nothing to choose: no tuning runs
        return {"scores": {}, "best": learning_rates[0]}
    scores = {}
    for learning_rate in learning_rates:
        accuracies = []
        for seed in tuning_seeds:
            overrides = {**run_arguments["config_overrides"], "learning_rate": learning_rate, "seed": seed}
            result = run_algorithm(**{**run_arguments, "algorithm": algorithm, "config_overrides": overrides,
                                      "evaluate_on": "validation"})  # fmt: skip
            accuracies.append(result["accuracy"])
        scores[learning_rate] = sum(accuracies) / len(accuracies)
        if verbose:
            score = scores[learning_rate]
            print(f"tuning {algorithm}: learning_rate {learning_rate:g} -> validation accuracy {score:.3f}")
    return {"scores": scores, "best": max(learning_rates, key=lambda lr: scores[lr])}


# The study's two sizes (bench/ppo_vs_grpo.py and lesson 05): "full" is the measurement (about 30 minutes on two
# CPU cores for the tiny Qwen), "quick" only shows the plumbing (about a minute; its numbers mean nothing).
STUDY_SETTINGS = {
    "full": dict(seeds=[0, 1, 2, 3, 4], learning_rates=[1e-4, 3e-4, 1e-3], tuning_seeds=[100], max_steps=30,
                 eval_steps=5, prompts_per_step=16, train_size=2000, validation_size=200, eval_size=200),
    "quick": dict(seeds=[0, 1], learning_rates=[1e-4, 3e-4], tuning_seeds=[100], max_steps=2, eval_steps=1,
                  prompts_per_step=4, train_size=200, validation_size=16, eval_size=16),
}  # fmt: skip


def compare_with_seeds(
    model: str = "tiny",
    seeds: list[int] = (0, 1, 2, 3, 4),
    learning_rates: list[float] = (1e-4, 3e-4, 1e-3),
    tuning_seeds: list[int] = (100,),
    max_steps: int = 30,
    eval_steps: int = 5,
    train_size: int = 2000,
    validation_size: int = 200,
    eval_size: int = 200,
    output_dir: str = "runs/ppo_vs_grpo",
    verbose: bool = True,
    ppo_overrides: dict | None = None,
    fresh_processes: bool = True,
    **config_overrides,
) -> dict:
    """GRPO and PPO over several seeds, each with its learning rate picked on a validation split.

    1. For each algorithm, every learning rate of the same grid is trained with the tuning seeds and scored
       on `validation_size` training problems held back from training (tune_learning_rate). The test set is
       not looked at.
    2. The best learning rate of each is trained once per seed (seeds distinct from the tuning seeds), each
       run in a fresh process (run_algorithm: memory, time per step, accuracy on the test set every
       eval_steps).
    3. study_summary: mean and 95% t-interval over seeds, at equal completions and at equal wall-clock;
       bands: the same over the curves.

    `config_overrides` go to both algorithms, `ppo_overrides` to PPO's only (critic settings).
    fresh_processes=False runs the seeds in this process (a notebook's quick demo: no Python start-up per run);
    the peak memory is then not comparable (an earlier run's freed memory hides a later run's peak), and the
    table says so.
    """
    overlap = set(seeds) & set(tuning_seeds)
    if overlap:
        raise ValueError(f"seeds and tuning_seeds share {sorted(overlap)}: report on seeds not used for tuning.")
    common = dict(max_steps=max_steps, eval_steps=eval_steps, **config_overrides)
    study = dict(device=pick_device().type, model=model, seeds=list(seeds), tuning_seeds=list(tuning_seeds),
                 learning_rates=list(learning_rates), fresh_processes=fresh_processes, tuning={}, runs={})  # fmt: skip
    for algorithm in ALGORITHMS:
        overrides = {**common, **(ppo_overrides or {})} if algorithm == "ppo" else common
        arguments = dict(model=model, config_overrides=overrides, train_size=train_size, eval_size=eval_size,
                         output_dir=f"{output_dir}/tuning", validation_size=validation_size)  # fmt: skip
        tuning = tune_learning_rate(algorithm, list(learning_rates), list(tuning_seeds), arguments, verbose)
        study["tuning"][algorithm] = {
            "scores": {str(k): v for k, v in tuning["scores"].items()},
            "best": tuning["best"],
        }
        study["runs"][algorithm] = []
        for seed in seeds:
            started = time.perf_counter()
            arguments = dict(arguments, algorithm=algorithm, output_dir=f"{output_dir}/seed{seed}",
                             config_overrides={**overrides, "learning_rate": tuning["best"], "seed": seed})  # fmt: skip
            if fresh_processes:
                result = run_in_fresh_process("minigrpo.measure", "run_algorithm", arguments)
            else:
                result = run_algorithm(**arguments)
            study["runs"][algorithm].append(result)
            Path(output_dir).mkdir(parents=True, exist_ok=True)  # what has finished, should the rest not
            (Path(output_dir) / "partial.json").write_text(json.dumps(study))
            if verbose:
                accuracy = study["runs"][algorithm][-1]["accuracy"]
                print(f"{algorithm} seed {seed}: test accuracy {accuracy:.3f} ({time.perf_counter() - started:.0f} s)")
    study["summary"] = study_summary(study["runs"])
    study["bands"] = study_bands(study["runs"], study["summary"]["equal_time_seconds"])
    return study


def study_bands(runs: dict[str, list[dict]], seconds: float, points: int = 40) -> dict:
    """Curves with bands per algorithm: test accuracy against completions and against training seconds (up to
    the longest run), and the critic's explained variance against completions (PPO)."""
    longest = max(r["curve"]["seconds"][-1] for results in runs.values() for r in results)
    time_grid = [longest * i / (points - 1) for i in range(points)]
    bands = {}
    for name, results in runs.items():
        completions = [0, *results[0]["curve"]["completions"]]
        bands[name] = {
            "completions": band(results, "completions", "eval/accuracy", completions, "accuracy_before"),
            "seconds": band(results, "seconds", "eval/accuracy", time_grid, "accuracy_before"),
        }
        if all(v is not None for r in results for v in r["curve"]["values/explained_variance"]):
            bands[name]["explained_variance"] = band(
                results, "completions", "values/explained_variance", completions[1:]
            )
    bands["equal_time_seconds"] = seconds
    return bands


def format_study_table(study: dict) -> str:
    """The study as a plain-text table: mean +- 95% half-width over seeds, one column per algorithm."""
    summary = study["summary"]["algorithms"]
    names = list(summary)
    show = lambda i, digits: f"{i['mean']:.{digits}f} +- {i['half_width']:.{digits}f}"  # noqa: E731
    count = lambda s, kind: sum(m[kind] for m in s["params"].values())  # noqa: E731
    rows = [
        ("learning rate (validation)", *[f"{summary[n]['learning_rate']:g}" for n in names]),
        ("models in memory", *[" + ".join(summary[n]["params"]) for n in names]),
        ("trainable parameters", *[f"{count(summary[n], 'trainable'):,}" for n in names]),
        ("frozen parameters", *[f"{count(summary[n], 'frozen'):,}" for n in names]),
        ("peak memory (MiB)", *[show(summary[n]["peak_memory_mib"], 1) for n in names]),
    ]
    for part in ("rollout", "scoring", "update"):
        rows.append((f"s/step {part}", *[show(summary[n]["seconds_per_step"][part], 3) for n in names]))
    rows += [
        ("test accuracy before", *[show(summary[n]["accuracy_before"], 3) for n in names]),
        (f"test acc. @ {summary[names[0]]['completions']:,} completions",
         *[show(summary[n]["accuracy_equal_completions"], 3) for n in names]),
        (f"test acc. @ {study['summary']['equal_time_seconds']:.0f} s of training",
         *[show(summary[n]["accuracy_equal_time"], 3) for n in names]),
        ("critic explained variance", *[show(summary[n]["explained_variance_final"], 3)
                                       if "explained_variance_final" in summary[n] else "-" for n in names]),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    seeds = len(study["seeds"])
    lines = [f"{'':{width}}  " + "  ".join(f"{n.upper():>20}" for n in names)]
    lines += [f"{r[0]:{width}}  " + "  ".join(f"{v:>20}" for v in r[1:]) for r in rows]
    lines.append(f"mean +- 95% t-interval over {seeds} seeds ({study['device']}, model {study['model']})")
    if not study.get("fresh_processes", True):
        lines.append("peak memory NOT comparable: all runs shared one process (use fresh_processes=True)")
    return "\n".join(lines)


def study_headline(study: dict) -> dict:
    """The last printed line of bench/ppo_vs_grpo.py: accuracy intervals, memory, explained variance."""
    summary = study["summary"]["algorithms"]
    interval = lambda i: [round(i["low"], 4), round(i["high"], 4)]  # noqa: E731
    return {
        "grpo_accuracy": round(summary["grpo"]["accuracy_equal_completions"]["mean"], 4),
        "ppo_accuracy": round(summary["ppo"]["accuracy_equal_completions"]["mean"], 4),
        "grpo_accuracy_ci": interval(summary["grpo"]["accuracy_equal_completions"]),
        "ppo_accuracy_ci": interval(summary["ppo"]["accuracy_equal_completions"]),
        "grpo_accuracy_equal_time_ci": interval(summary["grpo"]["accuracy_equal_time"]),
        "ppo_accuracy_equal_time_ci": interval(summary["ppo"]["accuracy_equal_time"]),
        "grpo_peak_mem": round(summary["grpo"]["peak_memory_mib"]["mean"] * 2**20),
        "ppo_peak_mem": round(summary["ppo"]["peak_memory_mib"]["mean"] * 2**20),
        "peak_memory_ratio": round(
            summary["grpo"]["peak_memory_mib"]["mean"] / summary["ppo"]["peak_memory_mib"]["mean"], 3
        ),
        "critic_explained_variance_final": round(summary["ppo"]["explained_variance_final"]["mean"], 4),
        "seeds": len(study["seeds"]),
        "device": study["device"],
        "model": study["model"],
    }

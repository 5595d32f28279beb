"""The PPO-vs-GRPO study of bench/ppo_vs_grpo.py and lesson 05: several seeds, each algorithm's learning rate tuned
on a validation split of the training problems, accuracy at equal completions and at equal wall-clock, t-intervals
(minigrpo.measuring.intervals) and bands. Each run is minigrpo.measuring.measure.run_algorithm in a fresh process."""

from __future__ import annotations

import json
import time
from pathlib import Path

from minigrpo.measuring.intervals import band, mean_interval, value_at
from minigrpo.measuring.measure import ALGORITHMS, run_algorithm, run_in_fresh_process
from minigrpo.models import pick_device


# --- several seeds: intervals, tuning on a validation split, equal completions and equal time -------------------
def study_summary(runs: dict[str, list[dict]], last_steps: int = 5) -> dict:
    """Per algorithm, over its seeds: mean and 95% interval of held-out accuracy at equal completions (the end
    of every run) and at equal wall-clock, peak memory, seconds per step (rollout / scoring / update), the
    critic's explained variance (mean of its last `last_steps` steps), and the parameter counts.

    Equal wall-clock: tau = the longest run of the faster algorithm (training seconds, evaluation excluded).
    Every run is read at its last evaluation at or before tau, so the faster algorithm is read at its end
    and the slower one wherever it had got to by then (value_at). With both algorithms and the same seeds,
    "ppo_minus_grpo": the interval of the per-seed difference at each budget (paired by seed).
    """
    total_seconds = {name: [r["curve"]["seconds"][-1] for r in results] for name, results in runs.items()}
    faster = min(total_seconds, key=lambda name: sum(total_seconds[name]) / len(total_seconds[name]))
    tau = max(total_seconds[faster])
    summary = {"equal_time_seconds": tau, "faster": faster, "algorithms": {}}
    per_seed = {}
    for name, results in runs.items():
        at_tau = [
            value_at(r["curve"]["seconds"], r["curve"]["eval_accuracy"], tau, r["accuracy_before"]) for r in results
        ]
        per_seed[name] = [{"end": r["accuracy"], "tau": t} for r, t in zip(results, at_tau, strict=True)]
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
    if set(runs) == set(ALGORITHMS) and len(runs["grpo"]) == len(runs["ppo"]):
        # Paired by seed: for one seed both saw the same prompts in the same order, so the per-seed difference
        # cancels what the seed does to both (a tighter interval than comparing the two intervals).
        summary["ppo_minus_grpo"] = {
            budget: mean_interval([p[key] - g[key] for p, g in zip(per_seed["ppo"], per_seed["grpo"], strict=True)])
            for budget, key in (("equal_completions", "end"), ("equal_time", "tau"))
        }
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


# The study's two sizes (bench/ppo_vs_grpo.py and lesson 05): "full" is the measurement (how long it takes:
# docs/performance.md), "quick" only shows the plumbing (its numbers mean nothing). Both algorithms at a constant
# learning rate, each tuned on the validation split: the protocol lesson 05's table was measured with (the tiny
# preset's own schedule decays to 0 over a run's steps).
STUDY_SETTINGS = {
    "full": dict(seeds=[0, 1, 2, 3, 4], learning_rates=[1e-4, 3e-4, 1e-3], tuning_seeds=[100], max_steps=30,
                 eval_steps=5, prompts_per_step=16, train_size=2000, validation_size=200, eval_size=200,
                 lr_scheduler_type="constant"),
    "quick": dict(seeds=[0, 1], learning_rates=[1e-4, 3e-4], tuning_seeds=[100], max_steps=2, eval_steps=1,
                  prompts_per_step=4, train_size=200, validation_size=16, eval_size=16, lr_scheduler_type="constant"),
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
                result = run_in_fresh_process("minigrpo.measuring.measure", "run_algorithm", arguments)
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
    """Curves with bands per algorithm: test accuracy against completions and against training seconds (each
    algorithm up to its own longest run: a run that has ended is not shown going on), and the critic's explained
    variance against completions (PPO)."""
    longest = max(r["curve"]["seconds"][-1] for results in runs.values() for r in results)
    time_grid = [longest * i / (points - 1) for i in range(points)]
    bands = {}
    for name, results in runs.items():
        completions = [0, *results[0]["curve"]["completions"]]
        own_longest = max(r["curve"]["seconds"][-1] for r in results)
        own_grid = [x for x in time_grid if x < own_longest] + [own_longest]
        bands[name] = {
            "completions": band(results, "completions", "eval_accuracy", completions, "accuracy_before"),
            "seconds": band(results, "seconds", "eval_accuracy", own_grid, "accuracy_before"),
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
        *[(f"PPO - GRPO, paired, {budget.replace('_', ' ')}", "", show(difference, 3))
          for budget, difference in study["summary"].get("ppo_minus_grpo", {}).items()],
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
        "ppo_minus_grpo_accuracy_ci": interval(study["summary"]["ppo_minus_grpo"]["equal_completions"]),
        "ppo_minus_grpo_accuracy_equal_time_ci": interval(study["summary"]["ppo_minus_grpo"]["equal_time"]),
        "critic_explained_variance_final": round(summary["ppo"]["explained_variance_final"]["mean"], 4),
        "seeds": len(study["seeds"]),
        "device": study["device"],
        "model": study["model"],
    }

"""PPO vs GRPO over several seeds, each algorithm's learning rate picked on a validation split of the training problems.

Runs on any CPU (the tiny Qwen) or any CUDA machine, from a checkout of the repository after
`pip install -e ".[bench]"`:

    python bench/ppo_vs_grpo.py                    # tiny Qwen on the CPU: 5 seeds x 2 algorithms + tuning, ~17 min
    python bench/ppo_vs_grpo.py --quick            # 2 seeds, 2 steps, in this process: the plumbing in seconds
    python bench/ppo_vs_grpo.py --model qwen0.5b-shape --learning-rates 1e-6 --steps 10   # Qwen's shape (GPU)

Protocol (minigrpo.measuring.study.compare_with_seeds):
1. Tuning. For each algorithm, each learning rate of the same grid (--learning-rates) is trained with the tuning
   seed(s) and scored by greedy accuracy on --validation-size problems held back from the *training* problems
   (minigrpo.measuring.measure.training_problems: no copy of them is trained on). The test set is never looked at.
2. Seeds. Each algorithm at its chosen learning rate, once per seed (--seeds, distinct from the tuning seeds), each
   run in a fresh Python process so that one's freed memory cannot hide another's peak (--quick: in this one).
3. Both algorithms see the same prompts in the same order for a given seed, generate the same N = B x G completions
   per step with the same sampling code, and are scored by the same rewards (correctness + 0.1 x format). Compared
   at equal sampled completions (the end of every run) and at equal wall-clock (the faster algorithm's longest run,
   tau: every run is read at its last evaluation before tau).

Reported, as mean +- 95% t-interval over seeds (minigrpo.measuring.intervals): held-out test accuracy (at equal
completions and at equal time), peak memory (GPU: max_memory_allocated; CPU: peak RSS above the RSS before the model was
loaded), seconds per step (rollout / scoring / update), parameters (trainable, frozen), and for PPO the critic's
explained variance (mean of its last 5 steps, measured on each fresh rollout before the update).

Writes <out>/ppo_vs_grpo_seeds.json (every run's numbers and curves, the tuning scores, the summary) and
<out>/ppo_vs_grpo_seeds.png (curves with bands). The last printed line is one JSON object with grpo_accuracy_ci,
ppo_accuracy_ci (95% intervals at equal completions), their equal-time twins, peak memory, and
critic_explained_variance_final.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from minigrpo.measuring.study import STUDY_SETTINGS, compare_with_seeds, format_study_table, study_headline


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny | qwen0.5b-shape | a Hub id or local path")
    parser.add_argument(
        "--quick", action="store_true", help="2 seeds, 2 steps, small sets, in this process: the plumbing only"
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per algorithm (full: 5)")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=None, help="the grid (full: 1e-4 3e-4 1e-3)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (full: 30)")
    parser.add_argument("--eval-steps", type=int, default=None, help="test accuracy every this many steps (full: 5)")
    parser.add_argument("--prompts", type=int, default=None, help="B, prompts per step (full: 16); G = 8")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out test problems (full: 200)")
    parser.add_argument("--validation-size", type=int, default=None, help="training problems held back (full: 200)")
    parser.add_argument("--out", default="runs/ppo_vs_grpo", help="folder for the JSON, the PNG and the runs")
    return parser.parse_args(argv)


def settings(args: argparse.Namespace) -> dict:
    """compare_with_seeds's arguments: STUDY_SETTINGS["full"] or ["quick"], with the command line's values on top."""
    chosen = dict(STUDY_SETTINGS["quick" if args.quick else "full"])
    given = dict(max_steps=args.steps, eval_steps=args.eval_steps, prompts_per_step=args.prompts,
                 eval_size=args.eval_size, validation_size=args.validation_size,
                 learning_rates=args.learning_rates)  # fmt: skip
    chosen.update({k: v for k, v in given.items() if v is not None})
    if args.seeds is not None:
        chosen["seeds"] = list(range(args.seeds))
    if len(chosen["seeds"]) < 2:
        raise SystemExit(f"--seeds {len(chosen['seeds'])}: an interval needs at least 2 seeds (5 to rank anything).")
    return chosen


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    started = time.perf_counter()
    # --quick runs in this process as lesson 05's quick mode does: no Python start-up per run (its memory
    # figures are then not comparable, and the table says so)
    study = compare_with_seeds(
        model=args.model, output_dir=str(out / "runs"), fresh_processes=not args.quick, **settings(args)
    )
    study["wall_seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "ppo_vs_grpo_seeds.json").write_text(json.dumps(study, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    from minigrpo.course.plots import plot_curves_with_bands

    plot_curves_with_bands(study).savefig(out / "ppo_vs_grpo_seeds.png", dpi=120, bbox_inches="tight")
    print(format_study_table(study))
    print(
        f"wrote {out / 'ppo_vs_grpo_seeds.json'} and {out / 'ppo_vs_grpo_seeds.png'} in {study['wall_seconds']:.0f} s"
    )
    print(json.dumps(study_headline(study)))
    return study


if __name__ == "__main__":
    main()

"""PPO vs GRPO on the same model, task, prompts and number of generated completions per step.

Runs on any CPU (the tiny Qwen) or any CUDA machine, from a checkout of the repository after
`pip install -e ".[bench]"`:

    python bench/ppo_vs_grpo.py                                   # tiny Qwen on the CPU, a few minutes
    python bench/ppo_vs_grpo.py --steps 3 --eval-size 32          # a smoke run
    python bench/ppo_vs_grpo.py --model qwen0.5b-shape            # Qwen2.5-0.5B's shape, random weights (GPU, offline)
    python bench/ppo_vs_grpo.py --model Qwen/Qwen2.5-0.5B-Instruct   # the real model (GPU, needs the Hub)

What is the same. Both algorithms start from the same weights, see the same B prompts per step in the same
order, generate the same N = B x G completions per step with the same sampling code
(`minigrpo.rollout.sample_group_rollout`, called by the shared `Trainer.collect_rollout`), are scored by the same
reward functions (correctness + 0.1 x format, as `python -m minigrpo train`), use the same policy learning rate,
clip range, KL coefficient beta and reference model. What differs is the algorithm: GRPO's advantage is the
group-normalised reward with the KL in the loss; PPO's comes from a critic (a copy of the policy's transformer with
a scalar head, trained alongside) through GAE, with the KL inside the per-token reward.

What is measured (see `minigrpo.measure.run_algorithm`), each algorithm in a fresh Python process so that one's freed
memory cannot hide the other's peak:
- parameters held in memory, trainable and frozen, per model (policy, reference, critic);
- peak memory. GPU: torch.cuda.max_memory_allocated() since just before the model was loaded. CPU: the peak resident
  set size (VmHWM, reset through /proc/self/clear_refs just before the model is loaded) minus the RSS at that moment,
  i.e. what the models, optimizer state, activations and generation added on top of Python + torch + the datasets,
  which are the same for both. (A whole-process RSS would add ~400 MB of libraries to both and hide the ratio.);
- seconds per step: rollout (generation + reference log-probs), scoring (reward functions; for PPO also the
  critic's values, the policy's log-probs for the KL-in-reward, and GAE), update (the gradient passes);
- held-out greedy accuracy and mean training reward against completions generated.

Writes <out>/ppo_vs_grpo.json (the results dict) and <out>/ppo_vs_grpo.png; the last printed line is one JSON
object: grpo_peak_mem, ppo_peak_mem (bytes), peak_memory_ratio (GRPO / PPO), grpo_accuracy, ppo_accuracy, ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from minigrpo.measure import compare_ppo_grpo, format_table, summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny | qwen0.5b-shape | a Hub id or local path")
    parser.add_argument("--steps", type=int, default=None, help="training steps (tiny: 60, else 10)")
    parser.add_argument("--eval-steps", type=int, default=None, help="evaluate every this many steps")
    parser.add_argument("--prompts", type=int, default=None, help="B, prompts per step (preset's default)")
    parser.add_argument("--generations", type=int, default=None, help="G, completions per prompt (preset: 8)")
    parser.add_argument("--max-completion-length", type=int, default=None, help="T_max (preset's default)")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out problems (tiny: 200, else 64)")
    parser.add_argument("--out", default="runs/ppo_vs_grpo", help="folder for the JSON, the PNG and the runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    tiny = args.model == "tiny"
    steps = args.steps if args.steps is not None else (60 if tiny else 10)
    overrides = {
        "prompts_per_step": args.prompts,
        "num_generations": args.generations,
        "max_completion_length": args.max_completion_length,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    out = Path(args.out)
    results = compare_ppo_grpo(
        model=args.model,
        max_steps=steps,
        eval_steps=args.eval_steps if args.eval_steps is not None else max(1, steps // 4),
        eval_size=args.eval_size if args.eval_size is not None else (200 if tiny else 64),
        output_dir=str(out / "runs"),
        **overrides,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "ppo_vs_grpo.json").write_text(json.dumps(results, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    from minigrpo.plots import plot_ppo_vs_grpo

    plot_ppo_vs_grpo(results).savefig(out / "ppo_vs_grpo.png", dpi=120, bbox_inches="tight")
    print(format_table(results))
    print(f"wrote {out / 'ppo_vs_grpo.json'} and {out / 'ppo_vs_grpo.png'}")
    print(json.dumps(summary(results)))
    return results


if __name__ == "__main__":
    main()

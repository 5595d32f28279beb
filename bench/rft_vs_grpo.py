"""Filtering your own samples (rejection-sampling fine-tuning, expert iteration) against GRPO (lesson 06b).

    python bench/rft_vs_grpo.py            # 5 seeds x {before, RFT, GRPO}: 30 steps of 8 prompts x G=8 each,
                                           # 100 held-out problems, 16 samples each (about 12 min on 2 CPU cores)
    python bench/rft_vs_grpo.py --quick    # seconds: 2 seeds, 2 steps of 2 prompts x G=4 (of 64 training
                                           # problems), 4 problems x 4 samples

Both start from the bundled tiny Qwen with the same prompts, order, number of sampled completions per step,
learning rate and schedule (GRPOConfig.tiny_cpu at the sizes above; RFT with beta 0, it has no KL term). Each run
is scored on the same held-out problems: greedy accuracy, and pass@k / maj@k (k = 1, 2, 4, ..., n) from n samples;
intervals are 95% percentile bootstraps over seeds and problems (minigrpo.measuring.intervals.bootstrap_interval),
and RFT - GRPO is bootstrapped seed by seed. Each run is a fresh process (its peak RSS is its own); --quick runs in
this one. The last line printed is the figures as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from minigrpo.measuring.filtering_vs_rl import compare, format_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="training seeds (>= 2)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    parser.add_argument("--prompts", type=int, default=8, help="B, prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="G, completions per prompt")
    parser.add_argument("--problems", type=int, default=100, help="held-out problems (at most 200)")
    parser.add_argument("--samples", type=int, default=16, help="n, samples per held-out problem (k goes up to n)")
    parser.add_argument("--json-out", default=None, help="also write the runs and the summary to this JSON file")
    parser.add_argument("--quick", action="store_true", help="seconds: the smallest run of every part, in-process")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.prompts, args.generations, args.problems, args.samples = [0, 1], 2, 2, 4, 4, 4
    if len(args.seeds) < 2 or not 1 <= args.problems <= 200:
        parser.error("give at least 2 --seeds and 1 <= --problems <= 200")
    started = time.perf_counter()
    result = compare(args.seeds, args.steps, args.prompts, args.generations, args.problems, args.samples,
                     train_size=64 if args.quick else 2000, fresh_processes=not args.quick)  # fmt: skip
    summary = result["summary"]
    print(format_table(summary))
    print(f"({time.perf_counter() - started:.0f} s; seeds {args.seeds}, {args.steps} steps of {args.prompts} x "
          f"G={args.generations}, {args.problems} problems x {args.samples} samples)")  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    figures = {"seeds": args.seeds, "steps": args.steps, "ks": summary["ks"], **summary}
    print(json.dumps(figures))  # the last line: the figures, for scripts (tests/test_bench.py reads it)
    return 0


if __name__ == "__main__":
    sys.exit(main())

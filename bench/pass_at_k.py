"""pass@k and maj@k before and after GRPO: what RL changes (lesson 06; DeepSeekMath, arXiv 2402.03300, 5.2.2).

    python -m minigrpo train                           # the default run: the tiny Qwen -> runs/minigrpo/final
    python bench/pass_at_k.py runs/minigrpo/final      # 100 held-out problems, 64 samples each, k = 1..64
    python bench/pass_at_k.py --quick                  # seconds: the tiny Qwen against itself, 2 problems x 4

Each held-out problem is sampled n times, at the preset's temperature, from the model before training
(--before, default the bundled tiny Qwen) and after it (the folder given); the script prints pass@k (any of k
samples right: Chen et al.'s unbiased estimate from the n) and maj@k (the majority vote of k samples right, exact
over every subset of the n) for k = 1, 2, 4, ..., n, averaged over the problems. Lesson 06 runs the same on its
own model and cites this script's figures for its full run. The last line printed is the figures as one JSON
object (ks, problems, samples, before, after).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from minigrpo import GRPOConfig, load_model_and_tokenizer, make_arithmetic_dataset
from minigrpo.run.evaluation import pass_and_maj_at_k, sample_answers


def measure(before: str, after: str, problems: int, samples: int, seed: int = 0) -> dict:
    """{"ks": [...], "before": {"pass@k": [...], "maj@k": [...]}, "after": {...}} on `problems` held-out sums."""
    dataset = make_arithmetic_dataset(200, "test").select(range(problems))  # lesson 06's held-out problems
    truths = [int(answer) for answer in dataset["answer"]]
    ks = [k for k in (2**i for i in range(samples.bit_length())) if k <= samples]
    result = {"ks": ks, "problems": problems, "samples": samples}
    config = GRPOConfig.for_model(before)  # the preset the run trained with: its temperature and lengths
    for label, name in (("before", before), ("after", after)):
        model, tokenizer = load_model_and_tokenizer(name)
        answers = sample_answers(model, tokenizer, list(dataset["prompt"]), samples, config, seed=seed)
        result[label] = pass_and_maj_at_k(answers, truths, ks)
    return result


def report(result: dict) -> str:
    lines = [
        f"{result['problems']} held-out problems, {result['samples']} samples each",
        f"{'k':>4}  {'pass@k before':>13} {'after':>6}  {'maj@k before':>12} {'after':>6}",
    ]
    for i, k in enumerate(result["ks"]):
        before, after = result["before"], result["after"]
        lines.append(
            f"{k:>4}  {before['pass@k'][i]:>13.3f} {after['pass@k'][i]:>6.3f}  "
            f"{before['maj@k'][i]:>12.3f} {after['maj@k'][i]:>6.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("after", nargs="?", help="the trained model: a folder (a run's final/) or a Hub id")
    parser.add_argument("--before", default="tiny", help='the model before training (default "tiny")')
    parser.add_argument("--problems", type=int, default=100, help="held-out problems (at most 200)")
    parser.add_argument("--samples", type=int, default=64, help="n, samples per problem (k goes up to n)")
    parser.add_argument("--json-out", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="the tiny Qwen against itself, 2 problems x 4 samples")
    args = parser.parse_args(argv)
    if args.quick:
        args.after, args.problems, args.samples = args.after or args.before, 2, 4
    if args.after is None:
        parser.error("give the trained model (a run's final/ folder or a Hub id), or --quick")
    if not 1 <= args.problems <= 200 or args.samples < 1:
        parser.error("give 1 <= --problems <= 200 and --samples >= 1")
    started = time.perf_counter()
    result = measure(args.before, args.after, args.problems, args.samples)
    print(report(result))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))  # the last line: the figures, for scripts (tests/test_bench.py reads it)
    return 0


if __name__ == "__main__":
    sys.exit(main())

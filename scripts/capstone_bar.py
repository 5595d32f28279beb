"""Measure the capstone's learning bar: the package's own GRPOTrainer on the learning check's run, seed by seed.

    python scripts/capstone_bar.py            # seeds 0-4
    python scripts/capstone_bar.py --seeds 0 1 2 3 4 5 6 7

Each seed draws the run as the grader's seed does: torch's seed, the training problems and the 200 held-out problems
(`capstone_learning_data`). Prints the greedy accuracy on the held-out problems before and after each seed's run, its
rise and its time, then the worst rise: exercise 12's bar (minigrpo.grading.checks.labs.CAPSTONE_LEARNING) must
sit below it. One thread per run, as the grader runs the tiny model. The grader draws 31-bit seeds: any seed is one it
may draw (`--seeds 438317370 1433166778`).
"""

from __future__ import annotations

import argparse
import time

from minigrpo.grading.checks.labs import CAPSTONE_LEARNING, reference_learning_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    settings = CAPSTONE_LEARNING
    print(
        f"{settings['max_steps']} steps of {settings['prompts_per_step']} prompts x G=8, lr "
        f"{settings['learning_rate']:g}, accuracy on {settings['eval_problems']} problems of the "
        f"{settings['eval_split']!r} split"
    )
    rises = []
    for seed in args.seeds:
        started = time.perf_counter()
        before, after = reference_learning_run(settings, seed)
        rises.append(after - before)
        seconds = time.perf_counter() - started
        print(f"seed {seed}: {before:.3f} -> {after:.3f} ({after - before:+.3f}) in {seconds:.0f} s", flush=True)
    print(f"worst rise {min(rises):+.3f}; the bar in CAPSTONE_LEARNING is {settings['bar']:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

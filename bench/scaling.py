"""How the cost of a GRPO step grows with the group size G and the completion length T: minigrpo vs TRL.

    python bench/scaling.py            # G in {4, 8, 16} x T in {32, 64, 128}, 4 prompts, 4 steps a cell (CPU: minutes)
    python bench/scaling.py --quick    # G in {2, 4} x T in {4, 8}, 2 prompts, 2 steps: the plumbing (a test)
    python bench/scaling.py --generations 4 8 16 32 --lengths 64 --steps 6

Needs the `bench` extra (`pip install -e ".[bench]"`: trl and accelerate), as bench/vs_trl.py does.

Each cell (G, T) is one run of bench/vs_trl.py's comparison (its `run_pair`, `minigrpo_config` and `summarize`):
both trainers in their own worker process, stepping in turn A B A B so both see the same machine load, the same
prompts, reward and hyper-parameters (the tiny CPU preset at B prompts x G completions, one micro-batch, beta
0.04), one thread each on a CPU. A cell's step time is the median over its steps after the first two (warm-up),
by wall clock and by the worker's CPU time; on a machine shared with other work the CPU-time figures are the
steadier ones.

Completions of exactly T tokens. The trained tiny Qwen stops at its end-of-turn token after about 20 tokens, so
a limit of 128 would not cost 128 tokens. Both trainers therefore load one model, written to a temporary folder
with the tiny Qwen's tokenizer: a randomly initialised model of the tiny Qwen's shape (`build_tiny_model`,
seed 0) whose stop tokens (the tokens both trainers stop at: the generation config's eos ids and the
tokenizer's eos) have probability exactly 0 (`make_stop_tokens_unreachable` edits a few weights; the shape,
parameter count and work of a forward pass are the tiny Qwen's). So every completion runs to T in both, whatever
their sampling code, and the table prints each trainer's mean completion length per cell to show it. Its
answers are random, so the rewards are nearly all 0; neither trainer skips work for that (beta > 0 puts a KL
term in every completion's loss, and both run the loss and its backward over every completion).

The growth exponent: each trainer's step time t is fitted as t ~ G^a T^b by least squares on log t over the
cells (on a full grid, a is the slope of log t against log G and b the slope against log T). a = 1 means
twice the group costs twice the time; b above 1 means longer completions cost more per token (attention over a
longer context); fixed costs per step pull both below 1.

The last line printed is one JSON object; its keys are listed in docs/performance.md, and `tests/test_bench.py`
runs `--quick` and checks them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/vs_trl.py, whose comparison each cell runs

import torch  # noqa: E402
import vs_trl  # noqa: E402

from minigrpo.measuring.measure import make_stop_tokens_unreachable, print_summary  # noqa: E402
from minigrpo.models import TINY_MODEL_DIR, build_tiny_model  # noqa: E402
from minigrpo.tokenization import load_tokenizer  # noqa: E402

TRAINERS = vs_trl.TRAINERS
QUICK = dict(generations=[2, 4], lengths=[4, 8], prompts=2, steps=2)
"""--quick: four cells of 2 prompts, 2 steps each (the plumbing: two worker processes a cell, the timings mean
nothing)."""


def prepare_full_length_model(folder: Path) -> str:
    """Write the random-init tiny-Qwen-shaped model that never stops, and the tiny tokenizer, to `folder`."""
    tokenizer = load_tokenizer(TINY_MODEL_DIR)
    model = build_tiny_model(tokenizer, seed=0)
    stop_token_ids = sorted(set(model.generation_config.eos_token_id) | {tokenizer.eos_token_id})
    make_stop_tokens_unreachable(model, stop_token_ids)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def cell_arguments(args, generations: int, length: int) -> argparse.Namespace:
    """bench/vs_trl.py's settings for one cell: the tiny preset at B prompts x G, T tokens, both trainers."""
    argv = ["--model", "tiny", "--prompts", str(args.prompts), "--generations", str(generations),
            "--max-completion-length", str(length), "--steps", str(args.steps),
            "--threads", str(args.threads)]  # fmt: skip
    return vs_trl.build_parser().parse_args(argv)


def measure_cell(args, path: str, device: str, workdir: str, generations: int, length: int) -> dict:
    """One cell's figures: each trainer's median wall and CPU seconds per step and mean completion length, and
    the ratios minigrpo / TRL."""
    results = vs_trl.run_pair(cell_arguments(args, generations, length), path, device, workdir)
    completions = args.prompts * generations
    cell = {"generations": generations, "max_completion_length": length}
    for kind in TRAINERS:
        cell[f"{kind}_step_time"] = results[kind]["step_time"]
        cell[f"{kind}_cpu_time"] = results[kind]["cpu_time"]
        cell[f"{kind}_mean_length"] = results[kind]["tokens_per_step"] / completions
    cell["step_time_ratio"] = cell["minigrpo_step_time"] / cell["trl_step_time"]
    cell["cpu_time_ratio"] = cell["minigrpo_cpu_time"] / cell["trl_cpu_time"]
    return cell


def growth_exponent(sizes: list[float], seconds: list[float]) -> float:
    """The least-squares slope of log(seconds) against log(sizes): t ~ size^slope. Needs two distinct sizes."""
    xs, ys = [math.log(s) for s in sizes], [math.log(t) for t in seconds]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError(f"a growth exponent needs at least two different sizes, got {sorted(set(sizes))}")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def exponents(cells: list[dict]) -> dict:
    """Each trainer's exponents against G and against T, by wall time and by CPU time."""
    found = {}
    for kind in TRAINERS:
        for figure, suffix in (("step_time", ""), ("cpu_time", "_cpu")):
            seconds = [cell[f"{kind}_{figure}"] for cell in cells]
            for size, name in (("generations", "g"), ("max_completion_length", "length")):
                found[f"{kind}_{name}_exponent{suffix}"] = growth_exponent([c[size] for c in cells], seconds)
    return found


def print_tables(cells: list[dict], found: dict, generations: list[int], lengths: list[int]) -> None:
    """The ratio table, each trainer's seconds per step with its mean completion length, and the exponents: one row
    per G, one column per T."""
    by_cell = {(c["generations"], c["max_completion_length"]): c for c in cells}
    header = f"{'':<7}" + "".join(f"{f'T={t}':>22}" for t in lengths)
    tables = (
        ("minigrpo / TRL step time, wall (CPU)", "{step_time_ratio:.3f} ({cpu_time_ratio:.3f})"),
        ("minigrpo s/step, wall (CPU) [mean length]", "{minigrpo_step_time:.3f} ({minigrpo_cpu_time:.3f}) "
         "[{minigrpo_mean_length:.0f}]"),
        ("TRL s/step, wall (CPU) [mean length]", "{trl_step_time:.3f} ({trl_cpu_time:.3f}) [{trl_mean_length:.0f}]"),
    )  # fmt: skip
    for title, cell_format in tables:
        print(f"\n{title}\n{header}")
        for g in generations:
            print(f"{f'G={g}':<7}" + "".join(f"{cell_format.format(**by_cell[g, t]):>22}" for t in lengths))
    print("\ngrowth exponents (step time ~ G^a T^b, least squares over the cells)")
    print(f"{'':<10}{'a (G)':>9}{'b (T)':>9}{'a CPU':>9}{'b CPU':>9}")
    for kind in TRAINERS:
        keys = ("g_exponent", "length_exponent", "g_exponent_cpu", "length_exponent_cpu")
        print(f"{kind:<10}" + "".join(f"{found[f'{kind}_{key}']:>9.3f}" for key in keys))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generations", type=int, nargs="+", default=[4, 8, 16], help="the values of G")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128], help="the max_completion_lengths")
    parser.add_argument("--prompts", type=int, default=4, help="B, prompts per step in every cell")
    parser.add_argument("--steps", type=int, default=4, help="steps per trainer per cell; medians over steps 3..N")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--quick", action="store_true", help="G in {2, 4} x T in {4, 8}, 2 prompts, 2 steps")
    parser.add_argument("--json-out", default=None, help="also write the final JSON object here")
    return parser


def check_arguments(args) -> None:
    """Stop with a message that says what to change before any worker starts."""
    if args.steps < 1 or args.prompts < 1:
        raise SystemExit(f"--steps and --prompts must be at least 1, got {args.steps} and {args.prompts}")
    for name in ("generations", "lengths"):
        values = getattr(args, name)
        if len(set(values)) < 2 or min(values) < 1:
            raise SystemExit(f"--{name} needs at least two different positive values (an exponent is a slope), "
                             f"got {values}")  # fmt: skip
    if min(args.generations) < 2:
        raise SystemExit(f"--generations: a group needs G >= 2 completions, got {args.generations}")
    if max(args.lengths) > 256:
        raise SystemExit(f"--lengths: the tiny Qwen's 512 positions hold a 256-token prompt and at most 256 new "
                         f"tokens, got {max(args.lengths)}")  # fmt: skip


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    check_arguments(args)
    grid = [(g, t) for g in args.generations for t in args.lengths]
    cells = []
    with tempfile.TemporaryDirectory() as workdir:
        path = prepare_full_length_model(Path(workdir) / "model")
        for number, (generations, length) in enumerate(grid, start=1):
            print(f"\ncell {number}/{len(grid)}: G={generations}, T={length}, {args.prompts} prompts, "
                  f"{args.steps} steps each on {args.device}", flush=True)  # fmt: skip
            cell_folder = f"{workdir}/cell-{number}"  # each cell's trainers write a fresh output_dir
            cells.append(measure_cell(args, path, args.device, cell_folder, generations, length))
    found = exponents(cells)
    print_tables(cells, found, args.generations, args.lengths)
    summary = {
        "model": "tiny-qwen-shape, random init, stop tokens unreachable",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)",
        "prompts": args.prompts,
        "steps": args.steps,
        "threads": args.threads,
        "generations": args.generations,
        "completion_lengths": args.lengths,
        "cells": cells,
        **found,
    }
    print_summary(summary, args.json_out)
    return summary


if __name__ == "__main__":
    main()

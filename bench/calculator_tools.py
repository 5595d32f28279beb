"""Does GRPO teach the tiny tools model to use its calculator? Against a control with the calculator switched off.

    python bench/calculator_tools.py            # 3 seeds x {calculator, control}: GRPOConfig.tiny_tools_cpu()
                                                # (30 steps of 8 prompts x G=8), 100 held-out problems x 8 samples
    python bench/calculator_tools.py --quick    # seconds: 1 seed, 1 step of 2 prompts x G=4, 4 problems x 2 samples

Both arms start from the bundled tools model ("tiny-tools") with the same prompts, seeds and config; the control's
calculator has the same name and prompt but every call's result is an error, so what the control gains does not come
from the tool. Before and after, each arm is scored in its own world on the same held-out problems: sampled accuracy
and tool-call rate (the share of episodes with a call), and greedy accuracy (minigrpo.measuring.tool_use). The last
line printed is the figures as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from minigrpo.config import GRPOConfig
from minigrpo.measuring.tool_use import compare, format_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the preset's, 30)")
    parser.add_argument("--problems", type=int, default=100, help="held-out problems")
    parser.add_argument("--samples", type=int, default=8, help="sampled episodes per held-out problem")
    parser.add_argument("--json-out", default=None, help="also write the runs and the summary to this JSON file")
    parser.add_argument("--quick", action="store_true", help="seconds: the smallest run of every part")
    args = parser.parse_args(argv)
    overrides = dict(eval_strategy="no", save_strategy="no", logging_steps=1)
    if args.quick:
        args.seeds, args.steps, args.problems, args.samples = [0], 1, 4, 2
        overrides.update(prompts_per_step=2, num_generations=4)
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    config = GRPOConfig.tiny_tools_cpu(**overrides)
    started = time.perf_counter()
    result = compare(args.seeds, config, args.problems, args.samples, train_size=64 if args.quick else 2000)
    summary = result["summary"]
    print(format_table(summary))
    print(f"({time.perf_counter() - started:.0f} s on {torch.get_num_threads()} threads; seeds {args.seeds}, "
          f"{config.max_steps} steps of {config.prompts_per_step} x G={config.num_generations}, {args.problems} "
          f"problems x {args.samples} samples)")  # fmt: skip
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    print(json.dumps({"seeds": args.seeds, "steps": config.max_steps, "problems": args.problems} | summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where one minigrpo step's time goes: each phase of the step, and how much of it is work and how much overhead.

    python bench/profile_step.py                 # tiny Qwen on the CPU, bench/vs_trl.py's step (16 prompts x G=8)
    python bench/profile_step.py --steps 8 --top 15
    python bench/profile_step.py --quick         # 2 steps of 2 prompts x G=4, 8 tokens: the plumbing (a test)

The step is bench/vs_trl.py's (the same config: `minigrpo_config`), run by GRPOTrainer's own `collect_rollout` and
`update`, one torch thread. It is timed twice:

1. **Phases**, by the wall clock, without a profiler (a profiler slows every operator down): sampling (`generate`
   with minigrpo's sampler), scoring (the reference model's log-probs), the rest of the rollout (tokenizing,
   decoding, rewards, metrics), then the update's forward pass (the policy's log-probs), backward, and the rest of
   the update (loss, clipping, AdamW). Medians over steps 2..N (step 1 warms up).
2. **Work and overhead**, under torch.profiler, phase by phase: the time spent inside PyTorch's operators (aten::*,
   self time: the tensors' arithmetic and copies) against the phase's whole time; the rest is Python and framework
   code around them (modules' __call__, transformers' mask and cache bookkeeping, the sampler's and the trainer's
   own Python). The profiler's own cost lands in the overhead, so read the split as an upper bound on overhead.

The last line printed is one JSON object (keys in docs/performance.md).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import minigrpo.rollout  # noqa: E402
from minigrpo import GRPOTrainer  # noqa: E402
from minigrpo.measuring.crosscheck import load_fp32, prompts_dataset  # noqa: E402
from minigrpo.models import TINY_MODEL_DIR  # noqa: E402
from minigrpo.tasks.arithmetic import correctness_reward  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # noqa: E402  (the very step vs_trl.py times)

PHASES = ("sampling", "scoring", "rollout, other", "update: forward", "update: backward", "update, other")


class PhaseClock:
    """Wall-clock seconds per phase of the current step; each phase is also a profiler range of its name."""

    def __init__(self):
        self.seconds = defaultdict(float)

    @contextlib.contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        with record_function(name):
            yield
        self.seconds[name] += time.perf_counter() - started

    def wrap(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            with self.phase(name):
                return function(*args, **kwargs)

        return timed


def instrument(trainer: GRPOTrainer, clock: PhaseClock) -> None:
    """Time the phases where they happen: the rollout's two model calls (module functions that
    sample_group_rollout looks up when it runs) and the trainer's forward and backward of the update."""
    minigrpo.rollout.generate_completions = clock.wrap("sampling", minigrpo.rollout.generate_completions)
    minigrpo.rollout.batched_per_token_logps = clock.wrap("scoring", minigrpo.rollout.batched_per_token_logps)
    trainer.policy_logps = clock.wrap("update: forward", trainer.policy_logps)
    trainer.backward = clock.wrap("update: backward", trainer.backward)


def one_step(trainer: GRPOTrainer, clock: PhaseClock) -> dict:
    """One generation: rollout, then update. -> {phase: seconds}, the 'other' phases being the remainders."""
    clock.seconds.clear()
    with clock.phase("rollout"):
        rollout, rewards, _ = trainer.collect_rollout()
    with clock.phase("update"):
        trainer.update(rollout, rewards)
    seconds = dict(clock.seconds)
    seconds["rollout, other"] = seconds["rollout"] - seconds["sampling"] - seconds.get("scoring", 0.0)
    seconds["update, other"] = seconds["update"] - seconds["update: forward"] - seconds["update: backward"]
    seconds["step"] = seconds["rollout"] + seconds["update"]
    return seconds


def operator_seconds(events, phases) -> dict:
    """{phase: seconds inside aten operators (self time)} from the profiler's event tree."""
    inside = defaultdict(float)
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and parent.name not in phases:
            parent = parent.cpu_parent
        if parent is not None:
            inside[parent.name] += event.self_cpu_time_total / 1e6
    return inside


def build_trainer(args, workdir: str) -> GRPOTrainer:
    """GRPOTrainer on vs_trl.py's run at these sizes (its own defaults for everything else)."""
    sizes = ["--prompts", str(args.prompts), "--generations", str(args.generations),
             "--max-completion-length", str(args.max_completion_length), "--steps", str(args.steps)]  # fmt: skip
    model, tokenizer = load_fp32(str(TINY_MODEL_DIR), "cpu", "sdpa")
    config = vs_trl.minigrpo_config(vs_trl.build_parser().parse_args(sizes), workdir)
    dataset = prompts_dataset(config.prompts_per_step * (2 * args.steps + 2))
    return GRPOTrainer(model, [correctness_reward], args=config, train_dataset=dataset, processing_class=tokenizer)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps (medians over steps 2..N)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=24)
    parser.add_argument("--top", type=int, default=12, help="operators listed by self time")
    parser.add_argument("--quick", action="store_true", help="2 steps of 2 prompts x G=4, 8 tokens: the plumbing")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(vs_trl.QUICK)  # vs_trl.py's own fast mode
    torch.set_num_threads(1)
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as workdir:
        trainer = build_trainer(args, workdir)
        clock = PhaseClock()
        instrument(trainer, clock)
        steps = [one_step(trainer, clock) for _ in range(args.steps)]
        timed = steps[1:] if len(steps) > 1 else steps
        phase_seconds = {name: statistics.median(s.get(name, 0.0) for s in timed) for name in (*PHASES, "step")}

        profiled = ("sampling", "scoring", "rollout", "update: forward", "update: backward", "update")
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            profiled_step = one_step(trainer, clock)
        events = profiler.events()
        inside = operator_seconds(events, set(profiled))

    sizes = f"{args.prompts} prompts x G={args.generations}, up to {args.max_completion_length} tokens"
    print(f"one step of bench/vs_trl.py's run, tiny Qwen on the CPU, 1 thread: {sizes}; medians, steps 2..{args.steps}")
    print(f"{'phase':<20}{'s/step':>9}{'share':>8}")
    for name in PHASES:
        share = phase_seconds[name] / phase_seconds["step"]
        print(f"{name:<20}{phase_seconds[name]:>9.3f}{share:>8.0%}")
    print(f"{'step':<20}{phase_seconds['step']:>9.3f}")

    # under the profiler: each phase's whole time, and the part inside operators
    rollout_ops = inside["rollout"] + inside["sampling"] + inside["scoring"]
    update_ops = inside["update"] + inside["update: forward"] + inside["update: backward"]
    split = {
        "sampling": (profiled_step["sampling"], inside["sampling"]),
        "scoring": (profiled_step["scoring"], inside["scoring"]),
        "rollout": (profiled_step["rollout"], rollout_ops),
        "update": (profiled_step["update"], update_ops),
        "step": (profiled_step["step"], rollout_ops + update_ops),
    }
    print("\nunder torch.profiler (one step): time inside PyTorch operators vs the rest (Python, framework)")
    print(f"{'phase':<12}{'s':>8}{'operators':>11}{'the rest':>10}")
    for name, (whole, ops) in split.items():
        print(f"{name:<12}{whole:>8.3f}{ops / whole:>11.0%}{1 - ops / whole:>10.0%}")

    table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=48)
    print(f"\nthe {args.top} operators with the most self time in that step:\n{table}")

    summary = {
        "prompts": args.prompts,
        "generations": args.generations,
        "max_completion_length": args.max_completion_length,
        "phase_seconds": phase_seconds,
        "operator_fraction": {name: ops / whole for name, (whole, ops) in split.items()},
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

"""Time to accuracy: how long minigrpo and TRL's GRPOTrainer train the main job before its held-out accuracy first
reaches a threshold, over several seeds.

    python bench/time_to_accuracy.py                    # the main job, seeds 0, 1, 2, threshold 0.70
    python bench/time_to_accuracy.py --seeds 1 --threshold 0.65 --eval-every 5
    python bench/time_to_accuracy.py --quick            # 1 seed, 3 steps of 4 prompts x G=4, 8 held-out problems

Needs the `bench` extra (`pip install -e ".[bench]"`: trl 1.16.0 and accelerate); TRL is never a core
dependency of minigrpo.

What is trained. The main job, the run `python -m minigrpo train` makes on the bundled tiny Qwen: its config
(`make_config`: GRPOConfig.tiny_cpu() with the lessons' reward weights: 200 steps of 16 prompts x G=8, up to 24
new tokens, beta 0.04, loss_type "grpo", learning rate 3e-4 decayed linearly to 0), its rewards (correctness_reward
+ 0.1 x format_reward), its 2,000 training problems (drawn with the run's seed) and its 200 held-out problems
(seed 0). TRL's GRPOTrainer gets the same weights, data and reward functions, and the config mapped field by field
(`minigrpo.measuring.crosscheck.trl_config`, as lesson 08 maps them: the group and batch sizes, sampling, the
objective, the optimiser and its learning-rate schedule, the seed). One change from the main job, on both sides:
the prompts are read in the dataset's order (shuffle_dataset=False), so both trainers see the same prompts at
each step; the problems are drawn at random, so that order is already a random one, and each seed draws its own.
A seed sets the config's seed (minigrpo's group seeds, TRL's `set_seed`) and the training problems. (TRL 1.16 has
no max_prompt_length; the arithmetic prompts are shorter than the preset's 96 tokens, so minigrpo cuts none either.)

How accuracy is measured. Both trainers' models are evaluated the same way: minigrpo's greedy held-out evaluation
(`minigrpo.run.evaluation.evaluate_model`, eval_accuracy: the share of held-out problems whose greedy answer is
right), with the same settings on the same problems, from a transformers TrainerCallback that both trainers call:
once before training (the same weights, so the two must agree) and then at `on_step_end` every --eval-every steps
and after the last step.

How time is measured. Training time only: each worker keeps a clock (wall time, `time.perf_counter`, and the
worker's CPU time, `time.process_time`) that runs from `on_train_begin` and is STOPPED while the model is evaluated
and while the worker waits for its turn, so evaluation never counts toward the time. The time to the threshold is
the training time at the first evaluation at or above --threshold (so it is measured to the nearest eval_every
steps); a trainer that never gets there reports None ("not reached" in the table). Building a trainer (loading the
model, TRL's setup in its __init__) is not counted. The ratio is minigrpo's time / TRL's, for each seed where both
reached the threshold.

How it runs. Each trainer trains in its own worker process with one torch thread (as bench/vs_trl.py runs them);
the parent lets them take turns, --eval-every steps each (minigrpo, TRL, minigrpo, ...), so the two never run at
the same time and see the same machine load. On a machine shared with other work the wall times stretch with the
load while the CPU times stay close to the work done: compare the CPU-time ratio there.

The last line printed is one JSON object; its keys are listed in docs/performance.md (the table of bench scripts),
and `tests/test_bench.py` runs `--quick` and checks them.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import multiprocessing as mp  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from minigrpo import GRPOConfig, GRPOTrainer  # noqa: E402
from minigrpo.__main__ import EVAL_PROMPTS, TRAIN_PROMPTS, make_config  # noqa: E402
from minigrpo.measuring.crosscheck import load_fp32, trl_config  # noqa: E402
from minigrpo.measuring.measure import print_summary  # noqa: E402
from minigrpo.models import TINY_MODEL_DIR  # noqa: E402
from minigrpo.run.evaluation import evaluate_model  # noqa: E402
from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset  # noqa: E402

TRAINERS = ("minigrpo", "trl")
REWARD_FUNCS = [correctness_reward, format_reward]  # the main job's; eval_accuracy is correctness_reward's mean
QUICK = dict(seeds=1, steps=3, prompts=4, generations=4, eval_every=1, eval_problems=8, threshold=0.1)
"""--quick: the plumbing, a minute or two on two cores (the figures mean nothing): 1 seed, 3 steps of 4 prompts x
G=4, evaluated after every step on 8 held-out problems, threshold 0.1."""


# --- the run both trainers make --------------------------------------------------------------
def main_job_config(args, seed: int, output_dir: str) -> GRPOConfig:
    """`python -m minigrpo train`'s config with this seed, the prompts in the dataset's order, no evaluation or
    checkpoint of its own (the callback evaluates); --quick makes the batch smaller."""
    overrides = dict(
        seed=seed,
        max_steps=args.steps,
        shuffle_dataset=False,
        eval_strategy="no",
        save_strategy="no",
        output_dir=output_dir,
    )
    if args.prompts is not None or args.generations is not None:
        preset = GRPOConfig.tiny_cpu()
        prompts, generations = args.prompts or preset.prompts_per_step, args.generations or preset.num_generations
        # the whole step in one micro-batch, as in the preset
        overrides.update(prompts_per_step=prompts, num_generations=generations,
                         per_device_train_batch_size=prompts * generations)  # fmt: skip
    return make_config("tiny", overrides)


class TrainingClock:
    """Wall and CPU seconds of training, summed over the spans between start() and stop()."""

    def __init__(self):
        self.wall, self.cpu, self.started = 0.0, 0.0, None

    def start(self) -> None:
        self.started = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        wall, cpu = self.started
        self.wall += time.perf_counter() - wall
        self.cpu += time.process_time() - cpu
        self.started = None


class EvaluateInTurns(TrainerCallback):
    """Evaluates before training and every eval_every steps (and after the last) with the training clock stopped,
    sends each result to the parent, and then waits for the parent's "go" before training on."""

    def __init__(self, conn, accuracy_of, eval_every: int):
        self.conn, self.accuracy_of, self.eval_every = conn, accuracy_of, eval_every
        self.clock = TrainingClock()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.conn.send({"initial_accuracy": self.accuracy_of(model)})
        self.conn.recv()  # "go"
        self.clock.start()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if step % self.eval_every != 0 and step < state.max_steps:
            return
        self.clock.stop()
        point = {"step": step, "time": self.clock.wall, "cpu_time": self.clock.cpu}
        self.conn.send(point | {"accuracy": self.accuracy_of(model)})
        self.conn.recv()  # "go"
        self.clock.start()


def worker(kind: str, conn, args, seed: int, workdir: str) -> None:
    """Build one trainer on the main job and train it, taking turns with the other through `conn`."""
    torch.set_num_threads(args.threads)
    model, tokenizer = load_fp32(str(TINY_MODEL_DIR))
    config = main_job_config(args, seed, f"{workdir}/minigrpo")
    train_data = make_arithmetic_dataset(TRAIN_PROMPTS, "train", seed=seed)  # as the command line draws them
    eval_data = make_arithmetic_dataset(args.eval_problems, "test", seed=0)

    def accuracy_of(policy) -> float:
        return evaluate_model(policy, tokenizer, eval_data, REWARD_FUNCS, config)["eval_accuracy"]

    callback = EvaluateInTurns(conn, accuracy_of, args.eval_every)
    if kind == "minigrpo":
        trainer = GRPOTrainer(
            model, REWARD_FUNCS, args=config, train_dataset=train_data, processing_class=tokenizer, callbacks=[callback]
        )
    else:
        import trl

        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=REWARD_FUNCS,
            args=trl_config(config, "cpu", f"{workdir}/trl"),
            train_dataset=train_data,
            processing_class=tokenizer,
            callbacks=[callback],
        )
    trainer.train()
    conn.send({"done": True})


# --- the parent: turns, then the table -------------------------------------------------------------
def run_seed(args, seed: int, workdir: str) -> dict:
    """Both trainers on one seed, in turns -> {kind: {"initial_accuracy", "curve": [points]}}."""
    context = mp.get_context("spawn")
    conns, workers = {}, {}
    for kind in TRAINERS:
        parent_end, child_end = context.Pipe()
        workers[kind] = context.Process(target=worker, args=(kind, child_end, args, seed, workdir), daemon=True)
        workers[kind].start()
        conns[kind] = parent_end
    runs = {kind: {"initial_accuracy": None, "curve": []} for kind in TRAINERS}
    for kind in TRAINERS:  # one at a time: each builds its trainer and evaluates the untrained model
        runs[kind]["initial_accuracy"] = receive(conns[kind], workers[kind], kind)["initial_accuracy"]
    training = list(TRAINERS)
    while training:
        for kind in list(training):
            conns[kind].send("go")
            message = receive(conns[kind], workers[kind], kind)
            if message.get("done"):
                training.remove(kind)
                workers[kind].join(timeout=60)
                continue
            runs[kind]["curve"].append(message)
            print(f"seed {seed} {kind:<8} step {message['step']:>4}: accuracy {message['accuracy']:.3f} after "
                  f"{message['time']:.1f} s of training ({message['cpu_time']:.1f} s CPU)", flush=True)  # fmt: skip
    return runs


def receive(conn, process, kind: str) -> dict:
    """The worker's next message; a worker that died says so instead of leaving the parent waiting forever."""
    while not conn.poll(1.0):
        if not process.is_alive():
            raise RuntimeError(f"the {kind} worker exited with code {process.exitcode} (its traceback is above)")
    return conn.recv()


def first_at_or_above(curve: list[dict], threshold: float) -> dict | None:
    """The first evaluation point whose accuracy is >= threshold, or None."""
    return next((point for point in curve if point["accuracy"] >= threshold), None)


def quotient(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None else None


THRESHOLD_FIGURES = ("time_to_threshold", "cpu_time_to_threshold", "steps_to_threshold")
"""Per seed: the training time (wall s, CPU s) and the step at the first evaluation at or above the threshold."""


def summarize(runs_by_seed: list[dict], threshold: float) -> dict:
    """Each trainer's figures per seed (lists in seed order), and minigrpo / TRL ratios."""
    summary = {}
    for kind in TRAINERS:
        reached = [first_at_or_above(runs[kind]["curve"], threshold) for runs in runs_by_seed]
        for figure, key in zip(THRESHOLD_FIGURES, ("time", "cpu_time", "step"), strict=True):
            summary[f"{kind}_{figure}"] = [None if point is None else point[key] for point in reached]
        summary |= {
            f"{kind}_final_accuracy": [runs[kind]["curve"][-1]["accuracy"] for runs in runs_by_seed],
            f"{kind}_initial_accuracy": [runs[kind]["initial_accuracy"] for runs in runs_by_seed],
            f"{kind}_curves": [runs[kind]["curve"] for runs in runs_by_seed],
        }
    for key, figure in (("time_ratio", "time_to_threshold"), ("cpu_time_ratio", "cpu_time_to_threshold")):
        ratios = [quotient(*pair) for pair in zip(summary[f"minigrpo_{figure}"], summary[f"trl_{figure}"], strict=True)]
        both = [ratio for ratio in ratios if ratio is not None]
        summary[key] = ratios
        summary[f"median_{key}"] = statistics.median(both) if both else None
    return summary


def print_table(summary: dict, seeds: list[int], threshold: float) -> None:
    shown = lambda value, fmt: "-" if value is None else format(value, fmt)  # noqa: E731
    print(f"{'seed':<6}{'trainer':<10}{f'time to {threshold:g} (s)':>18}{'CPU s':>9}{'steps':>7}"
          f"{'final accuracy':>16}{'training s':>12}")  # fmt: skip
    for i, seed in enumerate(seeds):
        for kind in TRAINERS:
            wall, cpu, steps = (summary[f"{kind}_{figure}"][i] for figure in THRESHOLD_FIGURES)
            reached = f"{'not reached':>27}" if wall is None else f"{wall:>18.1f}{cpu:>9.1f}"
            final, trained = summary[f"{kind}_final_accuracy"][i], summary[f"{kind}_curves"][i][-1]["time"]
            print(f"{seed:<6}{kind:<10}{reached}{shown(steps, 'd'):>7}{final:>16.3f}{trained:>12.1f}")
        wall, cpu = summary["time_ratio"][i], summary["cpu_time_ratio"][i]
        print(f"{'':<6}{'ratio':<10}{shown(wall, '.3f'):>18}{shown(cpu, '.3f'):>9}")
    wall, cpu = summary["median_time_ratio"], summary["median_cpu_time_ratio"]
    print(f"median minigrpo / TRL over the seeds where both reached {threshold:g}: "
          f"wall {shown(wall, '.3f')}, CPU {shown(cpu, '.3f')}")  # fmt: skip


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 (the main job's seed is 0)")
    parser.add_argument("--threshold", type=float, default=0.70, help="held-out accuracy to reach, in (0, 1]")
    parser.add_argument("--steps", type=int, default=GRPOConfig.tiny_cpu().max_steps, help="the main job's 200")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evaluations")
    parser.add_argument("--eval-problems", type=int, default=EVAL_PROMPTS, help="held-out problems (the main job's)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the main job's 16)")
    parser.add_argument("--generations", type=int, default=None, help="G (default: the main job's 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 tiny steps, 8 held-out problems: plumbing")
    parser.add_argument("--json-out", default=None, help="also write the final JSON object here")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    check_arguments(parser, args)
    seeds = list(range(args.seeds))
    print(f"time to held-out accuracy {args.threshold:g}: the tiny Qwen's main job, {args.steps} steps, "
          f"evaluated every {args.eval_every} steps on {args.eval_problems} problems, seeds {seeds}, "
          f"threads={args.threads}, the two trainers in turns")  # fmt: skip
    with tempfile.TemporaryDirectory() as workdir:
        runs_by_seed = [run_seed(args, seed, f"{workdir}/seed{seed}") for seed in seeds]
    summary = {
        "model": "tiny",
        "device": f"cpu ({os.cpu_count()} cores)",
        "threshold": args.threshold,
        "steps": args.steps,
        "eval_every": args.eval_every,
        "eval_problems": args.eval_problems,
        "seeds": seeds,
        **summarize(runs_by_seed, args.threshold),
    }
    print()
    print_table(summary, seeds, args.threshold)
    print_summary(summary, args.json_out)
    return summary


def check_arguments(parser, args) -> None:
    if not 0.0 < args.threshold <= 1.0:
        parser.error(f"--threshold {args.threshold}: an accuracy threshold must be in (0, 1], e.g. 0.7")
    for name in ("seeds", "steps", "eval_every", "eval_problems", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")


if __name__ == "__main__":
    main()

"""minigrpo vs TRL's GRPOTrainer: the same GRPO work, side by side, plus a loss cross-check.

    python bench/vs_trl.py                          # tiny Qwen on the CPU (default), 16 prompts x G=8
    python bench/vs_trl.py --model qwen0.5b-shape   # random-init Qwen2.5-0.5B-Instruct shape, offline (GPU)
    python bench/vs_trl.py --model Qwen/Qwen2.5-0.5B-Instruct   # a Hub id (needs the network)
    python bench/vs_trl.py --crosscheck-only        # just the loss / advantage cross-check
    python bench/vs_trl.py --quick                  # 2 steps of 2 prompts x G=4: the plumbing, seconds (a test)

Needs the `bench` extra (`pip install -e ".[bench]"`: trl 1.16.0 and accelerate); TRL is never a core
dependency of minigrpo.

What is compared. Both trainers get the same weights (loaded from one folder), tokenizer, prompts (the same
B prompts at step k, in the same order), reward function (`correctness_reward`) and the GRPO
hyper-parameters, mapped field by field in `trl_config()`: num_generations, prompts per step (TRL's
generation batch = B * G completions, split into micro-batches of per_device_train_batch_size with gradient
accumulation, one optimizer step per generation batch), max_completion_length, temperature, top_p, beta,
epsilon(s), loss_type, scale_rewards, num_iterations, learning rate, AdamW betas, weight decay, gradient
clipping, the learning-rate schedule (constant or linear, with its warm-up). Both sample exactly from
pi_theta: TRL's generation kwargs (top_k=0, top_p=1, min_p=None, repetition_penalty=1) and minigrpo's
`generation_config_for` override a Qwen-style model generation_config (top_k=20, top_p=0.8,
repetition_penalty=1.05), and the script prints both effective sampling settings. Same dtype (fp32 weights;
bf16 autocast on a GPU that has bf16: TRL `bf16=True`, minigrpo's `precision_context`), same attention
implementation (`--attn`, default sdpa). TRL's gradient checkpointing (its default is on) is turned off,
because minigrpo does not checkpoint the model (pass --trl-gradient-checkpointing to keep TRL's default).
minigrpo runs with its own defaults (the fast paths in GRPOConfig are on where they default on).

How it is timed. Each trainer lives in its own worker process; the parent tells them to take one
step in turn, A B A B ..., so they never run at the same time and see the same machine load. A
step is one optimizer step: prompts -> B * G completions -> rewards -> advantages -> loss ->
update. Both run their real `train()` loop. TRL's: a callback blocks at the end of each step until
the parent says "step", and a step is timed from that release to the next `on_step_end` (so TRL's
data loading, logging bookkeeping and loop overhead count). minigrpo's: `SteppedGRPOTrainer`
overrides the public `collect_rollout` (where each step of its loop begins) to wait for the parent, and a
step is timed from that release to the start of the next step (or the end of `train()`), so its logging and
loop bookkeeping count too. Rollout = generation + reference log-probs + rewards (+ advantages in TRL's, which minigrpo
computes in its update: negligible). TRL's is timed by wrapping its `_generate_and_score_completions`;
minigrpo's is its own `time/rollout` + `time/rewards` metrics. Update = the rest. The table reports
medians over steps 3..N (steps 1-2 are warm-up: allocator, lazy optimizer state, compilation). It also
reports each step's CPU time (`time.process_time()` of the worker over the same span): on a machine shared
with other work, wall-clock steps stretch with the load while CPU seconds stay close to the work done, so
the CPU-time ratio is the steadier comparison there; on a quiet machine with one thread each they agree.

Peak memory. GPU: `torch.cuda.max_memory_allocated()` in each worker (reset after the trainer is built, so
weights + reference + optimizer state + activations count). CPU: peak RSS of each worker (VmHWM: getrusage's
ru_maxrss would report the parent's peak, which Linux carries over fork and exec). RSS cannot be split
between two trainers in one process, hence the separate processes; both workers import the same libraries
(torch, transformers, datasets, trl, minigrpo) before building anything, so the library baseline is the same
and the difference is what the trainers allocate. The table also shows the RSS just before the first step.

The cross-check (`minigrpo.measuring.crosscheck.crosscheck`, run first unless --skip-crosscheck): one fixed
rollout batch goes through TRL's own code and through minigrpo's stage functions, and the advantages,
the loss of each loss_type and its gradients must agree (fp32, on the CPU).

Where to run it. Any CPU (the tiny model, minutes on two cores) or any CUDA machine (the Qwen shape),
from a checkout of the repository:

    pip install -e ".[bench]"
    python bench/vs_trl.py --model qwen0.5b-shape --prompts 8 --generations 8 --max-completion-length 128 \
        --steps 8 --json-out vs_trl.json
    python bench/vs_trl.py --model qwen0.5b-shape --t4-config --steps 4 --only minigrpo

(`--t4-config` runs GRPOConfig.qwen_t4() in fp32 without autocast (bf16=False), as on a T4, and reports
minigrpo's peak GPU memory, to check it stays under 12 GiB.)

The last line printed is one JSON object; its keys are listed in docs/performance.md (section "PPO, and the
benchmarks"), and `tests/test_bench.py` runs `--quick` and checks them.
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
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import GenerationConfig, Qwen2ForCausalLM  # noqa: E402

from minigrpo import GRPOConfig, GRPOTrainer  # noqa: E402
from minigrpo.measuring.crosscheck import crosscheck, load_fp32, prompts_dataset, trl_config  # noqa: E402
from minigrpo.measuring.measure import (  # noqa: E402
    QWEN_SHAPE,
    peak_memory_mib,
    print_summary,
    qwen_shape_config,
    rss_bytes,
)
from minigrpo.models import TINY_MODEL_DIR  # noqa: E402
from minigrpo.tokenization import qwen25_tokenizer  # noqa: E402

# Qwen/Qwen2.5-0.5B-Instruct's generation_config.json, written out so the shape runs offline.
QWEN25_GENERATION_CONFIG = dict(
    bos_token_id=151643,
    pad_token_id=151643,
    do_sample=True,
    eos_token_id=[151645, 151643],
    repetition_penalty=1.05,
    temperature=0.7,
    top_p=0.8,
    top_k=20,
)
QWEN_ENDOFTEXT, QWEN_IM_END = 151643, 151645


# --- the model, the data, the two configs ---------------------------------------------------
def prepare_model_dir(name: str, folder: Path) -> str:
    """Write the benchmark model and tokenizer to `folder` (so both trainers, and TRL's reference
    model, load the very same weights); returns the path to load from."""
    if name == "tiny":
        return str(TINY_MODEL_DIR)
    if name != QWEN_SHAPE:
        return name  # a Hub id or a local folder
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen_shape_config(bos_token_id=QWEN_ENDOFTEXT, eos_token_id=QWEN_IM_END))
    model.generation_config = GenerationConfig(**QWEN25_GENERATION_CONFIG)  # Qwen's sampling defaults, on purpose
    model.save_pretrained(folder)
    qwen25_tokenizer().save_pretrained(folder)
    return str(folder)


def minigrpo_config(args, output_dir: str) -> GRPOConfig:
    """The run both trainers make (TRL's is mapped from it by trl_config): the dataset's prompt order, no
    evaluation or checkpoint. --t4-config: GRPOConfig.qwen_t4() in fp32 (bf16=False), as on a T4."""
    timed = dict(max_steps=args.steps, shuffle_dataset=False, eval_strategy="no", save_strategy="no")
    if args.t4_config:
        return GRPOConfig.qwen_t4(**timed, bf16=False, output_dir=output_dir)
    n = args.prompts * args.generations
    return GRPOConfig.for_model(
        args.model,
        prompts_per_step=args.prompts,
        num_generations=args.generations,
        per_device_train_batch_size=args.micro_batch or n,
        max_completion_length=args.max_completion_length,
        max_prompt_length=256,
        beta=args.beta,
        loss_type=args.loss_type,
        output_dir=output_dir,
        **timed,
    )


# --- the workers: one trainer per process -------------------------------------------------------
def _import_everything() -> None:
    """Both workers import the same libraries first, so their RSS baselines match."""
    import datasets  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import minigrpo  # noqa: F401


class SteppedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose own train() loop waits for the parent before each step and reports the step before.

    The prompt order is the dataset's (shuffle_dataset=False: TRL's order with the same setting). A step is
    timed from the parent's "step" to the start of the next one (or the end of train()), so the loop's logging
    and bookkeeping count, as TRL's do between its callback's release and its next on_step_end.
    """

    def __init__(self, *args, conn, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn, self.started, self.metrics = conn, None, None

    def collect_rollout(self):
        self.report()
        self.conn.recv()  # "step"
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        rollout, rewards, self.metrics = super().collect_rollout()  # the step's rollout metrics
        return rollout, rewards, self.metrics

    def report(self) -> None:
        """Send the last step's figures, if a step has run since the last report."""
        if self.started is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds, cpu = time.perf_counter() - self.started, time.process_time() - self.cpu_started
        tokens = self.metrics["completions/mean_length"] * self.config.num_completions
        rollout = self.metrics["time/rollout"] + self.metrics["time/rewards"]
        self.conn.send(
            {"step_time": seconds, "cpu_time": cpu, "rollout": rollout, "update": seconds - rollout, "tokens": tokens}
        )
        self.started = None


def minigrpo_worker(conn, args, path: str, device: str, workdir: str) -> None:
    _import_everything()
    from minigrpo.rollout import generation_config_for
    from minigrpo.tasks.arithmetic import correctness_reward

    torch.set_num_threads(args.threads) if args.threads else None
    model, tokenizer = load_fp32(path, device, args.attn)
    config = minigrpo_config(args, f"{workdir}/minigrpo")
    dataset = prompts_dataset(config.prompts_per_step * (args.steps + 1))
    trainer = SteppedGRPOTrainer(
        model, [correctness_reward], args=config, train_dataset=dataset, processing_class=tokenizer, conn=conn
    )
    sampling = generation_config_for(config, model, tokenizer)
    conn.send(
        {
            "ready": True,
            "rss_before_mib": rss_bytes() / 2**20,
            "sampling": {k: getattr(sampling, k, None) for k in SAMPLING_KEYS},
        }
    )
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    trainer.report()  # the last step
    conn.recv()  # "finish"
    conn.send(peak_memory_mib(device))


SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "cache_implementation")


def trl_worker(conn, args, path: str, device: str, workdir: str) -> None:
    _import_everything()
    import trl
    from transformers import TrainerCallback

    from minigrpo.tasks.arithmetic import correctness_reward

    torch.set_num_threads(args.threads) if args.threads else None
    model, tokenizer = load_fp32(path, device, args.attn)
    config = minigrpo_config(args, f"{workdir}/minigrpo")
    dataset = prompts_dataset(config.prompts_per_step * (args.steps + 1))
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[correctness_reward],
        args=trl_config(config, device, f"{workdir}/trl", args.trl_gradient_checkpointing),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    timing = {"rollout": 0.0, "tokens": 0.0}
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(inputs):
        started = time.perf_counter()
        output = generate_and_score(inputs)
        timing["rollout"] += time.perf_counter() - started
        timing["tokens"] += float(output["completion_mask"].sum())
        return output

    trainer._generate_and_score_completions = timed_generate_and_score

    class StepByStep(TrainerCallback):
        """Blocks after each optimizer step until the parent says 'step' again."""

        def on_train_begin(self, *_, **__):
            self.wait()

        def on_step_end(self, *_, **__):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds, cpu = time.perf_counter() - self.started, time.process_time() - self.cpu_started
            conn.send(
                {"step_time": seconds, "cpu_time": cpu, "rollout": timing["rollout"],
                 "update": seconds - timing["rollout"], **timing}
            )  # fmt: skip
            self.wait()

        def wait(self):
            conn.recv()  # "step" (or "finish" after the last step, when train() returns by itself)
            timing.update(rollout=0.0, tokens=0.0)
            self.started, self.cpu_started = time.perf_counter(), time.process_time()

    trainer.add_callback(StepByStep())
    sampling = trainer.generation_config
    conn.send(
        {
            "ready": True,
            "rss_before_mib": rss_bytes() / 2**20,
            "sampling": {k: getattr(sampling, k, None) for k in SAMPLING_KEYS},
            "prompt_ids_match": _same_prompt_ids(trainer, tokenizer, dataset, config),
        }
    )
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    conn.send(peak_memory_mib(device))


def _same_prompt_ids(trainer, tokenizer, dataset, config) -> bool:
    """TRL's prompt tokenisation equals minigrpo's (the same chat template, no special tokens added)."""
    from minigrpo.rollout import render_prompts

    prompts = list(dataset["prompt"][:4])
    theirs = trainer._tokenize_prompts(prompts)[0]
    ours = tokenizer(render_prompts(tokenizer, prompts), add_special_tokens=False)["input_ids"]
    return [list(ids) for ids in theirs] == ours


# --- the parent: alternate A B A B, then the table ------------------------------------------
def run_pair(args, path: str, device: str, workdir: str) -> dict:
    context = mp.get_context("spawn")
    workers, conns = {}, {}
    kinds = list(TRAINERS) if args.only is None else [args.only]
    for kind in kinds:
        parent_end, child_end = context.Pipe()
        target = minigrpo_worker if kind == "minigrpo" else trl_worker
        workers[kind] = context.Process(target=target, args=(child_end, args, path, device, workdir), daemon=True)
        workers[kind].start()
        conns[kind] = parent_end
    info = {kind: conns[kind].recv() for kind in kinds}
    for kind in kinds:
        print(f"{kind:>9} sampling: {info[kind]['sampling']}")
    if "trl" in info:
        print(f"TRL's prompt token ids equal minigrpo's: {info['trl']['prompt_ids_match']}")
    steps = {kind: [] for kind in kinds}
    for step in range(1, args.steps + 1):
        for kind in kinds:
            conns[kind].send("step")
            steps[kind].append(conns[kind].recv())
        line = "  ".join(f"{kind} {steps[kind][-1]['step_time']:.3f}s" for kind in kinds)
        print(f"step {step}/{args.steps}: {line}", flush=True)
    for kind in kinds:
        conns[kind].send("finish")
        info[kind].update(conns[kind].recv())
        workers[kind].join(timeout=60)
    return {kind: summarize(steps[kind], info[kind], device) for kind in kinds}


TRAINERS = ("minigrpo", "trl")
FIGURES = ("step_time", "cpu_time", "rollout", "update", "tokens_per_step", "tokens_per_s", "peak_memory_mib",
           "rss_at_start_mib", "step_times")  # fmt: skip
"""Each trainer's figures in the last line's JSON, as <trainer>_<figure> (None for a trainer that did not run)."""
QUICK = dict(steps=2, prompts=2, generations=4, max_completion_length=8)
"""--quick: two steps of 2 prompts x G=4, 8 tokens (the plumbing in seconds; the timings mean nothing)."""


def summarize(steps: list[dict], info: dict, device: str) -> dict:
    """Medians over steps 3..N (all steps when there are 2 or fewer), peak memory and the RSS at the start."""
    timed = steps[2:] if len(steps) > 2 else steps
    median = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    return {
        "step_time": median("step_time"),
        "cpu_time": median("cpu_time"),
        "rollout": median("rollout"),
        "update": median("update"),
        "tokens_per_step": median("tokens"),
        "tokens_per_s": statistics.median(s["tokens"] / s["step_time"] for s in timed),
        "peak_memory_mib": info["peak_gpu_mib" if device.startswith("cuda") else "peak_rss_mib"],
        "rss_at_start_mib": info["rss_before_mib"],
        "step_times": [round(s["step_time"], 4) for s in steps],
    }


def print_table(results: dict, device: str) -> None:
    memory_name = "peak GPU alloc" if device.startswith("cuda") else "peak RSS"
    header = f"{'':<10}{'s/step':>9}{'CPU s/step':>11}{'rollout s':>11}{'update s':>10}{'tok/step':>10}{'tok/s':>9}"
    print(header + f"{memory_name:>16}{'RSS at start':>14}")
    for kind, r in results.items():
        line = f"{kind:<10}{r['step_time']:>9.3f}{r['cpu_time']:>11.3f}{r['rollout']:>11.3f}{r['update']:>10.3f}"
        line += f"{r['tokens_per_step']:>10.0f}{r['tokens_per_s']:>9.0f}{r['peak_memory_mib']:>12.0f} MiB"
        print(line + f"{r['rss_at_start_mib']:>10.0f} MiB")
    if len(results) == 2:
        a, b = results["minigrpo"], results["trl"]
        ratio = lambda key: a[key] / b[key]  # noqa: E731
        line = f"{'ratio':<10}{ratio('step_time'):>9.3f}{ratio('cpu_time'):>11.3f}{ratio('rollout'):>11.3f}"
        line += f"{ratio('update'):>10.3f}{'':>10}"
        print(line + f"{ratio('tokens_per_s'):>9.3f}{ratio('peak_memory_mib'):>12.3f}")


def build_parser() -> argparse.ArgumentParser:
    """The command line; bench/scaling.py builds each of its cells' settings from it too."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny | qwen0.5b-shape | a Hub id or local folder")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--steps", type=int, default=12, help="steps per trainer; medians over steps 3..N")
    parser.add_argument("--prompts", type=int, default=16, help="B, prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="G, completions per prompt")
    parser.add_argument("--max-completion-length", type=int, default=24)
    parser.add_argument("--micro-batch", type=int, default=None, help="per_device_train_batch_size (default: N)")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--loss-type", default="grpo", choices=("grpo", "bnpo", "dr_grpo", "dapo"))
    parser.add_argument("--attn", default="sdpa", help="attention implementation of both models")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per worker (CPU default: 1)")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true", help="keep TRL's default (on)")
    parser.add_argument("--t4-config", action="store_true", help="GRPOConfig.qwen_t4() as on a T4 (fp32)")
    parser.add_argument("--only", choices=TRAINERS, default=None, help="run one trainer only")
    parser.add_argument("--crosscheck-only", action="store_true")
    parser.add_argument("--skip-crosscheck", action="store_true")
    parser.add_argument("--quick", action="store_true", help="2 steps of 2 prompts x G=4, 8 tokens: the plumbing")
    parser.add_argument("--json-out", default=None, help="also write the final JSON object here")
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and args.threads is None:
        args.threads = 1  # the tiny model gains nothing from threads; one thread each keeps timings stable
    summary = {
        "model": args.model,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)",
        "memory": "peak GPU allocated" if device.startswith("cuda") else "peak RSS of the worker process",
        **{f"{kind}_{figure}": None for kind in TRAINERS for figure in FIGURES},
        **dict.fromkeys(("step_time_ratio", "cpu_time_ratio", "peak_memory_ratio", "max_loss_diff", "max_grad_diff",
                         "max_advantage_diff")),
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as workdir:
        path = prepare_model_dir(args.model, Path(workdir) / "model")
        if not args.skip_crosscheck:
            checks = crosscheck(path)
            summary.update(max_loss_diff=checks["max_loss_diff"], max_grad_diff=checks["max_grad_diff"],
                           max_advantage_diff=checks["advantages"])  # fmt: skip
        if not args.crosscheck_only:
            print(f"\nbenchmark: {args.model} on {device}, {args.prompts} prompts x G={args.generations}, "
                  f"max_completion_length={args.max_completion_length}, beta={args.beta}, loss_type={args.loss_type}, "
                  f"{args.steps} steps each, alternating, threads={args.threads}")  # fmt: skip
            results = run_pair(args, path, device, workdir)
            print()
            print_table(results, device)
            summary.update({f"{kind}_{k}": v for kind, r in results.items() for k, v in r.items()})
            if len(results) == 2:
                ours, theirs = results["minigrpo"], results["trl"]
                for key, figure in (
                    ("step_time", "step_time"),
                    ("cpu_time", "cpu_time"),
                    ("peak_memory", "peak_memory_mib"),
                ):
                    summary[f"{key}_ratio"] = ours[figure] / theirs[figure]
    print_summary(summary, args.json_out)
    return summary


if __name__ == "__main__":
    main()

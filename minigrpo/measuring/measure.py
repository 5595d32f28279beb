"""Measuring code for the benchmarks: memory readers, fresh-process runs, the Qwen-shaped model, a model that
never stops, PPO vs GRPO.

Shared by ``bench/ppo_vs_grpo.py``, ``bench/vs_trl.py``, lesson 05 and the
tests. Nothing here is part of the algorithms: it loads models, trains them,
reads the clock and the memory, and formats tables.

Peak memory. On a GPU, ``torch.cuda.max_memory_allocated``. On a CPU, the
resident set size (RSS) of this process from ``/proc/self/status``: VmRSS now,
VmHWM the peak since the last reset (Linux resets it through
``/proc/self/clear_refs``), so a peak can be measured from a baseline taken
after the libraries are loaded. Two runs in one process would hide each
other's peak (freed memory stays with the allocator), hence one fresh Python
process per run (``run_in_fresh_process``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from minigrpo.config import GRPOConfig
from minigrpo.models import load_model_and_tokenizer, pick_device
from minigrpo.ppo import PPOConfig, PPOTrainer
from minigrpo.tasks.arithmetic import REWARD_WEIGHTS, correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.tokenization import qwen25_tokenizer
from minigrpo.trainer import GRPOTrainer, Trainer

ALGORITHMS = ("grpo", "ppo")
QWEN_SHAPE = "qwen0.5b-shape"  # Qwen2.5-0.5B's architecture with random weights: no Hub needed


# --- memory ----------------------------------------------------------------------------------------------
def rss_bytes(field: str = "VmRSS") -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    return int(match.group(1)) * 1024


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current RSS (since Linux 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_memory_mib(device: str) -> dict:
    """{"peak_rss_mib": the process's peak RSS since it started, and on CUDA "peak_gpu_mib": peak allocated}.

    The peak is VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over fork and exec, so a worker
    started by a bigger parent (multiprocessing's spawn is fork + exec) would report the parent's peak."""
    report = {"peak_rss_mib": rss_bytes("VmHWM") / 2**20}
    if device.startswith("cuda"):
        report["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return report


# --- a fresh process per run -------------------------------------------------------------------------------
_CHILD = (  # python -c _CHILD module function '<json arguments>' <result file>
    "import importlib, json, sys; function = getattr(importlib.import_module(sys.argv[1]), sys.argv[2]); "
    "json.dump(function(**json.loads(sys.argv[3])), open(sys.argv[4], 'w'))"
)


def run_in_fresh_process(module: str, function: str, arguments: dict) -> dict:
    """module.function(**arguments) in a new Python process; returns its JSON-able result.

    Raises RuntimeError with the end of the child's stderr when it fails.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        command = [sys.executable, "-c", _CHILD, module, function, json.dumps(arguments), out]
        done = subprocess.run(command, capture_output=True, env=_child_environment())
        if done.returncode != 0:
            raise RuntimeError(f"{module}.{function} failed in its process:\n{done.stderr.decode()[-3000:]}")
        with open(out) as f:
            return json.load(f)


def _child_environment() -> dict:
    """This process's environment, with this copy of minigrpo first on the path (works without installing)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else root + os.pathsep + path}


# --- the Qwen-shaped model ---------------------------------------------------------------------------------


def qwen_shape_config(vocab_size: int = 151_936, **overrides) -> Qwen2Config:
    """Qwen2.5-0.5B-Instruct's configuration (494M parameters, its config.json), for a random-init model built
    offline. Token ids (eos, pad, bos) depend on the tokenizer: pass them as overrides."""
    shape = dict(
        vocab_size=vocab_size,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        max_window_layers=21,
        sliding_window=32768,
        use_sliding_window=False,
        attention_dropout=0.0,
        initializer_range=0.02,
    )
    return Qwen2Config(**{**shape, **overrides})


def print_summary(summary: dict, json_out: str | None = None) -> None:
    """A benchmark's last line: `summary` as one line of JSON (what tests/test_bench.py reads), also written to the
    file `json_out` when one is given."""
    line = json.dumps(summary)
    if json_out:
        Path(json_out).write_text(line + "\n")
    print(line)


def make_stop_tokens_unreachable(model: Qwen2ForCausalLM, stop_token_ids: list[int], margin: float = 1e4):
    """Edit `model` in place so that it never samples a token of `stop_token_ids`: every completion then runs to
    max_completion_length, which a benchmark of cost against completion length needs (a model that stops after
    20 tokens costs 20 tokens, whatever the limit). Returns the model.

    How: one channel c of the residual stream is held constant. Every token's input embedding has 1 in it and no
    layer writes to it (row c of each attention output projection and MLP down projection is 0), so after the final
    RMSNorm it is w_c / rms(x) > 0 at every position whose token is not a stop token (w_c, the norm's weight there,
    is 1 in a freshly initialised model, which is what it is meant for). The stop tokens' output rows read only
    that channel, with weight -margin, so their logits are -margin / rms(x) while the others' are +1 / rms(x) plus
    small terms: for rms(x) below about 10 the gap is over 1000 and exp(-gap) is exactly 0 in fp32. With tied
    embeddings (the tiny Qwen's and Qwen2.5's) the stop tokens' input embedding is that same row: a stop token inside
    a prompt (a chat template's end of turn) embeds to -margin in channel c, which changes what the model computes
    but not the guarantee, which holds at every position whose token is not a stop token. The shape, the parameter
    count and the work of a forward pass are unchanged.
    """
    channel = 0
    with torch.no_grad():
        model.get_input_embeddings().weight[:, channel] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[channel] = 0.0
            layer.mlp.down_proj.weight[channel] = 0.0
        output = model.get_output_embeddings().weight  # (V, hidden); the input embedding itself when tied
        output[stop_token_ids] = 0.0
        output[stop_token_ids, channel] = -margin
    return model


def load_benchmark_model(name: str, device=None, **shape_overrides):
    """ "tiny", a Hub id / path, or "qwen0.5b-shape": Qwen2.5-0.5B's shape with random weights and Qwen2.5's
    real tokenizer, built offline (`tokenization.qwen25_tokenizer`; memory and time are what it measures)."""
    if name != QWEN_SHAPE:
        return load_model_and_tokenizer(name, device)
    tokenizer = qwen25_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = qwen_shape_config(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    for key, value in shape_overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id)
    return model.to(device if device is not None else pick_device()), tokenizer


# --- PPO vs GRPO (bench/ppo_vs_grpo.py and lesson 05) -----------------------------------------------------
def parameter_counts(trainer: Trainer) -> dict[str, dict[str, int]]:
    """Parameters held in memory per model: {"policy": {"trainable", "frozen"}, "reference": ..., "critic": ...}."""
    models = {"policy": trainer.model, "reference": trainer.ref_model, "critic": getattr(trainer, "critic", None)}
    return {
        name: {
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "frozen": sum(p.numel() for p in model.parameters() if not p.requires_grad),
        }
        for name, model in models.items()
        if model is not None
    }


def _curve(history: list[dict], completions_per_step: int) -> dict[str, list]:
    """Per step: completions generated so far, training seconds so far (step_time, evaluation excluded),
    mean reward, held-out accuracy (None between evaluations), the critic's explained variance (PPO)."""
    seconds, elapsed = [], 0.0
    for m in history:
        elapsed += m.get("step_time", 0.0)
        seconds.append(elapsed)
    return {
        "completions": [m["step"] * completions_per_step for m in history],
        "seconds": seconds,
        "reward": [m["reward"] for m in history],
        "eval_accuracy": [m.get("eval_accuracy") for m in history],
        "values/explained_variance": [m.get("values/explained_variance") for m in history],
    }


def training_problems(train_size: int, validation_size: int = 0, seed: int = 0):
    """(train, validation): `validation_size` distinct training-split problems held back, and the training
    problems without any of them (make_arithmetic_dataset samples with replacement, so a problem can repeat;
    every copy of a validation problem leaves the training set). The test split is never touched."""
    problems = make_arithmetic_dataset(train_size + validation_size, "train", seed=seed)
    distinct = list(dict.fromkeys(problems["question"]))  # in order of first appearance
    if validation_size > len(distinct) // 2:
        raise ValueError(
            f"validation_size={validation_size} is more than half of the {len(distinct)} distinct problems: "
            "lower it or raise train_size."
        )
    held_back = set(distinct[len(distinct) - validation_size :]) if validation_size else set()
    first_row = {}
    for row, question in enumerate(problems["question"]):
        first_row.setdefault(question, row)
    validation_rows = sorted(first_row[q] for q in held_back)
    train_rows = [row for row, question in enumerate(problems["question"]) if question not in held_back]
    return problems.select(train_rows), problems.select(validation_rows)


def _seconds_per_step(history: list[dict]) -> dict[str, float]:
    """Mean seconds per step: rollout (generate + reference / old log-probs), scoring (reward functions,
    and for PPO the critic's values, the KL-in-reward and GAE), update (the gradient passes)."""
    mean = lambda key: sum(m.get(key, 0.0) for m in history) / len(history)  # noqa: E731
    return {
        "rollout": mean("time/rollout"),
        "scoring": mean("time/rewards") + mean("time/scoring"),
        "update": mean("time/update") - mean("time/scoring"),
    }


def run_algorithm(
    algorithm: str,
    model: str = "tiny",
    config_overrides: dict | None = None,
    train_size: int = 2000,
    eval_size: int = 200,
    output_dir: str = "runs/ppo_vs_grpo",
    evaluate_on: str = "test",
    validation_size: int = 0,
) -> dict:
    """Train one algorithm and measure it; meant to run alone in a fresh process (see study.compare_with_seeds).

    evaluate_on="test": eval_accuracy is on `eval_size` held-out test problems; "validation": on the
    `validation_size` training problems held back from training (training_problems), for choosing
    hyper-parameters without ever looking at the test set. Training never sees the validation problems
    (when validation_size > 0) in either case, so tuning and final runs train on the same problems.

    Peak memory: on a GPU, torch.cuda.max_memory_allocated since just before
    the model was loaded. On a CPU, the peak resident set size (VmHWM) minus
    the RSS just before the model was loaded (Python, torch and the datasets
    are the same for both algorithms and are not training memory).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}: choose 'grpo' or 'ppo'.")

    if evaluate_on not in ("test", "validation"):
        raise ValueError(f"evaluate_on={evaluate_on!r}: choose 'test' or 'validation'.")
    if evaluate_on == "validation" and validation_size < 1:
        raise ValueError("evaluate_on='validation' needs validation_size >= 1 problems held back from training.")
    train_data, validation_data = training_problems(train_size, validation_size)
    eval_data = validation_data if evaluate_on == "validation" else make_arithmetic_dataset(eval_size, "test", seed=0)
    device = pick_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        baseline = rss_bytes("VmRSS")
        reset_peak_rss()
    policy, tokenizer = load_benchmark_model(model, device)
    config_class, trainer_class = (GRPOConfig, GRPOTrainer) if algorithm == "grpo" else (PPOConfig, PPOTrainer)
    overrides = {"reward_weights": list(REWARD_WEIGHTS), "save_steps": 0, **(config_overrides or {})}
    if "per_device_train_batch_size" not in overrides:  # the preset's micro-batch must divide N = B * G
        defaults = config_class.for_model(model)
        n = overrides.get("prompts_per_step", defaults.prompts_per_step)
        n *= overrides.get("num_generations", defaults.num_generations)
        overrides["per_device_train_batch_size"] = math.gcd(n, defaults.per_device_train_batch_size)
    # a measurement is repeated (a notebook re-run): it replaces the earlier one in its folder
    config = config_class.for_model(
        model, **{**overrides, "output_dir": f"{output_dir}/{algorithm}", "overwrite_output_dir": True}
    )
    reward_funcs = [correctness_reward, format_reward]  # the first one is eval_accuracy
    trainer = trainer_class(policy, reward_funcs, config, train_data, eval_data, processing_class=tokenizer)
    accuracy_before = trainer.evaluate()["eval_accuracy"]
    started = time.perf_counter()
    trainer.train()
    history = trainer.state.log_history
    seconds = time.perf_counter() - started
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = rss_bytes("VmHWM") - baseline
    return {
        "params": parameter_counts(trainer),
        "peak_memory_bytes": int(peak),
        "seconds_per_step": _seconds_per_step(history),
        "curve": _curve(history, config.num_completions),
        "accuracy_before": accuracy_before,
        "accuracy": next((m["eval_accuracy"] for m in reversed(history) if "eval_accuracy" in m), accuracy_before),
        "train_seconds": seconds,
        "config": {k: v for k, v in asdict(config).items() if not isinstance(v, list)},
    }

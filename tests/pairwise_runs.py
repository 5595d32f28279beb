"""The runs of tests/test_pairwise.py: every pair of the run's options, each row a tiny two-generation run.

A row sets each option in OPTIONS to one of its values; `covering_rows()` lists rows in which every pair of values of
every two options appears at least once (a covering array of strength 2, allpairspy's), so two options that break
together break some row. `run_row(row, out_dir)` trains the tiny Qwen for two generations with the row's options and
returns what the test checks, or the trainer's refusal when it refuses them at construction.

Under torchrun the same file runs a few rows on every process (the test starts it):

    python -m torch.distributed.run --nproc-per-node 2 --standalone tests/pairwise_runs.py OUT_DIR ROWS_JSON

and each rank writes its results to OUT_DIR/rank<r>.json.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

from allpairspy import AllPairs
from transformers import TrainerCallback

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.models import lora_config
from minigrpo.run import distributed
from minigrpo.tasks.arithmetic import make_arithmetic_dataset
from minigrpo.tasks.calculator import calculator, make_calculator_dataset
from minigrpo.tokenization import build_tiny_tokenizer
from minigrpo.tool_calling import reads_tool_calls

OPTIONS = {
    "loss_type": ["grpo", "bnpo", "dr_grpo", "dapo"],
    "scale_rewards": ["group", "batch", "none"],
    "importance_sampling_level": ["token", "sequence"],
    "baseline": ["mean", "rloo"],
    "beta": [0.0, 0.04],
    "num_iterations": [1, 2],
    "steps_per_generation": [1, 2],
    "dynamic_sampling": [False, True],
    "log_completions": [False, True],
    "num_generations_eval": [None, 2],
    "mask_truncated_completions": [False, True],
    "report_to": ["none", "tensorboard"],
    "lora": [False, True],
    "resume": [False, True],
    # tools=[calculator] on the tools model; transformers < 5.13 cannot parse tool calls (tools= is refused there)
    "tools": [False, True] if reads_tool_calls(build_tiny_tokenizer()) else [False],
}
"""Each option of a run and the values the pairs take: GRPOConfig fields, then `lora` (a peft_config), `resume`
(stopped after the first generation, resumed by a new trainer) and `tools` (the tiny tools model with its calculator:
each completion an episode)."""

NOT_CONFIG_FIELDS = ("lora", "resume", "tools")

REFUSED_PAIRS = [{"dynamic_sampling": True, "steps_per_generation": 2}]
"""Pairs of values the trainer refuses at construction (DAPO's refill keeps a varying number of groups, which
cannot be cut into a fixed number of optimizer steps): left out of the covering array, each tested on its own."""

NUM_PROMPTS, GENERATIONS = 8, 2  # a prompt set of 8; groups of G = 2, the smallest group


def refused(row: dict) -> bool:
    """Does the row (or a part of one: some of the options) hold a pair in REFUSED_PAIRS?"""
    return any(all(name in row and row[name] == value for name, value in pair.items()) for pair in REFUSED_PAIRS)


def covering_rows() -> list[dict]:
    """Rows in which every two options take every pair of their values that is not refused at least once:
    allpairspy's greedy covering array (the same rows on every run), then a row for each pair its search missed
    (a constraint can hide one), the other options at their first value."""
    names = list(OPTIONS)
    # allpairspy asks about rows being built too: the first len(values) options
    array = AllPairs(
        [OPTIONS[name] for name in names],
        filter_func=lambda values: not refused(dict(zip(names, values, strict=False))),
    )
    rows = [dict(zip(names, values, strict=True)) for values in array]
    first_values = {name: values[0] for name, values in OPTIONS.items()}
    for (a, values_a), (b, values_b) in itertools.combinations(OPTIONS.items(), 2):
        for pair in ({a: value_a, b: value_b} for value_a in values_a for value_b in values_b):
            if not refused(pair) and not any(row[a] == pair[a] and row[b] == pair[b] for row in rows):
                rows.append({**first_values, **pair})
    return rows


def counting_reward(completions, drop, log_extra, prompt_id, **kwargs) -> list[float]:
    """0 for each completion of a prompt marked `drop` (its group's rewards are all equal: no signal, and dynamic
    sampling drops it); the completion's place in the call otherwise (never all equal). Logs the prompt's id as a
    log_extra column, so the completions log shows which prompt each row answers."""
    log_extra("prompt_id", list(prompt_id))
    return [0.0 if dropped else float(i) for i, dropped in enumerate(drop)]


def dataset(n: int, split: str, tools: bool = False):
    """Arithmetic prompts (with tools: calculator problems) with a `drop` column (every other prompt) and a
    `prompt_id` column."""
    problems = make_calculator_dataset(n, split) if tools else make_arithmetic_dataset(n, split)
    return problems.add_column("prompt_id", list(range(n))).add_column("drop", [i % 2 == 0 for i in range(n)])


class StopAfterFirstGeneration(TrainerCallback):
    """An interruption: the run stops after its first generation, and the trainer saves a checkpoint to resume."""

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = True
        return control


def config_for(row: dict, out_dir: Path) -> GRPOConfig:
    """Two generations of B = 2 x steps_per_generation prompts x G = 2, 8 new tokens (with tools, 160: room for a
    call, its result and an answer), evaluated once at the end."""
    fields = {name: value for name, value in row.items() if name not in NOT_CONFIG_FIELDS}
    steps_per_generation_count = row["num_iterations"] * row["steps_per_generation"]
    return GRPOConfig(
        **fields,
        output_dir=str(out_dir),
        logging_dir=str(out_dir / "logs"),
        per_device_train_batch_size=4,
        num_generations=GENERATIONS,
        max_completion_length=160 if row["tools"] else 8,
        max_steps=2 * steps_per_generation_count,
        max_num_gen_batches=2,
        learning_rate=1e-4 if row["lora"] else 1e-5,
        logging_steps=1,
        eval_steps=2 * steps_per_generation_count,
        eval_batch_size=4,
        save_strategy="no",
        bf16=False,
        seed=0,
        temperature=1.0,
    )


def new_trainer(row: dict, config: GRPOConfig, callbacks=None) -> GRPOTrainer:
    return GRPOTrainer(
        "tiny-tools" if row["tools"] else "tiny",
        [counting_reward],
        config,
        dataset(NUM_PROMPTS, "train", row["tools"]),
        dataset(2, "test", row["tools"]),
        callbacks=callbacks,
        peft_config=lora_config(r=4, lora_alpha=8) if row["lora"] else None,
        tools=[calculator] if row["tools"] else None,
    )


def run_row(row: dict, out_dir: Path) -> dict:
    """Train with the row's options. Returns {"refused": the message} when the trainer refuses them at construction,
    else {"steps", "max_steps", "history" (log_history), "completions" (completions.jsonl's rows)}."""
    try:
        config = config_for(row, out_dir)
        first = new_trainer(row, config, [StopAfterFirstGeneration()] if row["resume"] else None)
    except (ValueError, NotImplementedError) as refusal:
        return {"refused": str(refusal)}
    first.train()
    trainer = first
    if row["resume"]:  # a new trainer on the same output_dir, as after a restart
        trainer = new_trainer(row, config)
        trainer.train(resume_from_checkpoint=True)
    completions_file = out_dir / "completions.jsonl"
    completions = completions_file.read_text().splitlines() if completions_file.exists() else []
    return {
        "steps": trainer.step,
        "max_steps": trainer.max_steps,
        "history": trainer.state.log_history,
        "completions": [json.loads(line) for line in completions],
    }


def non_finite_metrics(history: list[dict]) -> list[str]:
    """The logged metrics that are NaN or inf, as 'step N: name = value'."""
    return [
        f"step {row['step']}: {name} = {value}"
        for row in history
        for name, value in row.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]


if __name__ == "__main__":  # under torchrun: each row on every process
    out, rows = Path(sys.argv[1]), json.loads(sys.argv[2])
    results = [run_row(row, out / f"row{i}") for i, row in enumerate(rows)]
    (out / f"rank{distributed.rank()}.json").write_text(json.dumps(results))
    distributed.teardown()

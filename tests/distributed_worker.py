"""The program tests/test_distributed.py starts under torchrun: short GRPO runs of the tiny Qwen on K processes.

    python -m torch.distributed.run --nproc-per-node K tests/distributed_worker.py OUT_DIR RUNS_JSON

RUNS_JSON is a list of runs, done one after the other in the same process group:
{"name": ..., "config": {GRPOConfig overrides}, "resume": bool, "fail_on_rank": r}. Every rank writes each run's
final weights (full tensors) and metric history to OUT_DIR/<name>.rank<r>.pt. "fail_on_rank": the reward function raises
on that rank at step 2. "config_by_rank": {"r": overrides for rank r only}; with "expect_error", the ValueError the
trainer raises is written instead ({"error": message}) and the next run goes on. "eval": a held-out set of 4 problems,
evaluated at the end of the run.
"""

import json
import sys
from pathlib import Path

import torch

from minigrpo import GRPOConfig, GRPOTrainer, load_model_and_tokenizer, make_arithmetic_dataset
from minigrpo.run import distributed
from minigrpo.tasks.arithmetic import correctness_reward


def small_config(output_dir: Path, **overrides) -> GRPOConfig:
    """4 prompts x G=4 = 16 completions, micro-batches of 8: two per step in one process, one per rank in two. At a
    constant rate: the resume runs stop at max_steps=2 and continue to 3, one schedule only when it is constant."""
    preset = dict(
        prompts_per_step=4,
        num_generations=4,
        per_device_train_batch_size=8,
        lr_scheduler_type="constant",
        max_steps=3,
        eval_steps=0,
        save_steps=0,
        output_dir=str(output_dir),
    )
    return GRPOConfig.tiny_cpu(**{**preset, **overrides})


def failing_reward(fail_on_rank: int):
    calls = []

    def reward(prompts, completions, completion_ids, **columns):
        calls.append(1)
        if distributed.rank() == fail_on_rank and len(calls) == 2:
            raise ValueError(f"reward exploded on rank {fail_on_rank}")
        return correctness_reward(prompts, completions, completion_ids, **columns)

    return reward


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights as whole tensors (FSDP2 holds DTensor shards: gather them)."""
    return {
        name: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
        for name, value in model.state_dict().items()
    }


def run(out_dir: Path, spec: dict) -> None:
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    overrides = {**spec.get("config", {}), **spec.get("config_by_rank", {}).get(str(distributed.rank()), {})}
    config = small_config(out_dir / spec["name"], **overrides)
    reward = failing_reward(spec["fail_on_rank"]) if "fail_on_rank" in spec else correctness_reward
    dataset = make_arithmetic_dataset(n=64, split="train", seed=1)
    try:
        held_out = make_arithmetic_dataset(n=4, split="test", seed=0) if spec.get("eval") else None
        trainer = GRPOTrainer(model, [reward], config, dataset, held_out, processing_class=tokenizer)
    except ValueError as error:  # "expect_error": the refusal is the result, and the launch goes on
        if not spec.get("expect_error"):
            raise
        torch.save({"error": str(error)}, out_dir / f"{spec['name']}.rank{distributed.rank()}.pt")
        return
    trainer.train(resume_from_checkpoint=spec.get("resume", False))
    history = trainer.state.log_history
    torch.save(
        {"weights": full_state(model), "history": history}, out_dir / f"{spec['name']}.rank{distributed.rank()}.pt"
    )


if __name__ == "__main__":
    out, runs = Path(sys.argv[1]), json.loads(sys.argv[2])
    for spec in runs:
        run(out, spec)
    distributed.teardown()

"""The batch, in TRL's terms: how GRPOConfig derives generation_batch_size, steps_per_generation,
gradient_accumulation_steps and prompts_per_step from whichever of them a config gives (TRL's rule)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minigrpo.config import GRPOConfig

BATCH_FIELDS = ("prompts_per_step", "generation_batch_size", "steps_per_generation", "gradient_accumulation_steps")


def world_size() -> int:
    """Processes in the run: torchrun's WORLD_SIZE, else 1. per_device_train_batch_size is per process."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_batch_sizes(config: GRPOConfig, processes: int = 1) -> None:
    """Fill in generation_batch_size, steps_per_generation, gradient_accumulation_steps and prompts_per_step.

    TRL's rule (GRPOConfig.__post_init__), with mb = per_device_train_batch_size and K processes:

        generation_batch_size = mb * K * steps_per_generation      (completions per generation)
        steps_per_generation  = gradient_accumulation_steps       when neither is given
        prompts_per_step (B)  = generation_batch_size / G

    minigrpo's prompts_per_step is the same quantity seen from the prompts: giving it sets
    generation_batch_size = B * G and, unless gradient_accumulation_steps is given, makes each generation one
    optimizer step over all of its N = B * G completions (DeepSeekMath's on-policy update).
    """
    c, G, mb = config, config.num_generations, config.per_device_train_batch_size
    if mb < 1:
        raise ValueError(f"per_device_train_batch_size={mb}: it must be 1 or more.")
    for name in BATCH_FIELDS:
        if getattr(c, name) is not None and getattr(c, name) < 1:
            raise ValueError(f"{name}={getattr(c, name)}: it must be 1 or more (or None to derive it).")
    if c.prompts_per_step is not None:
        if c.generation_batch_size is not None and c.generation_batch_size != c.prompts_per_step * G:
            raise ValueError(
                f"prompts_per_step={c.prompts_per_step} x G={G} = {c.prompts_per_step * G} completions disagrees "
                f"with generation_batch_size={c.generation_batch_size}: give one of the two."
            )
        c.generation_batch_size = c.prompts_per_step * G
    if c.steps_per_generation is not None and c.generation_batch_size is not None:
        if c.generation_batch_size != mb * processes * c.steps_per_generation:
            raise ValueError(
                f"generation_batch_size={c.generation_batch_size} and steps_per_generation={c.steps_per_generation} "
                f"disagree (micro-batches of {mb} x {processes} process(es)): give one of the two."
            )
    elif c.generation_batch_size is not None:
        if c.prompts_per_step is not None and c.generation_batch_size % processes == 0:
            # minigrpo's spelling: a micro-batch larger than a process's share of the generation is that share
            # (the tiny preset's 128 on one process is 64 on each of two)
            mb = min(mb, c.generation_batch_size // processes)
        if c.generation_batch_size % (mb * processes) != 0:
            n = c.generation_batch_size // processes
            divisors = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
            raise ValueError(
                f"a generation of {c.generation_batch_size // G} prompts x G={G} = {c.generation_batch_size} "
                f"completions is not divisible into micro-batches of per_device_train_batch_size={mb} on "
                f"{processes} process(es): choose a divisor of {n} ({divisors})."
            )
        c.steps_per_generation = c.generation_batch_size // (mb * processes)
        if c.gradient_accumulation_steps is None and c.prompts_per_step is not None:
            c.gradient_accumulation_steps = c.steps_per_generation  # one optimizer step per generation
    else:
        if c.steps_per_generation is None:
            c.gradient_accumulation_steps = c.gradient_accumulation_steps or 1
            c.steps_per_generation = c.gradient_accumulation_steps
        c.generation_batch_size = mb * processes * c.steps_per_generation
    c.gradient_accumulation_steps = c.gradient_accumulation_steps or 1
    if c.generation_batch_size % G != 0:
        raise ValueError(
            f"generation_batch_size={c.generation_batch_size} is not a whole number of groups of "
            f"num_generations={G}: make it a multiple of {G} (per_device_train_batch_size x processes x "
            "steps_per_generation), or give prompts_per_step instead."
        )
    if c.steps_per_generation % c.gradient_accumulation_steps != 0:
        raise ValueError(
            f"steps_per_generation={c.steps_per_generation} is not a multiple of gradient_accumulation_steps="
            f"{c.gradient_accumulation_steps}: each generation must feed whole optimizer steps."
        )
    c.prompts_per_step = c.generation_batch_size // G

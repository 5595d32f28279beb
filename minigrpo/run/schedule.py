"""What the training loop walks through: prompts in a seeded, resumable order, the number of optimizer steps,
the learning rate of each step, and micro-batches."""

from __future__ import annotations

import math

import torch

from minigrpo.config import GRPOConfig


# --- prompts in a seeded, resumable order -------------------------------------------
class PromptSampler:
    """Walks the dataset in a fresh seeded permutation each epoch; its state is (epoch, position)."""

    def __init__(self, dataset_size: int, seed: int, shuffle: bool = True):
        self.dataset_size, self.seed, self.shuffle = dataset_size, seed, shuffle
        self.epoch, self.position = 0, 0

    def _order(self) -> list[int]:
        if not self.shuffle:  # GRPOConfig.shuffle_dataset=False: dataset order, every epoch
            return list(range(self.dataset_size))
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def next_indices(self, count: int) -> list[int]:
        indices = []
        while len(indices) < count:
            order = self._order()
            take = order[self.position : self.position + count - len(indices)]
            indices += take
            self.position += len(take)
            if self.position >= self.dataset_size:
                self.epoch, self.position = self.epoch + 1, 0
        return indices

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


MAX_EPOCH_STEPS = 10**9
"""The most optimizer steps num_train_epochs may ask for (max_steps=-1): a billion steps is years of training."""


def resolve_max_steps(config: GRPOConfig, num_prompts: int, per_generation: int) -> int:
    """Optimizer steps to train: config.max_steps, or for max_steps == -1 TRL's count for num_train_epochs:

        steps per epoch = (prompts // B) generations x optimizer_steps_per_generation

    rounded up to whole generations (minigrpo never stops inside a generation's optimizer steps)."""
    if config.max_steps > 0:
        steps = config.max_steps
    else:
        generations_per_epoch = num_prompts // config.prompts_per_step
        if generations_per_epoch == 0:
            raise ValueError(
                f"the training set has {num_prompts} prompts, fewer than one generation's "
                f"prompts_per_step={config.prompts_per_step}: add prompts or lower the batch."
            )
        steps = config.num_train_epochs * generations_per_epoch * per_generation
        if not steps <= MAX_EPOCH_STEPS:  # an inf or absurd count: nothing would run to the end (or math.ceil fails)
            raise ValueError(
                f"max_steps=-1 with num_train_epochs={config.num_train_epochs:g} means {steps:.3g} optimizer steps "
                f"({generations_per_epoch} generations of {config.prompts_per_step} prompts per epoch), more than "
                f"{MAX_EPOCH_STEPS:,}: lower num_train_epochs, or give max_steps."
            )
        steps = math.ceil(steps)
    return math.ceil(steps / per_generation) * per_generation


COSINE_CYCLES = 0.5
"""transformers' num_cycles for "cosine": half a cosine wave, from the base rate down to 0 at max_steps."""


def warmup_steps(config: GRPOConfig, max_steps: int) -> int:
    """W, the warm-up's optimizer steps: config.warmup_steps itself, or for a ratio in [0, 1) that share of
    max_steps rounded up (transformers 5's TrainingArguments.get_warmup_steps)."""
    if config.warmup_steps >= 1:
        return int(config.warmup_steps)
    return math.ceil(max_steps * config.warmup_steps)


def lr_at(step: int, config: GRPOConfig, max_steps: int, base_lr: float | None = None) -> float:
    """The learning rate of optimizer step `step` (0, 1, ...): a pure function of the step, as nanoGPT's get_lr(it),
    so a resumed run needs nothing but its step to continue the schedule.

    base_lr times transformers' factor (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
    get_cosine_schedule_with_warmup), computed as they compute it: step / W during the W warm-up steps (so the first
    step has rate 0), then 1 ("constant"), or with progress p = (step - W) / (max_steps - W) through the decay,
    1 - p ("linear") or (1 + cos(pi p)) / 2 ("cosine"), both 0 at max_steps. base_lr: config.learning_rate unless
    given (PPO's critic has its own).
    """
    base = config.learning_rate if base_lr is None else base_lr
    warmup = warmup_steps(config, max_steps)
    if step < warmup:
        return base * (float(step) / float(max(1, warmup)))
    if config.lr_scheduler_type == "linear":
        return base * max(0.0, float(max_steps - step) / float(max(1, max_steps - warmup)))
    if config.lr_scheduler_type == "cosine":
        progress = float(step - warmup) / float(max(1, max_steps - warmup))
        return base * max(0.0, 0.5 * (1.0 + math.cos(math.pi * COSINE_CYCLES * 2.0 * progress)))
    return base


def schedule_change_note(saved_config: dict, config: GRPOConfig, step: int, max_steps: int) -> str | None:
    """The line a resume prints when a decay (linear or cosine) is recomputed for a new run length (None otherwise).

    The rule is transformers' (its Trainer builds the scheduler for the new max_steps on resume and restores only the
    step): the rate of step s is lr_at(s) for the NEW max_steps (linear: base_lr x (max_steps - s) / (max_steps - W)),
    so an extended run's rate steps up at the resumed step and decays to 0 at the new end. saved_config: the
    checkpoint's config (its max_steps and num_train_epochs are compared with config's)."""
    if config.lr_scheduler_type == "constant":
        return None
    changed = [
        f"{name} {saved_config[name]!r} -> {getattr(config, name)!r}"
        for name in ("max_steps", "num_train_epochs")
        if name in saved_config and saved_config[name] != getattr(config, name)
    ]
    if not changed or (config.max_steps > 0 and "max_steps" not in changed[0]):
        return None  # the same run length (num_train_epochs does not count when max_steps is given)
    return (
        f"resuming with {changed[0]}: the {config.lr_scheduler_type} decay is recomputed for {max_steps} steps, as "
        f"transformers does on resume: learning rate {lr_at(step, config, max_steps):.3g} at step {step}, decaying "
        f"to 0 at step {max_steps}"
    )


def micro_batches(num_rows: int, size: int, first: int = 0) -> list[slice]:
    """[first, first + size), [first + size, first + 2 size), ...: the slices of micro-batches of `size` over the
    num_rows rows from row `first` (the last may be shorter)."""
    end = first + num_rows
    return [slice(start, min(start + size, end)) for start in range(first, end, size)]


def optimizer_step_rows(num_rows: int, config: GRPOConfig) -> list[slice]:
    """TRL's batch fields: the row slices of a generation's optimizer steps, in order. Each of the num_iterations
    passes over the N = num_rows rows takes steps_per_generation / gradient_accumulation_steps steps, each on the
    same number of whole groups."""
    rows_per_step = num_rows * config.gradient_accumulation_steps // config.steps_per_generation
    return micro_batches(num_rows, rows_per_step) * config.num_iterations

"""The trainer: the only stateful object. It orchestrates the stages and does no math itself.

    prompts -> rollout (stage 1) -> rewards (2) -> advantages (3) -> loss + update (4)

``Trainer`` holds everything GRPO and PPO share: the loop, prompt sampling,
rollout and reward scoring, evaluation, metrics, the loss mask, the update in
micro-batches with gradient accumulation, and checkpoints (written and read by
``minigrpo.checkpoints``). ``GRPOTrainer`` adds stages 3 and 4: the GRPO step.
``minigrpo.ppo.PPOTrainer`` adds its critic on the same base.
"""

from __future__ import annotations

import copy
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from minigrpo import checkpoints, distributed
from minigrpo.advantages import group_relative_advantages, group_rewards, zero_std_groups
from minigrpo.checkpoints import (  # noqa: F401 (re-exported)
    HISTORY_FILE,
    METRICS_FILE,
    STATE_FILE,
    CheckpointError,
    latest_checkpoint,
)
from minigrpo.config import GRPOConfig
from minigrpo.logprobs import masked_mean
from minigrpo.losses import grpo_loss
from minigrpo.models import (
    add_adapters,
    check_bf16_request,
    disable_dropout,
    is_peft_model,
    load_model_and_tokenizer,
    make_reference_model,
    precision_context,
    set_gradient_checkpointing,
)
from minigrpo.rewards import compute_rewards, reward_func_name
from minigrpo.rollout import (
    Rollout,
    completion_mask_from_eos,
    eos_token_ids,
    generate_completions,
    render_prompts,
    repeat_for_group,
    sample_group_rollout,
    tokenize_prompts,
)
from minigrpo.tokenization import load_tokenizer


class NonFiniteError(FloatingPointError):
    """The loss or the gradient norm of a step is NaN or inf; the step was not applied."""


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


# --- evaluation ---------------------------------------------------------------------
def greedy_completions(model, tokenizer, prompts: list, config: GRPOConfig) -> list[str]:
    """Greedy (temperature 0) completions of `prompts`, config.eval_batch_size at a time."""
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    texts = []
    for start in range(0, len(prompts), config.eval_batch_size):
        batch = prompts[start : start + config.eval_batch_size]
        prompt_ids, prompt_mask = tokenize_prompts(tokenizer, batch, config.max_prompt_length, device)
        completion_ids = generate_completions(model, tokenizer, prompt_ids, prompt_mask, config, greedy=True)
        completion_mask, _ = completion_mask_from_eos(completion_ids, eos_ids)
        lengths = completion_mask.sum(1).tolist()
        ids = [row[: int(n)] for row, n in zip(completion_ids.tolist(), lengths, strict=True)]
        texts += tokenizer.batch_decode(ids, skip_special_tokens=True)
    return texts


def evaluate_model(model, tokenizer, dataset, reward_funcs: Sequence[Callable], config: GRPOConfig) -> dict:
    """Greedy held-out evaluation: eval/accuracy (mean of the first reward function) and each reward's mean.
    Under torchrun every rank must call it: the prompts are shared out and the completions gathered."""
    prompts = list(dataset["prompt"])
    # Under torchrun each rank completes a slice of the prompts; every rank gets all completions back, in order.
    completions = distributed.map_shards(lambda part: greedy_completions(model, tokenizer, part, config), prompts)
    columns = {name: list(dataset[name]) for name in dataset.column_names if name != "prompt"}
    rewards_per_func, rewards = compute_rewards(
        reward_funcs,
        prompts,
        completions,
        [[] for _ in completions],
        columns,
        config.reward_weights,
        config.reward_timeout,
    )
    metrics = {"eval/accuracy": rewards_per_func[:, 0].nanmean().item(), "eval/reward": rewards.mean().item()}
    for f, func in enumerate(reward_funcs):
        metrics[f"eval/rewards/{reward_func_name(func)}/mean"] = rewards_per_func[:, f].nanmean().item()
    return metrics


# --- the model argument: a model or a name, as in TRL ----------------------------------
def resolve_model_and_tokenizer(model, processing_class=None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``model`` may be a name ("tiny", a Hub id, a folder): load it (and its tokenizer) with
    load_model_and_tokenizer. For a model object without ``processing_class``, load the tokenizer saved
    with it (``model.name_or_path``), as TRL does."""
    if isinstance(model, str | Path):
        model, tokenizer = load_model_and_tokenizer(str(model))
        return model, processing_class if processing_class is not None else tokenizer
    if processing_class is not None:
        return model, processing_class
    name = getattr(model, "name_or_path", "")
    if not name:
        raise ValueError("processing_class is None and the model has no name_or_path: pass processing_class=tokenizer.")
    return model, load_tokenizer(name)


# --- the shared loop ----------------------------------------------------------------
class Trainer:
    """The loop every RL trainer here shares. Subclasses implement `optimize(rollout, rewards)`.

    The signature is TRL's: ``(model, reward_funcs, args, train_dataset, eval_dataset, processing_class)``,
    positional order included, so a TRL script runs with only its import line changed. ``model`` is a
    model or a name ("tiny", a Hub id, a local folder) loaded with ``load_model_and_tokenizer``;
    ``processing_class`` (the tokenizer) defaults to that model's own. minigrpo's extras are keyword-only.

    ``peft_config`` (TRL's name; a ``peft.LoraConfig``, see ``models.lora_config``) wraps the policy with
    LoRA adapters: only they are trained, and with beta > 0 the reference is the same model with its
    adapters switched off, so no reference copy is built. An explicit ``ref_model`` still wins.
    """

    config_class = GRPOConfig
    supports_distributed = False
    """Whether the update runs under torchrun (its gradients synchronised over the processes)."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Callable | Sequence[Callable],
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class: PreTrainedTokenizerBase | None = None,
        *,
        ref_model: PreTrainedModel | None = None,
        peft_config=None,
    ):
        self.config = args if args is not None else self.config_class()
        distributed.init_from_environment()  # under torchrun: join the process group (before loading a model)
        self.model, self.tokenizer = resolve_model_and_tokenizer(model, processing_class)
        if peft_config is not None:
            self.model = add_adapters(self.model, peft_config, self.config.seed)
        if getattr(self.model, "is_loaded_in_4bit", False) and not is_peft_model(self.model):
            raise ValueError("a 4-bit model cannot be updated itself: pass a peft_config (QLoRA trains adapters).")
        self.model = distributed.local_device(self.model)
        self.reward_funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs or [])
        if train_dataset is None:
            raise ValueError(f"{type(self).__name__} needs a train_dataset with a 'prompt' column.")
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self._check_inputs()
        self.device = next(self.model.parameters()).device
        check_bf16_request(self.device, self.config.bf16)
        if self.config.disable_dropout:
            disable_dropout(self.model)
        if self.config.gradient_checkpointing:  # only switched on: a user's own setting is left alone otherwise
            set_gradient_checkpointing(self.model, True)
        if self.config.beta != 0.0:
            self.ref_model = ref_model if ref_model is not None else make_reference_model(self.model, self.config.bf16)
        else:
            self.ref_model = None  # beta == 0: no KL term, no reference model in memory
        # The update's forward pass: in DDP (or sharded by FSDP2) under torchrun, plain otherwise.
        self.policy = distributed.wrap_policy(self.model, self.config)
        self.optimizer = torch.optim.AdamW(
            self.optimizer_param_groups(),
            lr=self.config.learning_rate,
            betas=(self.config.adam_beta1, self.config.adam_beta2),
            weight_decay=self.config.weight_decay,
        )
        # Optimizer steps taken so far, however they were taken (a hook on optimizer.step counts them):
        # _guarded_step compares it before and after a step to know whether the weights have changed yet.
        self.optimizer_steps = 0
        self.optimizer.register_step_post_hook(self._count_optimizer_step)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.sampler = PromptSampler(len(train_dataset), self.config.seed, self.config.shuffle_dataset)
        self.max_steps = resolve_max_steps(self.config, len(train_dataset), self.optimizer_steps_per_generation())
        self.step = 0  # optimizer steps taken (TRL's global_step)
        self.history: list[dict] = []
        self.state = TrainerState(self)
        self.output_dir = Path(self.config.output_dir)

    @property
    def metrics_path(self) -> Path:
        """<logging_dir or output_dir>/metrics.jsonl: one JSON line per logged step."""
        return Path(self.config.logging_dir or self.config.output_dir) / METRICS_FILE

    @property
    def _sharded(self) -> bool:
        return distributed.is_sharded(self.model)

    @property
    def args(self) -> GRPOConfig:
        """The config, under TRL's name (``trainer.args``)."""
        return self.config

    @property
    def processing_class(self) -> PreTrainedTokenizerBase:
        """The tokenizer, under TRL's name (``trainer.processing_class``)."""
        return self.tokenizer

    def optimizer_param_groups(self) -> list[dict]:
        """AdamW's parameter groups, each a dict with its "params" and "lr". A subclass that trains more than
        the policy overrides this (PPOTrainer adds its critic, at its own learning rate)."""
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": self.config.learning_rate}]

    def _count_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_steps += 1

    def _lr_factor(self, step: int) -> float:
        """Learning-rate multiplier at optimizer step `step`: linear warm-up, then constant or linear decay."""
        config = self.config
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.lr_scheduler_type == "linear":
            return max(0.0, (self.max_steps - step) / max(1, self.max_steps - config.warmup_steps))
        return 1.0

    # --- checks that fail at once ---------------------------------------------------
    def _check_inputs(self) -> None:
        config = self.config
        if distributed.is_distributed():
            if not self.supports_distributed:
                raise NotImplementedError(
                    f"{type(self).__name__} does not run under torchrun: only GRPOTrainer synchronises its update "
                    "over processes. Run it in one process (python, not torchrun)."
                )
            distributed.check_config(config)
        if not self.reward_funcs or not all(callable(f) for f in self.reward_funcs):
            raise ValueError(
                "reward_funcs must be one or more functions f(prompts, completions, completion_ids, **kw)."
            )
        if config.reward_weights is not None and len(config.reward_weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights has {len(config.reward_weights)} entries for {len(self.reward_funcs)} reward "
                "functions: give one weight per function."
            )
        for name, dataset in (("train_dataset", self.train_dataset), ("eval_dataset", self.eval_dataset)):
            if dataset is None:
                continue
            if "prompt" not in dataset.column_names:
                raise ValueError(
                    f"{name} has columns {dataset.column_names} but no 'prompt' column: rename the column that "
                    "holds the prompts (chat messages or strings) to 'prompt'."
                )
            if len(dataset) == 0:
                raise ValueError(f"{name} is empty: give it at least one prompt.")
            longest = max(len(ids) for ids in self._prompt_token_ids(dataset["prompt"]))
            if longest > config.max_prompt_length:
                raise ValueError(
                    f"the longest prompt in {name} is {longest} tokens but max_prompt_length="
                    f"{config.max_prompt_length}: raise max_prompt_length to at least {longest} or shorten the prompts."
                )
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context is not None and config.max_prompt_length + config.max_completion_length > context:
            raise ValueError(
                f"max_prompt_length={config.max_prompt_length} + max_completion_length="
                f"{config.max_completion_length} exceeds the model's context of {context} tokens: lower one of them."
            )

    def _prompt_token_ids(self, prompts) -> list[list[int]]:
        return self.tokenizer(render_prompts(self.tokenizer, list(prompts)), add_special_tokens=False)["input_ids"]

    # --- the loop -----------------------------------------------------------------
    def train(self, resume_from_checkpoint: bool | str | None = None, allow_config_change: bool = False) -> list[dict]:
        """Run until max_steps optimizer steps; returns the metric history (one dict per logged step, also in
        trainer.state.log_history; TRL's train() returns a TrainOutput instead).

        resume_from_checkpoint: True = the newest checkpoint in output_dir that reads completely (a fresh, seeded
        run when there is none), a path = that checkpoint. allow_config_change: resume even though
        training-defining fields (learning_rate, G, beta, ...) differ from the checkpoint's run.
        Without resume, an output_dir holding an earlier run is refused unless config.overwrite_output_dir.
        output_dir is locked while training: a second trainer on it gets an error.
        """
        # Under torchrun only rank 0 writes to output_dir, so only rank 0 holds its lock.
        lock = checkpoints.output_dir_lock(self.output_dir) if distributed.is_main_process() else nullcontext()
        with lock:
            self._begin(resume_from_checkpoint, allow_config_change)
            return self._train_loop()

    def _begin(self, resume_from_checkpoint: bool | str | None, allow_config_change: bool) -> None:
        """Resume (from a path, or the newest checkpoint in output_dir that reads completely), or start fresh."""
        if not resume_from_checkpoint:
            self._start_fresh(replace=self.config.overwrite_output_dir)
            return
        modules = self.trainable_modules()
        if resume_from_checkpoint is not True:  # a checkpoint named by the user: no fallback to another one
            path = Path(resume_from_checkpoint)
            self._restore(path, checkpoints.read_checkpoint(path, modules), allow_config_change)
            return
        found = checkpoints.find_resumable(self.output_dir, modules)
        if found is None:
            print(f"no checkpoint in {self.output_dir} to resume: starting a fresh run (seed {self.config.seed})")
            self._start_fresh(replace=True)  # metrics without a checkpoint cannot be continued
            return
        path, state, problems = found
        for problem in problems:
            warnings.warn(f"{self.output_dir}: {problem}", stacklevel=3)
        self._restore(path, state, allow_config_change)

    def _start_fresh(self, replace: bool) -> None:
        """Seed, once output_dir holds no earlier run (replaced when `replace`, refused otherwise)."""
        if distributed.is_main_process():  # a refusal raises on rank 0; the others stop with it (torchrun)
            checkpoints.claim_output_dir(self.output_dir, replace)
            if self.metrics_path != self.output_dir / METRICS_FILE:  # a separate logging_dir: start its file afresh
                self.metrics_path.unlink(missing_ok=True)
        distributed.barrier()
        random.seed(self.config.seed)
        torch.manual_seed(self.config.seed)

    def _train_loop(self) -> list[dict]:
        self.model.train()
        progress = tqdm(
            total=self.max_steps,
            initial=self.step,
            desc=type(self).__name__.removesuffix("Trainer"),
            unit="step",
            dynamic_ncols=True,
            disable=not distributed.is_main_process(),
        )
        self._window: list[dict] = []  # metrics of the generations since the last logged step
        while self.step < self.max_steps:
            before = self.step
            metrics = self._guarded_step()  # one generation and its optimizer steps
            self.step += self.optimizer_steps_per_generation()
            self._guarded_finish(before, metrics)
            progress.update(self.step - before)
            progress.set_postfix({k: f"{metrics[k]:.3f}" for k in ("reward",) if k in metrics})
        progress.close()
        return self.history

    def optimizer_steps_per_generation(self) -> int:
        """Optimizer steps each generation makes (the step counter advances by this). GRPO: num_iterations x
        steps_per_generation / gradient_accumulation_steps; an algorithm that steps differently overrides it."""
        return self.config.optimizer_steps_per_generation

    def _due(self, before: int, every: int) -> bool:
        """Did the last generation's optimizer steps (before, self.step] reach a multiple of `every`, or the end?
        (0 = only at the end.)"""
        return self.step >= self.max_steps or (every > 0 and self.step // every > before // every)

    def _guarded_step(self) -> dict:
        """One training step. If it fails before the first optimizer.step, the state as it was
        when the step began is saved, so a resumed run continues exactly (nothing is lost)."""
        start = {"rng": checkpoints.rng_state(), "sampler": self.sampler.state_dict()}
        steps_before = self.optimizer_steps
        try:
            return self.training_step()
        except BaseException as error:
            weights_changed = self.optimizer_steps != steps_before  # then the start state no longer fits them
            if not weights_changed and self.step > 0 and distributed.stopped_together(error):
                self._save_after_failure(f"step {self.step + 1}", start["rng"], start["sampler"])
            raise

    def _guarded_finish(self, before: int, metrics: dict) -> None:
        """Log (every logging_steps, averaging the generations in between), evaluate and save after the
        generation that took the optimizer steps (before, self.step]. If evaluation or logging fails, the state
        right after the step (its training metrics logged, without evaluation) is saved, so a resume starts at
        the next step."""
        config = self.config
        after = {"rng": checkpoints.rng_state(), "sampler": self.sampler.state_dict()}
        self._window.append(metrics)
        try:
            eval_every = config.eval_steps if config.eval_steps is not None else config.logging_steps
            evaluate = (
                config.eval_strategy == "steps" and self.eval_dataset is not None and self._due(before, eval_every)
            )
            if evaluate or self._due(before, config.logging_steps):
                logged = average_metrics(self._window)
                if evaluate:
                    logged.update(self.evaluate())
                self._log(logged)
                self._window = []
        except BaseException:
            if not self.history or self.history[-1]["step"] != self.step:
                self.history.append({"step": self.step, **average_metrics(self._window)})  # rewritten on resume
            self._save_after_failure(f"evaluating or logging step {self.step}", after["rng"], after["sampler"])
            raise
        if config.save_strategy == "steps" and self._due(before, config.save_steps):
            self.save_checkpoint()

    def _save_after_failure(self, what: str, rng: dict, sampler: dict) -> None:
        """Save the state of the last complete step (rng, sampler: as they were then); a save that fails too is
        reported, and the original error is the one raised."""
        try:
            path = self.save_checkpoint(rng_state=rng, sampler_state=sampler)
        except Exception as error:
            print(f"\n{what} failed, and saving the state after step {self.step} failed too: {error}")
            return
        print(
            f"\n{what} failed: the state after step {self.step} is saved in {path}; "
            "resume with --resume (or train(resume_from_checkpoint=True))."
        )

    def training_step(self) -> dict:
        """Stages 1-2 (shared), then the subclass's update. Returns the step's metrics."""
        started = time.perf_counter()
        with distributed.fail_together("the rollout"):  # a rank that fails here stops every rank
            rollout, rewards, metrics = self.collect_rollout()
        updated = time.perf_counter()
        metrics.update(self.optimize(rollout, rewards))
        metrics["time/update"] = time.perf_counter() - updated
        metrics["step_time"] = time.perf_counter() - started
        return distributed.reduce_metrics(metrics)  # this rank's -> the step's (means over ranks)

    def collect_rollout(self) -> tuple[Rollout, torch.Tensor, dict]:
        """Stages 1-2: B prompts -> N completions -> rewards (N,). Also the rollout metrics.
        Under torchrun: this rank's B/K prompts, each group sampled from its own seed (minigrpo.distributed)."""
        config = self.config
        indices, group_seeds = distributed.local_groups(
            self.sampler.next_indices(config.prompts_per_step), config.seed, self.step
        )
        batch = self.train_dataset[indices]
        started = time.perf_counter()
        rollout = sample_group_rollout(
            self.model, self.tokenizer, batch["prompt"], config, self.ref_model, group_seeds=group_seeds
        )
        scored = time.perf_counter()
        columns = {k: repeat_for_group(v, config.num_generations) for k, v in batch.items() if k != "prompt"}
        rewards_per_func, rewards = compute_rewards(
            self.reward_funcs,
            repeat_for_group(batch["prompt"], config.num_generations),
            rollout.completions,
            rollout.completion_id_lists(),
            columns,
            config.reward_weights,
            config.reward_timeout,
        )
        metrics = {"time/rollout": scored - started, "time/rewards": time.perf_counter() - scored}
        metrics.update(reward_metrics(rewards_per_func, rewards, self.reward_funcs, config.num_generations))
        metrics.update(completion_metrics(rollout))
        return rollout, rewards.to(self.device), metrics

    def optimize(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        raise NotImplementedError

    def evaluate(self) -> dict:
        """Greedy accuracy on the held-out set (see evaluate_model)."""
        return evaluate_model(self.model, self.tokenizer, self.eval_dataset, self.reward_funcs, self.config)

    def _log(self, metrics: dict) -> None:
        epoch = self.sampler.epoch + self.sampler.position / self.sampler.dataset_size
        metrics = {"step": self.step, "epoch": round(epoch, 4), **metrics}
        self.history.append(metrics)
        if not distributed.is_main_process():
            return
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a") as f:
            f.write(checkpoints.dumps(metrics) + "\n")  # valid JSON: a NaN metric is written as null

    # --- the update, shared by every algorithm -------------------------------------------
    def loss_mask(self, rollout: Rollout) -> torch.Tensor:
        """(N, T) the tokens the loss counts: the completion mask, minus every token of a truncated completion
        when config.mask_truncated_completions (DAPO: a cut-off answer is not a wrong answer)."""
        mask = rollout.completion_mask
        if self.config.mask_truncated_completions:
            mask = mask * (~rollout.is_truncated).unsqueeze(1)  # (N, T)
        return mask

    def accumulate_and_step(
        self,
        num_rows: int,
        micro_batch_loss: Callable[[slice], tuple[torch.Tensor, dict]],
        loss_spans_step: bool = False,
    ) -> dict:
        """One optimizer step over N rows in micro-batches of per_device_train_batch_size, with gradient accumulation.

        `micro_batch_loss(rows)` returns (loss, metrics) for the rows `rows`.
        Each loss is divided by the number of micro-batches, so the gradient
        is that of their mean, unless `loss_spans_step`: the loss was already
        divided by a normaliser of the whole step (dapo's token count), and
        the micro-batch losses add up to the step's loss. Metrics are averaged
        over micro-batches. Then: clip the gradient norm, step, advance the
        schedule. Returns the metrics with grad_norm and learning_rate.
        Under torchrun the gradients are averaged over the processes after the
        last micro-batch's backward (the others accumulate locally).
        """
        slices = micro_batches(num_rows, self.config.per_device_train_batch_size)
        accumulation = len(slices)  # N / per_device_train_batch_size, or N/K per process under torchrun
        totals: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for i, rows in enumerate(slices):
            with distributed.gradient_sync(self.policy, enabled=i == accumulation - 1):
                loss, metrics = micro_batch_loss(rows)
                self._check_finite_loss(loss, rows)
                (loss if loss_spans_step else loss / accumulation).backward()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / accumulation
        if loss_spans_step:
            totals["loss"] *= accumulation  # the sum of the micro-batch losses is the step's loss
        totals["grad_norm"] = self.clip_and_step()
        totals["learning_rate"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return totals

    def clip_and_step(self) -> float:
        """Clip the global gradient norm to config.max_grad_norm, take an optimizer step; returns the norm."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if not math.isfinite(norm.item()):  # clipping cannot rescue an inf or NaN gradient: it would reach the weights
            raise NonFiniteError(
                f"step {self.step + 1}: the gradient norm is {norm.item()} although the loss was finite, so the "
                f"update was not applied. Likely cause: an overflow in the backward pass (learning_rate="
                f"{self.config.learning_rate:g} too high for this model, or reduced precision); lower learning_rate "
                "and resume from the last checkpoint (allow_config_change=True)."
            )
        self.optimizer.step()
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor

    def _check_finite_loss(self, loss: torch.Tensor, rows: slice) -> None:
        """A NaN or inf loss stops the run before backward: its gradient would turn every weight into NaN."""
        if torch.isfinite(loss).all():
            return
        config = self.config
        raise NonFiniteError(
            f"step {self.step + 1}: the loss of completions {rows.start}-{rows.stop - 1} is {loss.item()}, so the "
            f"update was not applied. Likely cause: log-probs that overflowed (learning_rate={config.learning_rate:g}"
            f" too high for this model, so the last updates diverged) or, with beta={config.beta:g}, a policy far "
            "from the reference (the KL's exp overflows). Lower learning_rate (or beta) and resume from the last "
            "checkpoint (allow_config_change=True)."
        )

    # --- checkpoints (minigrpo.checkpoints does the work) -------------------------------
    def trainable_modules(self) -> dict[str, torch.nn.Module]:
        """Modules whose weights a checkpoint must hold; 'model' is the policy."""
        return {"model": self.model}

    def save_checkpoint(self, rng_state: dict | None = None, sampler_state: dict | None = None) -> Path:
        """Write output_dir/checkpoint-{step} atomically, then keep only the newest save_total_limit.

        rng_state / sampler_state: the state to resume from, when it is not the
        current one (a failed step saves the state it started from).
        Under torchrun every rank calls it and rank 0 writes (every rank holds the same weights and optimizer
        state, and draws the same prompts); the others wait until the folder is complete.
        """
        path = self.output_dir / f"checkpoint-{self.step}"
        # FSDP2: every rank takes part in gathering the whole weights and optimizer state for rank 0.
        full_states = distributed.full_state_dicts(self.model, self.optimizer) if self._sharded else None
        if distributed.is_main_process():
            path = checkpoints.save_checkpoint(
                self.output_dir,
                self.step,
                self.trainable_modules(),
                self.tokenizer,
                self.optimizer,
                self.scheduler,
                sampler_state or self.sampler.state_dict(),
                rng_state or checkpoints.rng_state(),
                self.history,
                self.run_args(),
                full_states,
            )
            checkpoints.rotate_checkpoints(self.output_dir, self.config.save_total_limit)
        distributed.barrier()
        return path

    def run_args(self) -> dict:
        """What defines this run (config, model, reward functions), saved with each checkpoint."""
        return checkpoints.run_args(self.config, self.model, [reward_func_name(f) for f in self.reward_funcs])

    def load_checkpoint(self, path: str | Path, allow_config_change: bool = False) -> None:
        """Restore model(s), optimizer, scheduler, RNG, data position and metric history; every file is read and
        checked first, and a run whose training-defining settings differ is refused unless allow_config_change."""
        self._restore(Path(path), checkpoints.read_checkpoint(path, self.trainable_modules()), allow_config_change)

    def _restore(self, path: Path, state: dict, allow_config_change: bool) -> None:
        changes = checkpoints.changed_run_fields(state["args"], self.run_args())
        if changes and not allow_config_change:
            raise CheckpointError(
                f"{path} belongs to a run with other settings ({'; '.join(changes)}): resume with the same "
                "settings, or pass allow_config_change=True (--allow-config-change) to continue with the new ones."
            )
        load_full_states = None
        if self._sharded:  # FSDP2: every rank reads the whole states and keeps its shards
            load_full_states = lambda weights, optimizer_state: distributed.load_full_state_dicts(  # noqa: E731
                self.model, self.optimizer, tie_weights(self.model, dict(weights)), optimizer_state
            )
        checkpoints.apply_checkpoint(state, self.trainable_modules(), self.optimizer, self.scheduler, load_full_states)
        if changes:
            self._apply_config_to_optimizer()
            print(f"resuming with changed settings: {'; '.join(changes)}")
        self.sampler.load_state_dict(state["sampler"])
        checkpoints.set_rng_state(state["rng"])
        self.step, self.history = state["step"], state["history"]
        if distributed.is_main_process():
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.metrics_path, "w") as f:  # drop lines logged after the checkpoint
                f.writelines(checkpoints.dumps(m) + "\n" for m in self.history)
            print(f"resumed from {path} at step {self.step}")

    def _apply_config_to_optimizer(self) -> None:
        """After a resume with allow_config_change: the checkpoint's optimizer state carries the old learning
        rates, betas and weight decay; the current config's take over (the moments are kept)."""
        fresh = self.optimizer_param_groups()
        self.scheduler.base_lrs = [group["lr"] for group in fresh]
        for group, new in zip(self.optimizer.param_groups, fresh, strict=True):
            group["initial_lr"] = new["lr"]
            group["lr"] = new["lr"] * self._lr_factor(self.scheduler.last_epoch)
            group["betas"] = (self.config.adam_beta1, self.config.adam_beta2)
            group["weight_decay"] = self.config.weight_decay
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what get_last_lr reports

    def save_model(self, path: str | Path | None = None, merged: bool = False) -> Path:
        """The trained policy and tokenizer, loadable with load_model_and_tokenizer(path).

        A LoRA policy writes its adapters only (adapter_config.json + adapter_model.safetensors, megabytes),
        which load on top of the base model they name; ``merged=True`` writes the base model with the
        adapters merged into its weights instead (W + (alpha/r) BA: a plain model, as large as the base).
        The merge runs on a copy, so training can go on with the adapters as they were.
        """
        path = Path(path) if path is not None else self.output_dir / "final"
        weights = distributed.full_state_dicts(self.model, self.optimizer)[0] if self._sharded else None
        if distributed.is_main_process():  # under torchrun: every rank calls it, rank 0 writes
            if merged and is_peft_model(self.model):
                copy.deepcopy(self.model).merge_and_unload().save_pretrained(path)
            else:
                self.model.save_pretrained(path, state_dict=weights)
            self.tokenizer.save_pretrained(path)
        distributed.barrier()
        return path


# --- GRPO -------------------------------------------------------------------------
class GRPOTrainer(Trainer):
    """GRPO: group-relative advantages (stage 3) and the clipped, KL-regularised loss (stage 4).

    Usage::

        trainer = GRPOTrainer(model, [correctness_reward], GRPOConfig.tiny_cpu(), train_dataset,
                             processing_class=tokenizer)
        # or, as in TRL: GRPOTrainer(model="tiny", reward_funcs=..., args=..., train_dataset=...)
        history = trainer.train()

    Under ``torchrun --nproc-per-node K`` the same code trains data-parallel (minigrpo.distributed).
    """

    supports_distributed = True

    def optimize(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        config = self.config
        grouped = group_rewards(rewards, config.num_generations)  # (B, G)
        advantages = group_relative_advantages(
            grouped, config.scale_rewards, config.baseline, config.std_ddof, config.advantage_epsilon
        ).flatten()  # (N,)
        loss_mask = self.loss_mask(rollout)  # (N, T)
        metrics = {"advantages/abs_mean": advantages.abs().mean().item()}
        # steps_per_generation / gradient_accumulation_steps optimizer steps per pass, each on its own slice of
        # whole groups (1 unless TRL's batch fields say otherwise), num_iterations passes over the rollout.
        chunks = micro_batches(
            len(advantages), len(advantages) * config.gradient_accumulation_steps // config.steps_per_generation
        )
        passes = [
            self.update_policy(rollout, advantages, loss_mask, rows)
            for _ in range(config.num_iterations)
            for rows in chunks
        ]
        metrics.update(average_metrics(passes))
        return metrics

    def update_policy(
        self, rollout: Rollout, advantages: torch.Tensor, loss_mask: torch.Tensor, step_rows: slice = slice(None)
    ) -> dict:
        """One optimizer step on the rollout's rows `step_rows` (default: all of them): the GRPO loss of each
        micro-batch, accumulated."""
        config = self.config
        first = step_rows.start or 0
        num_rows = len(range(*step_rows.indices(len(advantages))))
        # dapo's normaliser: tokens in the optimizer step (under torchrun: all ranks' tokens / K, see step_token_count)
        num_items_in_batch = distributed.step_token_count(loss_mask[step_rows])

        def micro_batch_loss(rows: slice) -> tuple[torch.Tensor, dict]:
            rows = slice(first + rows.start, first + rows.stop)  # rows of the rollout
            with precision_context(self.device, self.config.bf16):
                logps, entropy = self.policy(rollout, rows)  # (n, T), (n, T): completion_logps, in DDP if any
            loss, metrics = grpo_loss(
                logps,
                None if rollout.old_per_token_logps is None else rollout.old_per_token_logps[rows],
                None if rollout.ref_per_token_logps is None else rollout.ref_per_token_logps[rows],
                advantages[rows],
                loss_mask[rows],
                config,
                num_items_in_batch,
            )
            metrics.update(loss=loss.item(), entropy=masked_mean(entropy.detach(), loss_mask[rows]).item())
            return loss, metrics

        # dapo already divides by the whole step's token count; the others average the micro-batches.
        return self.accumulate_and_step(num_rows, micro_batch_loss, loss_spans_step=config.loss_type == "dapo")


# --- metrics (TRL's names) ----------------------------------------------------------
def reward_metrics(rewards_per_func: torch.Tensor, rewards: torch.Tensor, reward_funcs, num_generations: int) -> dict:
    """reward, reward_std (mean of the group stds), rewards/<fn>/mean|std, frac_reward_zero_std."""
    grouped = group_rewards(rewards.float(), num_generations)  # (B, G)
    metrics = {
        "reward": rewards.mean().item(),
        "reward_std": grouped.std(dim=1).mean().item(),
        "frac_reward_zero_std": zero_std_groups(grouped).float().mean().item(),
    }
    for f, func in enumerate(reward_funcs):
        name = reward_func_name(func)
        metrics[f"rewards/{name}/mean"] = rewards_per_func[:, f].nanmean().item()
        metrics[f"rewards/{name}/std"] = _nanstd(rewards_per_func[:, f])
    return metrics


def completion_metrics(rollout: Rollout) -> dict:
    """completions/mean_length, min/max_length, clipped_ratio (truncated), mean_terminated_length."""
    lengths = rollout.completion_mask.sum(1).float()  # (N,)
    terminated = lengths[~rollout.is_truncated]
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": rollout.is_truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item() if terminated.numel() else 0.0,
    }


def _nanstd(values: torch.Tensor) -> float:
    values = values[~values.isnan()]
    return values.std().item() if values.numel() > 1 else 0.0


def average_metrics(rows: list[dict]) -> dict:
    """The mean of each metric over `rows` (a metric missing from some rows: over the rows that have it)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}


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
        steps = math.ceil(config.num_train_epochs * generations_per_epoch * per_generation)
    return math.ceil(steps / per_generation) * per_generation


class TrainerState:
    """TRL's ``trainer.state``, read-only: global_step, max_steps, log_history (one dict per logged step)."""

    def __init__(self, trainer: Trainer):
        self._trainer = trainer

    @property
    def global_step(self) -> int:
        return self._trainer.step

    @property
    def max_steps(self) -> int:
        return self._trainer.max_steps

    @property
    def log_history(self) -> list[dict]:
        return self._trainer.history


def tie_weights(model, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """save_pretrained leaves out lm_head.weight when it is tied to the input embeddings; put it back."""
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights


def micro_batches(num_rows: int, size: int) -> list[slice]:
    """[0, size), [size, 2 size), ...: the row slices of the micro-batches (the last may be shorter)."""
    return [slice(start, start + size) for start in range(0, num_rows, size)]

"""The trainer: the only stateful object. It orchestrates the stages and does no math itself.

    prompts -> rollout (stage 1) -> rewards (2) -> advantages (3) -> loss + update (4)

``Trainer`` holds everything GRPO and PPO share: the loop, prompt sampling,
rollout and reward scoring, evaluation, metrics, the loss mask, the update in
micro-batches with gradient accumulation, and checkpoints (written and read by
``minigrpo.run.checkpoints``). ``GRPOTrainer`` adds stages 3 and 4: the GRPO step.
``minigrpo.ppo.PPOTrainer`` adds its critic on the same base.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from minigrpo.advantages import group_relative_advantages, group_rewards
from minigrpo.config import GRPOConfig
from minigrpo.dynamic_sampling import collect_informative_rollout
from minigrpo.logprobs import masked_mean
from minigrpo.losses import grpo_loss
from minigrpo.models import (
    add_adapters,
    check_bf16_request,
    disable_dropout,
    is_peft_model,
    make_reference_model,
    precision_context,
    resolve_model_and_tokenizer,
    set_gradient_checkpointing,
)
from minigrpo.rewards import compute_rewards
from minigrpo.rollout import (
    Rollout,
    render_prompts,
    repeat_for_group,
    sample_group_rollout,
)
from minigrpo.run import checkpoints, distributed
from minigrpo.run.checkpoints import (  # noqa: F401 (re-exported)
    HISTORY_FILE,
    METRICS_FILE,
    STATE_FILE,
    CheckpointError,
    latest_checkpoint,
)
from minigrpo.run.evaluation import evaluate_model, greedy_completions  # noqa: F401 (greedy_completions re-exported)
from minigrpo.run.metrics import advantage_metrics, average_metrics, completion_metrics, reward_metrics
from minigrpo.run.resume import CheckpointMixin
from minigrpo.run.schedule import PromptSampler, micro_batches, resolve_max_steps


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


class NonFiniteError(FloatingPointError):
    """The loss or the gradient norm of a step is NaN or inf; the step was not applied."""


# --- the shared loop ----------------------------------------------------------------
class Trainer(CheckpointMixin):
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
    supports_dynamic_sampling = False
    """Whether config.dynamic_sampling (DAPO's refill) is implemented: GRPOTrainer's collect_rollout."""

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
        if config.dynamic_sampling:
            self._check_dynamic_sampling()
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

    def _check_dynamic_sampling(self) -> None:
        if not self.supports_dynamic_sampling:
            raise ValueError(
                f"dynamic_sampling=True: {type(self).__name__} does not implement DAPO's dynamic sampling (it filters "
                "GRPO's groups). Use GRPOTrainer, or set dynamic_sampling=False."
            )
        if distributed.is_distributed():
            # Each rank would keep a different number of groups after a different number of rounds: the ranks'
            # prompt order, DDP's gradient average and the step count would no longer match one process's.
            raise NotImplementedError(
                "dynamic_sampling=True does not run under torchrun: each process would refill its own groups. "
                "Run it in one process (python, not torchrun), or set dynamic_sampling=False."
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
        """Stages 1-2: B prompts -> N completions -> rewards (N,). Also the rollout metrics."""
        rollout, rewards_per_func, rewards, metrics = self.generate_and_score(self.config.prompts_per_step)
        metrics.update(self.rollout_metrics(rollout, rewards_per_func, rewards))
        return rollout, rewards.to(self.device), metrics

    def generate_and_score(self, num_prompts: int) -> tuple[Rollout, torch.Tensor, torch.Tensor, dict]:
        """The next `num_prompts` prompts -> rollout, rewards_per_func (N, F), rewards (N,), and the time taken.
        Under torchrun: this rank's share of the prompts, each group sampled from its own seed (see distributed)."""
        config = self.config
        indices, group_seeds = distributed.local_groups(self.sampler.next_indices(num_prompts), config.seed, self.step)
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
        timing = {"time/rollout": scored - started, "time/rewards": time.perf_counter() - scored}
        return rollout, rewards_per_func, rewards, timing

    def rollout_metrics(self, rollout: Rollout, rewards_per_func: torch.Tensor, rewards: torch.Tensor) -> dict:
        """What the completions scored and how long they were (TRL's names)."""
        metrics = reward_metrics(rewards_per_func, rewards, self.reward_funcs, self.config.num_generations)
        metrics.update(completion_metrics(rollout, self.config.num_generations))
        return metrics

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


# --- GRPO -------------------------------------------------------------------------
class GRPOTrainer(Trainer):
    """GRPO: group-relative advantages (stage 3) and the clipped, KL-regularised loss (stage 4).

    Usage::

        trainer = GRPOTrainer(model, [correctness_reward], GRPOConfig.tiny_cpu(), train_dataset,
                             processing_class=tokenizer)
        # or, as in TRL: GRPOTrainer(model="tiny", reward_funcs=..., args=..., train_dataset=...)
        history = trainer.train()

    Under ``torchrun --nproc-per-node K`` the same code trains data-parallel (minigrpo.run.distributed).
    """

    supports_distributed = True
    supports_dynamic_sampling = True

    def collect_rollout(self) -> tuple[Rollout, torch.Tensor, dict]:
        """Stages 1-2; with config.dynamic_sampling, DAPO's refill (dynamic_sampling.collect_informative_rollout)."""
        if self.config.dynamic_sampling:
            return collect_informative_rollout(self)
        return super().collect_rollout()

    def optimize(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        config = self.config
        if rewards.numel() == 0:  # dynamic sampling kept no group: no signal to follow, no optimizer step
            return {"loss": 0.0, "grad_norm": 0.0}
        grouped = group_rewards(rewards, config.num_generations)  # (B, G)
        advantages = group_relative_advantages(
            grouped, config.scale_rewards, config.baseline, config.std_ddof, config.advantage_epsilon
        ).flatten()  # (N,)
        loss_mask = self.loss_mask(rollout)  # (N, T)
        metrics = advantage_metrics(advantages, config.num_generations, config.std_ddof)  # abs_mean, std
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

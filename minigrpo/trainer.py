"""The trainer: the only stateful object. It orchestrates the stages and does no math itself.

    prompts -> rollout (stage 1) -> rewards (2) -> advantages (3) -> loss + update (4)

``Trainer.train`` is the loop on one screen, as nanoGPT's is: sample and score a rollout (``collect_rollout``),
update the policy (``update``), then log, evaluate and save. What GRPO and PPO share lives in ``Trainer``:
the loop, prompt sampling, rollout and reward scoring, evaluation, metrics, the loss mask, the learning rate of
each step (``run.schedule.lr_at``) and the two checks every update makes (``backward``: the loss is finite;
``clip_gradients``: the gradient norm is finite). ``GRPOTrainer.update`` is stage 3 and 4: the advantages,
then ``grpo_step``, one optimizer step written out from top to bottom. ``minigrpo.ppo.PPOTrainer`` has its own
``update`` on the same loop. Checkpoints and resume are ``run.resume``'s; TRL's Trainer surface (``state``,
callbacks, metric files, ``TrainOutput``) is ``run.trl_api``'s.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from minigrpo.advantages import completion_advantages, group_rewards
from minigrpo.config import GRPOConfig
from minigrpo.dynamic_sampling import fill_batch, kept_rows
from minigrpo.logprobs import completion_logps, masked_mean
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
from minigrpo.rewards import (
    RewardExtras,
    RewardFunc,
    accuracy_reward_note,
    as_trl_completions,
    compute_rewards,
    resolve_reward_funcs,
    reward_func_name,
)
from minigrpo.rollout import Rollout, check_prompt_length, render_prompts, repeat_for_group, sample_group_rollout
from minigrpo.run import checkpoints, distributed
from minigrpo.run.checkpoints import COMPLETIONS_FILE, METRICS_FILE
from minigrpo.run.completions_log import completion_rows, print_table
from minigrpo.run.datasets import as_dataset, check_columns, check_prompts
from minigrpo.run.evaluation import evaluate_model
from minigrpo.run.metrics import advantage_metrics, average_metrics, completion_metrics, reward_metrics
from minigrpo.run.progress import RunProgress, library_bars_off
from minigrpo.run.resume import CheckpointMixin, termination_as_interrupt
from minigrpo.run.schedule import PromptSampler, lr_at, micro_batches, optimizer_step_rows, resolve_max_steps
from minigrpo.run.trl_api import TrlTrainerMixin
from minigrpo.tool_calling import check_tool_support
from minigrpo.trl_compat import check_trl_keywords

if TYPE_CHECKING:  # imported where train() returns: transformers.trainer_utils pulls in peft (and bitsandbytes)
    from transformers.trainer_utils import TrainOutput


class NonFiniteError(FloatingPointError):
    """The loss or the gradient norm of a step is NaN or inf; the step was not applied."""


HUGE_ADVANTAGE = 1e6
"""An advantage beyond this is the likely cause of a non-finite loss or gradient, not the learning rate: scaled
advantages (scale_rewards "group" or "batch") stay within a few units, and unscaled ones are rewards minus a mean,
which no usual reward takes this far; the loss multiplies them into every token's gradient."""


def advantage_overflow(advantages: torch.Tensor | None, config: GRPOConfig) -> str | None:
    """What to say when a non-finite loss or gradient comes from the advantages (N,) rather than the learning rate:
    some are non-finite or beyond HUGE_ADVANTAGE in magnitude. None otherwise (or when they are not known)."""
    if advantages is None or advantages.numel() == 0:
        return None
    largest = advantages.detach().abs().max().item()
    if largest <= HUGE_ADVANTAGE:  # NaN compares False: a NaN advantage is blamed too
        return None
    unscaled = " (scale_rewards='none' leaves them as large as the rewards)" if config.scale_rewards == "none" else ""
    return (
        f"the advantages, which reach {largest:.3g} in magnitude{unscaled}: the loss multiplies them into the "
        "gradient, which overflows float32. Scale the rewards down (to about [-1, 1]) or set scale_rewards='group'"
    )


# --- the shared loop ----------------------------------------------------------------
class Trainer(CheckpointMixin, TrlTrainerMixin):
    """The loop every RL trainer here shares. Subclasses implement `update(rollout, rewards)`.

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
    supports_eval_loss = False
    """Whether config.num_generations_eval (eval_loss) is implemented: GRPOTrainer.evaluation_loss."""
    supports_tools = False
    """Whether tools= (tool-calling episodes, their tool mask in the loss) is implemented: GRPOTrainer's update."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: RewardFunc | str | Sequence[RewardFunc | str],
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools: Sequence[Callable] | None = None,
        rollout_func=None,
        environment_factory=None,
        *,
        ref_model: PreTrainedModel | None = None,
    ):
        self.config = args if args is not None else self.config_class()
        check_trl_keywords(optimizers, quantization_config, rollout_func, environment_factory)
        if train_dataset is None:
            raise ValueError(f"{type(self).__name__} needs a train_dataset with a 'prompt' column.")
        # before the model loads: a list or a DataFrame is refused, an IterableDataset read into a Dataset
        train_dataset = as_dataset(train_dataset, "train_dataset", self.config)
        eval_dataset = as_dataset(eval_dataset, "eval_dataset")
        distributed.init_from_environment(self.config.use_cpu)  # under torchrun: join the group (before the model)
        self.model, self.tokenizer = resolve_model_and_tokenizer(
            model, processing_class, self.config.model_init_kwargs, quantization_config, self.config.use_cpu
        )
        if peft_config is not None:
            self.model = add_adapters(self.model, peft_config, self.config.seed)
        if getattr(self.model, "is_loaded_in_4bit", False) and not is_peft_model(self.model):
            raise ValueError("a 4-bit model cannot be updated itself: pass a peft_config (QLoRA trains adapters).")
        self.model = distributed.local_device(self.model, self.config.use_cpu)
        self.device = next(self.model.parameters()).device
        self.reward_funcs = resolve_reward_funcs(reward_funcs, reward_processing_classes, self.device)
        self.tools = self._checked_tools(tools)  # [] without tools: every completion is one turn
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self._check_inputs()
        check_bf16_request(self.device, self.config.bf16)
        if self.config.disable_dropout:
            disable_dropout(self.model)
        if self.config.gradient_checkpointing:  # only switched on: a user's own setting is left alone otherwise
            set_gradient_checkpointing(self.model, True)
        if self.config.beta != 0.0:
            self.ref_model = ref_model if ref_model is not None else make_reference_model(self.model, self.config.bf16)
        else:
            self.ref_model = None  # beta == 0: no KL term, no reference model in memory
        # Under torchrun only: the update's forward pass in DDP (None with FSDP2, which shards self.model in place).
        self.ddp_policy = distributed.data_parallel_policy(self.model, self.config)
        self.optimizer = torch.optim.AdamW(
            self.optimizer_param_groups(),
            lr=self.config.learning_rate,
            betas=(self.config.adam_beta1, self.config.adam_beta2),
            weight_decay=self.config.weight_decay,
        )
        # Optimizer steps taken so far, however they were taken (a hook on optimizer.step counts them):
        # checkpoint_on_failure compares it before and after a block to know whether the weights have changed.
        self.optimizer_steps = 0
        self.optimizer.register_step_post_hook(self._count_optimizer_step)
        self.save_attempts = 0  # save_checkpoint calls: checkpoint_on_failure saves no block twice
        self.base_learning_rates = [group["lr"] for group in self.optimizer.param_groups]  # lr_at scales each
        self.sampler = PromptSampler(len(train_dataset), self.config.seed, self.config.shuffle_dataset)
        self.max_steps = resolve_max_steps(self.config, len(train_dataset), self.optimizer_steps_per_generation())
        self.step = 0  # optimizer steps taken (TRL's global_step)
        self.set_learning_rate(self.step)
        self.num_tokens = 0  # prompt + completion tokens generated for training (TRL's num_tokens)
        self._tokens_generated = 0  # this rank's, in the current generation
        self.history: list[dict] = []
        # The last generation's prompts, completions, per-function rewards, log_extra columns (and GRPO's
        # advantages), row for row with the rollout the update trained on: what log_completions prints and writes
        # (run.completions_log). completion_extras is its log_extra columns.
        self.step_samples: dict = {}
        self.completion_extras: dict[str, list] = {}
        self._sampled_rounds: list[dict] = []  # generate_and_score's samples, a dict per round of this generation
        self.output_dir = Path(self.config.output_dir)
        self._init_trl_api(callbacks)  # trainer.state and the callback list (run.trl_api)
        self.callback_handler.fire("on_init_end", self)

    @property
    def metrics_path(self) -> Path:
        """<logging_dir or output_dir>/metrics.jsonl: one JSON line per logged step."""
        return Path(self.config.logging_dir or self.config.output_dir) / METRICS_FILE

    @property
    def _sharded(self) -> bool:
        return distributed.is_sharded(self.model)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter the optimizer updates (the policy's; PPOTrainer's critic too)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def optimizer_param_groups(self) -> list[dict]:
        """AdamW's parameter groups, each a dict with its "params" and "lr". A subclass that trains more than
        the policy overrides this (PPOTrainer adds its critic, at its own learning rate)."""
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": self.config.learning_rate}]

    def _count_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_steps += 1

    def set_learning_rate(self, step: int) -> float:
        """Give every parameter group the rate of optimizer step `step`: its base rate under the schedule (lr_at).
        Returns the policy's rate. Called before each optimizer step: the rate is a function of the step alone."""
        for group, base_lr in zip(self.optimizer.param_groups, self.base_learning_rates, strict=True):
            group["lr"] = lr_at(step, self.config, self.max_steps, base_lr)
        return self.optimizer.param_groups[0]["lr"]

    # --- checks that fail at once ---------------------------------------------------
    def _check_inputs(self) -> None:
        config = self.config
        if distributed.is_distributed():
            if not self.supports_distributed:
                raise NotImplementedError(
                    f"{type(self).__name__} does not run under torchrun: only GRPOTrainer synchronises its update "
                    "over processes. Run it in one process (python, not torchrun)."
                )
            distributed.check_same_config(config)  # first: the checks below assume one config
            distributed.check_config(config)
        if config.dynamic_sampling:
            self._check_dynamic_sampling()
        if config.num_generations_eval is not None and not self.supports_eval_loss:
            raise ValueError(
                f"num_generations_eval={config.num_generations_eval}: eval_loss is the GRPO loss, which "
                f"{type(self).__name__} does not compute. Set num_generations_eval=None (greedy evaluation)."
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
            check_columns(dataset.column_names, name)
            if len(dataset) == 0:
                raise ValueError(f"{name} is empty: give it at least one prompt.")
            check_prompts(dataset["prompt"], name)
            lengths = [len(ids) for ids in self._prompt_token_ids(dataset["prompt"])]
            if 0 in lengths:  # a prompt that renders to nothing leaves the model no token to condition on
                raise ValueError(
                    f"{name} row {lengths.index(0)}: the prompt renders to no tokens: give it some text, or drop it."
                )
            longest = max(lengths)
            check_prompt_length(longest, config.max_prompt_length, f"the longest prompt in {name}")
            context = getattr(self.model.config, "max_position_embeddings", None)
            prompt_length = config.max_prompt_length or longest
            if context is not None and prompt_length + config.max_completion_length > context:
                raise ValueError(
                    f"{name}: prompts of up to {prompt_length} tokens (max_prompt_length={config.max_prompt_length}) "
                    f"+ max_completion_length={config.max_completion_length} exceeds the model's context of {context} "
                    "tokens: lower max_completion_length or shorten the prompts."
                )
        if not self.reward_funcs:
            raise ValueError(
                "reward_funcs is empty: give one or more functions f(prompts, completions, completion_ids, **kw) "
                "or reward models."
            )
        note = accuracy_reward_note(self.reward_funcs)
        if note and distributed.is_main_process():
            warnings.warn(note, stacklevel=3)

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

    def _checked_tools(self, tools: Sequence[Callable] | None) -> list[Callable]:
        """tools= as a list, refused where the trainer or the tokenizer cannot run episodes (what to change)."""
        if not tools:
            return []
        if not self.supports_tools:
            raise NotImplementedError(
                f"tools=: {type(self).__name__} trains single-turn completions; GRPOTrainer runs tool-calling "
                "episodes with their tool mask. Use GRPOTrainer, or drop tools."
            )
        if callable(tools):
            tools = [tools]
        check_tool_support(self.tokenizer, tools)
        return list(tools)

    def _prompt_token_ids(self, prompts) -> list[list[int]]:
        texts = render_prompts(self.tokenizer, list(prompts), self.tools)
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    # --- the loop -----------------------------------------------------------------
    def train(
        self,
        resume_from_checkpoint: bool | str | None = None,
        allow_config_change: bool = False,
        allow_dataset_change: bool = False,
    ) -> TrainOutput:
        """Run until max_steps optimizer steps (or until a callback sets control.should_training_stop).

        Each generation: sample and score a rollout (stages 1-2), update the policy on it (stages 3-4: one or
        more optimizer steps), then log every logging_steps, evaluate every eval_steps and save every save_steps.
        A generation that fails before its first optimizer step, or whose logging or evaluation fails (or is
        interrupted before its checkpoint is written), saves the state it began in, so a resumed run redoes it
        exactly (checkpoint_on_failure).

        Returns TRL's TrainOutput(global_step, training_loss, metrics) (run.trl_api.train_output); the per-step
        metrics are in trainer.state.log_history.
        resume_from_checkpoint: True = the newest checkpoint in output_dir that reads completely (a fresh, seeded
        run when there is none), a path = that checkpoint. allow_config_change: resume even though
        training-defining fields (learning_rate, G, beta, ...) differ from the checkpoint's run.
        allow_dataset_change: resume even though train_dataset is not the one the checkpoint was trained on (its
        fingerprint differs): the run continues on the new set, its prompt sampler starting afresh.
        Without resume, an output_dir holding an earlier run is refused unless config.overwrite_output_dir.
        output_dir (and a separate logging_dir) is locked while training: a second trainer on it gets an error.
        """
        config = self.config
        # SIGTERM / SIGHUP save and stop as Ctrl-C does; transformers' own bars (checkpoint writes) stay off our bar
        with self._locked_folders(), termination_as_interrupt(), library_bars_off():
            self._begin(resume_from_checkpoint, allow_config_change, allow_dataset_change)
            self.model.train()
            progress = self._progress_bar()
            first_step, loss_sum, started = self.step, 0.0, time.perf_counter()
            unlogged: list[dict] = []  # metrics of the generations since the last logged row
            control = self.callback_handler.fire("on_train_begin", self)
            control.should_training_stop = False
            while self.step < self.max_steps and not control.should_training_stop:
                before = self.step
                self.callback_handler.fire("on_step_begin", self)
                with self.checkpoint_on_failure(f"step {self.step + 1}"):
                    generation_started = time.perf_counter()
                    rollout, rewards, metrics = self.collect_rollout()  # stages 1-2: sample, score
                    update_started = time.perf_counter()
                    metrics.update(self.update(rollout, rewards))  # stages 3-4: advantages, loss, optimizer steps
                    metrics["time/update"] = time.perf_counter() - update_started
                    metrics["step_time"] = time.perf_counter() - generation_started
                    metrics = distributed.reduce_metrics(metrics)  # this rank's -> the step's (means over ranks)
                self.step += self.optimizer_steps_per_generation()
                loss_sum += metrics.get("loss", 0.0) * (self.step - before)
                unlogged.append(metrics)
                evaluate = self._evaluation_due(before)
                with self.checkpoint_on_failure(f"logging, evaluating or saving step {self.step}", unlogged):
                    if evaluate or self._due(before, config.logging_steps):
                        self._log(average_metrics(unlogged) | (self.evaluate() if evaluate else {}))
                        unlogged.clear()
                    if config.save_strategy == "steps" and self._due(before, config.save_steps):
                        self.save_checkpoint()  # Ctrl-C / SIGTERM wait until it is written
                progress.advance(self.step - before, metrics, self.history)  # reward, rewards/<fn>, eval_accuracy
                control = self.callback_handler.fire("on_step_end", self)
                if control.should_save or (control.should_training_stop and self.step < self.max_steps):
                    self.save_checkpoint()  # a stopped run keeps a checkpoint to resume from
                    control.should_save = False
            progress.close()
            self.callback_handler.fire("on_train_end", self)
            return self.train_output(self.step - first_step, loss_sum, time.perf_counter() - started)

    def _progress_bar(self) -> RunProgress:
        return RunProgress(
            self.max_steps,
            initial=self.step,
            desc=type(self).__name__.removesuffix("Trainer"),
            disable=not distributed.is_main_process(),
        )

    def optimizer_steps_per_generation(self) -> int:
        """Optimizer steps each generation makes (the step counter advances by this). GRPO: num_iterations x
        steps_per_generation / gradient_accumulation_steps; an algorithm that steps differently overrides it."""
        return self.config.optimizer_steps_per_generation

    def _due(self, before: int, every: float) -> bool:
        """Did the last generation's optimizer steps (before, self.step] reach a multiple of `every`, or the end?
        (0 = only at the end; below 1, a fraction of max_steps, as in TRL: 0.25 of 200 steps is every 50.)"""
        every = math.ceil(every * self.max_steps) if 0 < every < 1 else int(every)
        return self.step >= self.max_steps or (every > 0 and self.step // every > before // every)

    def _evaluation_due(self, before: int) -> bool:
        """Evaluate after this generation? (eval_steps, or logging_steps when it is None, as in TRL)"""
        config = self.config
        every = config.eval_steps if config.eval_steps is not None else config.logging_steps
        return config.eval_strategy == "steps" and self.eval_dataset is not None and self._due(before, every)

    # --- stages 1-2: sample and score -------------------------------------------------
    def collect_rollout(self) -> tuple[Rollout, torch.Tensor, dict]:
        """Stages 1-2: B prompts -> N completions -> rewards (N,), with the rollout metrics; with
        config.dynamic_sampling, DAPO's refill (collect_informative_rollout). Under torchrun a rank that fails
        here stops every rank."""
        self._tokens_generated = 0
        self._sampled_rounds = []
        with distributed.fail_together("the rollout"):
            if self.config.dynamic_sampling:
                rollout, rewards, metrics = self.collect_informative_rollout()
            else:
                rollout, rewards_per_func, rewards, metrics = self.generate_and_score(self.config.prompts_per_step)
                metrics.update(self.rollout_metrics(rollout, rewards_per_func, rewards))
                self._keep_samples()
        # after fail_together, never inside it: every rank must reach this collective, or none
        self.num_tokens += distributed.global_sum(torch.tensor(self._tokens_generated))
        return rollout, rewards.to(self.device), metrics

    def generate_and_score(
        self, num_prompts: int, first_group: int = 0
    ) -> tuple[Rollout, torch.Tensor, torch.Tensor, dict]:
        """The next `num_prompts` prompts -> rollout, rewards_per_func (N, F), rewards (N,), and the time taken
        (with the metrics the reward functions logged with log_metric).

        Each group is sampled from its own seed, a hash of (seed, step, the group's index in the step: first_group
        + b), so one process and K processes under torchrun sample the same completions (run.distributed.
        local_groups). Under torchrun this rank keeps its share of the prompts."""
        config = self.config
        prompts = self.sampler.next_indices(num_prompts)
        indices, group_seeds = distributed.local_groups(prompts, config.seed, self.step, first_group)
        batch = self.train_dataset[indices]
        started = time.perf_counter()
        rollout = sample_group_rollout(
            self.model, self.tokenizer, batch["prompt"], config, self.ref_model, group_seeds, tools=self.tools
        )
        scored = time.perf_counter()
        extras = RewardExtras(trainer_state=self.state)
        rewards_per_func, rewards = self.score(batch, rollout, config.num_generations, extras)
        prompts = repeat_for_group(batch["prompt"], config.num_generations)
        self._sampled_rounds.append(
            {
                "prompt": prompts,
                "completion": rollout.completions,
                "rewards": rewards_per_func,
                "reward": rewards,
                "extra": extras.extra_columns,
            }
        )
        # TRL's num_tokens (prompt + completion tokens the model generated, tools' not counted): this rank's, summed
        # over the ranks in collect_rollout
        self._tokens_generated += int(rollout.prompt_mask.sum() + rollout.trained_mask.sum())
        metrics = {"time/rollout": scored - started, "time/rewards": time.perf_counter() - scored}
        metrics.update(extras.metric_means())  # what the reward functions logged with log_metric
        return rollout, rewards_per_func, rewards, metrics

    def score(
        self, batch: dict, rollout: Rollout, num_generations: int, extras: RewardExtras | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage 2: the rollout of `batch`'s prompts, each G times (group-major), scored by every reward function
        with the dataset's other columns -> rewards_per_func (N, F), rewards (N,), the weighted sum."""
        prompts = repeat_for_group(batch["prompt"], num_generations)
        columns = {k: repeat_for_group(v, num_generations) for k, v in batch.items() if k != "prompt"}
        # with tools, each completion is its episode's messages; else chat prompts get [{"role": "assistant", ...}]
        completions = rollout.conversations or as_trl_completions(prompts, rollout.completions)
        return compute_rewards(
            self.reward_funcs,
            prompts,
            completions,
            rollout.completion_id_lists(),
            columns,
            self.config.reward_weights,
            self.config.reward_timeout,
            extras,
        )

    def _keep_samples(self, rows: torch.Tensor | None = None) -> None:
        """step_samples from this generation's rounds of generate_and_score, row for row with the rollout the update
        trains on: the rows `rows` (n,) of the rounds joined (dynamic sampling's kept completions), or all of them.
        A log_extra column is kept when every round logged one value per completion."""
        rounds = self._sampled_rounds
        kept = rows.tolist() if rows is not None else range(sum(len(r["completion"]) for r in rounds))

        def joined(per_round: list[list]) -> list:  # the rounds' values in one list, the kept rows only
            values = [value for values in per_round for value in values]
            return [values[i] for i in kept]

        extra_names = [
            name
            for name in rounds[0]["extra"]
            if all(len(r["extra"].get(name, ())) == len(r["completion"]) for r in rounds)
        ]
        self.completion_extras = {name: joined([r["extra"][name] for r in rounds]) for name in extra_names}
        rewards_per_func = torch.cat([r["rewards"] for r in rounds])[list(kept)]  # (n, F)
        rewards = torch.cat([r["reward"] for r in rounds])[list(kept)]  # (n,)
        self.step_samples = {
            "prompt": joined([r["prompt"] for r in rounds]),
            "completion": joined([r["completion"] for r in rounds]),
            "rewards": {reward_func_name(f): rewards_per_func[:, i].tolist() for i, f in enumerate(self.reward_funcs)},
            "extra": self.completion_extras,
            "advantage": self.logged_advantages(rewards),
        }

    def logged_advantages(self, rewards: torch.Tensor) -> list[float] | None:
        """The advantages that log_completions shows beside the completions of these rewards (N,): GRPOTrainer's.
        None: an algorithm whose advantages are not one per completion (PPO's are per token)."""
        return None

    def rollout_metrics(self, rollout: Rollout, rewards_per_func: torch.Tensor, rewards: torch.Tensor) -> dict:
        """What the completions scored and how long they were (TRL's names)."""
        metrics = reward_metrics(rewards_per_func, rewards, self.reward_funcs, self.config.num_generations)
        metrics.update(completion_metrics(rollout, self.config.num_generations))
        return metrics

    def evaluate(self, eval_dataset=None) -> dict:
        """Greedy accuracy on the held-out set (eval_dataset, or the trainer's): TRL's eval_reward and
        eval_rewards/<name>/mean, with minigrpo's greedy accuracy as eval_accuracy (see evaluate_model); when
        config.eval_generations is set (num_generations_eval, or a given eval_strategy: a TRL script), TRL's eval_loss
        too (GRPOTrainer.evaluation_loss)."""
        dataset = as_dataset(eval_dataset, "eval_dataset") if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError(
                "evaluate() needs held-out prompts: pass eval_dataset= to the trainer or to evaluate(eval_dataset)."
            )
        metrics = evaluate_model(self.model, self.tokenizer, dataset, self.reward_funcs, self.config, self.tools)
        if self.supports_eval_loss and self.config.eval_generations is not None:
            metrics["eval_loss"] = self.evaluation_loss(dataset)
        self.callback_handler.fire("on_evaluate", self, metrics=metrics)
        return metrics

    def _log(self, metrics: dict) -> None:
        metrics = {"step": self.step, "epoch": self.state.epoch, "num_tokens": self.num_tokens, **metrics}
        self.history.append(metrics)
        self.callback_handler.fire("on_log", self, logs=metrics)
        if self.config.log_completions:
            self._log_completions()
        if not distributed.is_main_process():
            return
        checkpoints.append_jsonl(self.metrics_path, [metrics])  # valid JSON: a NaN metric is written as null

    def _log_completions(self) -> None:
        """log_completions: the last generation's completions (every process's, under torchrun), printed as a table
        (the first num_completions_to_print) and appended to <output_dir>/completions.jsonl (run.completions_log)."""
        rows = distributed.gather_lists(completion_rows(self.step, self.step_samples) if self.step_samples else [])
        if distributed.is_main_process() and rows:
            print_table(rows, self.step, self.config.num_completions_to_print)
            checkpoints.append_jsonl(self.output_dir / COMPLETIONS_FILE, rows)

    # --- the update: what every algorithm's step shares ----------------------------------
    def loss_mask(self, rollout: Rollout) -> torch.Tensor:
        """(N, T) the tokens the loss counts: those the policy wrote (rollout.trained_mask: with tools, not the tools'
        results), minus every token of a truncated completion when config.mask_truncated_completions (DAPO: a
        cut-off answer is not a wrong answer)."""
        mask = rollout.trained_mask
        if self.config.mask_truncated_completions:
            mask = mask * (~rollout.is_truncated).unsqueeze(1)  # (N, T)
        return mask

    def policy_logps(self, rollout: Rollout, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi_theta and entropy (n, T), (n, T) of the rollout's rows `rows`, with gradients: the update's
        forward pass. Under torchrun it runs inside DDP, which then averages the gradients over the processes."""
        if self.ddp_policy is not None:
            return self.ddp_policy(rollout, rows)
        return completion_logps(self.model, rollout, self.config, rows)

    def gradient_sync(self, enabled: bool):
        """Under torchrun, a context in which backward averages the gradients over the processes only if `enabled`
        (the last micro-batch of a step; the others accumulate locally). In one process: nothing to do."""
        return distributed.gradient_sync(self.model if self.ddp_policy is None else self.ddp_policy, enabled)

    def backward(self, loss: torch.Tensor, which: str, advantages: torch.Tensor | None = None) -> None:
        """loss.backward(), once the loss is known to be finite: a NaN or inf loss would turn every weight into NaN,
        so it stops the run before backward, with what to change. which: the completions it is the loss of;
        advantages: theirs, (n,), so that huge ones are named as the cause (advantage_overflow)."""
        if not torch.isfinite(loss).all():
            config = self.config
            cause = advantage_overflow(advantages, config) or (
                f"log-probs that overflowed (learning_rate={config.learning_rate:g} too high for this model, so the "
                f"last updates diverged) or, with beta={config.beta:g}, a policy far from the reference (the KL's "
                "exp overflows). Lower learning_rate (or beta)"
            )
            raise NonFiniteError(
                f"step {self.step + 1}: the loss of {which} is {loss.item()}, so the update was not applied. Likely "
                f"cause: {cause}, and resume from the last checkpoint (allow_config_change=True)."
            )
        loss.backward()

    def clip_gradients(
        self, params: list[torch.nn.Parameter], max_norm: float, advantages: torch.Tensor | None = None
    ) -> float:
        """Clip the gradient norm of `params` to max_norm (0 = no clipping) and return the norm before clipping.
        An inf or NaN norm stops the run: clipping cannot rescue it, and the step would put it in the weights.
        advantages: the step's, (n,), so that huge ones are named as the cause (advantage_overflow)."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor
        if not math.isfinite(norm):
            cause = advantage_overflow(advantages, self.config) or (
                f"an overflow in the backward pass (learning_rate={self.config.learning_rate:g} too high for this "
                "model, or reduced precision); lower learning_rate"
            )
            raise NonFiniteError(
                f"step {self.step + 1}: the gradient norm is {norm} although the loss was finite, so the update "
                f"was not applied. Likely cause: {cause}, and resume from the last checkpoint "
                "(allow_config_change=True)."
            )
        return norm

    # --- DAPO's dynamic sampling (GRPOTrainer: supports_dynamic_sampling) ------------------------
    def collect_informative_rollout(self) -> tuple[Rollout, torch.Tensor, dict]:
        """DAPO's refill: rounds of B prompts until B groups whose rewards are not all equal are kept
        (dynamic_sampling.fill_batch), at most max_num_gen_batches rounds; fewer groups when they run out.
        Returns the kept rollout, its rewards (N_kept,) and the metrics.

        The usual metrics (reward, frac_reward_zero_std, completions/...) are over every generated group, so they
        describe the policy as a run without dynamic sampling would; time/rollout and time/rewards add up the
        rounds; dynamic_sampling/* say what the refill cost and what was trained on.
        """
        config = self.config
        B, G = config.prompts_per_step, config.num_generations
        rounds = []  # (rollout, rewards_per_func, rewards, timing) of each round

        def generate_round() -> torch.Tensor:
            rounds.append(self.generate_and_score(B, first_group=len(rounds) * B))  # round r: groups rB .. rB+B-1
            return group_rewards(rounds[-1][2], G)  # (B, G)

        kept, num_rounds = fill_batch(generate_round, B, config.max_num_gen_batches)
        generated = Rollout.concat([r[0] for r in rounds], self.tokenizer.pad_token_id or 0)  # rounds * N rows
        rewards_per_func = torch.cat([r[1] for r in rounds])  # (rounds * N, F)
        rewards = torch.cat([r[2] for r in rounds])  # (rounds * N,)
        rows = kept_rows(kept, B, G)  # (N_kept,) indices into the rounds' rows: one selection for everything
        metrics = self.rollout_metrics(generated, rewards_per_func, rewards)
        metrics.update(average_metrics([r[3] for r in rounds]))  # what reward functions logged: over the rounds
        for key in ("time/rollout", "time/rewards"):
            metrics[key] = sum(r[3][key] for r in rounds)
        metrics.update(
            {
                "dynamic_sampling/rounds": num_rounds,
                "dynamic_sampling/groups_generated": num_rounds * B,
                "dynamic_sampling/groups_kept": len(kept),
                "dynamic_sampling/kept_fraction": len(kept) / (num_rounds * B),
            }
        )
        if kept:
            metrics["dynamic_sampling/kept_reward"] = rewards[rows].mean().item()
        self._keep_samples(rows)
        return generated.select(rows), rewards[rows], metrics

    # --- stages 3-4: the algorithm's own update ----------------------------------------
    def update(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        """Stages 3-4 on one generation's rollout and rewards (N,): the optimizer steps; returns their metrics."""
        raise NotImplementedError


# --- GRPO -------------------------------------------------------------------------
class GRPOTrainer(Trainer):
    """GRPO: group-relative advantages (stage 3) and the clipped, KL-regularised loss (stage 4).

    Usage::

        trainer = GRPOTrainer(model, [correctness_reward], GRPOConfig.tiny_cpu(), train_dataset,
                             processing_class=tokenizer)
        # or, as in TRL: GRPOTrainer(model="tiny", reward_funcs=..., args=..., train_dataset=...)
        trainer.train()
        history = trainer.state.log_history  # one dict per logged step

    Under ``torchrun --nproc-per-node K`` the same code trains data-parallel (minigrpo.run.distributed).
    """

    supports_distributed = True
    supports_dynamic_sampling = True
    supports_eval_loss = True
    supports_tools = True

    def update(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        """Stage 3, the advantages of the rewards (N,), then stage 4: one grpo_step per optimizer step, each on a
        slice of whole groups, num_iterations passes over the rollout (TRL's batch fields: optimizer_step_rows)."""
        config = self.config
        if rewards.numel() == 0:  # dynamic sampling kept no group: no signal to follow, no optimizer step
            return {"loss": 0.0, "grad_norm": 0.0}
        advantages = completion_advantages(rewards, config)  # (N,): each reward against its group's
        loss_mask = self.loss_mask(rollout)  # (N, T)
        steps = []
        for i, rows in enumerate(optimizer_step_rows(len(advantages), config)):  # each pass, each step's groups
            steps.append(self.grpo_step(rollout, advantages, loss_mask, rows, lr_step=self.step + i))
        return advantage_metrics(advantages, config.num_generations, config.std_ddof) | average_metrics(steps)

    def logged_advantages(self, rewards: torch.Tensor) -> list[float]:
        """The advantages update computes from these rewards (N,), for log_completions."""
        return completion_advantages(rewards, self.config).tolist()

    @torch.no_grad()
    def evaluation_loss(self, dataset) -> float:
        """TRL's eval_loss: the GRPO loss, without gradients, on G' = config.eval_generations completions
        sampled for every held-out prompt, scored and normalised within their group as in training.

        The policy that samples is the one scored, so the ratio is exactly 1 and the clipped surrogate is the
        advantage itself: eval_loss = -(the advantages' weighted mean) + beta * KL. Under loss_type 'grpo' each
        completion counts once and the advantages sum to 0 in every group, so eval_loss is beta times the mean KL
        (0 when beta = 0): it says how far the policy has moved from the reference, not how well it answers
        (eval_accuracy does). The token-weighted types ('bnpo', 'dr_grpo', 'dapo') count a long completion's
        advantage more, so theirs is not 0.

        One loss over every sample (TRL averages its evaluation batches' losses: the same for 'grpo' and 'dr_grpo',
        within rounding for the others). Every process samples every prompt from the same seeds, so under torchrun
        all ranks return the same number."""
        config, G = self.config, self.config.eval_generations
        prompts_per_call = max(1, config.eval_batch_size // G)  # eval_batch_size rows per generate call
        rollouts, advantages = [], []
        for start in range(0, len(dataset), prompts_per_call):
            chunk = range(start, min(start + prompts_per_call, len(dataset)))
            batch = dataset[chunk.start : chunk.stop]
            # seeds of their own ("eval/<i>", not a training group's index): the same samples on every rank
            seeds = distributed.group_seeds(config.seed, self.step, (f"eval/{i}" for i in chunk))
            # pi_old's log-probs, kept: at evaluation they are the policy's, scored in groups of G'
            rollout = sample_group_rollout(
                self.model, self.tokenizer, batch["prompt"], config, self.ref_model, seeds, G,
                with_old_logps=True, tools=self.tools,
            )  # fmt: skip
            _, rewards = self.score(batch, rollout, G)
            rollouts.append(rollout)
            advantages.append(completion_advantages(rewards.to(self.device), config, G))  # as update, in groups of G'
        # chunks stop at their own longest completion: right-padded to one T, the padding masked out
        rollout = Rollout.concat(rollouts, self.tokenizer.pad_token_id or 0)  # N' = B' * G' rows
        mask = self.loss_mask(rollout)  # (N', T)
        logps, ref_logps = rollout.old_per_token_logps, rollout.ref_per_token_logps
        loss, _ = grpo_loss(logps, None, ref_logps, torch.cat(advantages), mask, config, mask.sum())
        return loss.item()

    def grpo_step(
        self,
        rollout: Rollout,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        step_rows: slice = slice(None),
        lr_step: int | None = None,
    ) -> dict:
        """One optimizer step on the rollout's rows `step_rows` (default: all N); advantages (N,), loss_mask (N, T).

        Per micro-batch of per_device_train_batch_size rows: log pi_theta, grpo_loss against pi_old (None with one
        step per generation: ratio exactly 1; else stored, ratio ~1 on the first step only) and pi_ref, backward;
        then clip the gradient norm and step at the rate of step `lr_step` (default: the trainer's); returns metrics."""
        config = self.config
        step = range(len(advantages))[step_rows]  # this step's rows, e.g. range(0, 16)
        micro = micro_batches(len(step), config.per_device_train_batch_size, step.start)
        # "dapo" divides by the step's tokens (all processes'): micro-batch losses add up; the others' count 1/M each
        num_items_in_batch = distributed.step_token_count(loss_mask[step_rows])
        loss_scale = 1.0 if config.loss_type == "dapo" else 1.0 / len(micro)
        stored = rollout.old_per_token_logps, rollout.ref_per_token_logps, rollout.sampling_per_token_logps  # (N, T)
        self.optimizer.zero_grad(set_to_none=True)
        step_loss, micro_metrics = 0.0, []
        for i, rows in enumerate(micro):
            with self.gradient_sync(enabled=i == len(micro) - 1):  # torchrun: average gradients after the last
                with precision_context(self.device, config.bf16):
                    per_token_logps, entropy = self.policy_logps(rollout, rows)  # (n, T), (n, T)
                old, ref, sampling = (None if logps is None else logps[rows] for logps in stored)  # (n, T) or None
                loss, metrics = grpo_loss(
                    per_token_logps, old, ref, advantages[rows], loss_mask[rows], config, num_items_in_batch, sampling
                )
                self.backward(loss * loss_scale, f"completions {rows.start}-{rows.stop - 1}", advantages[rows])
            step_loss += loss.item() * loss_scale
            micro_metrics.append(metrics | {"entropy": masked_mean(entropy.detach(), loss_mask[rows]).item()})
        grad_norm = self.clip_gradients(self.trainable_parameters(), config.max_grad_norm, advantages[step_rows])
        metrics = average_metrics(micro_metrics) | {"loss": step_loss, "grad_norm": grad_norm}
        metrics["learning_rate"] = self.set_learning_rate(self.step if lr_step is None else lr_step)
        self.optimizer.step()
        return metrics

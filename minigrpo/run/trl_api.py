"""TRL's (transformers') Trainer surface, beside the algorithm: what a TRL script reads and calls on a trainer.

``TrainerState`` is ``trainer.state`` (what callbacks and curriculum rewards read); ``TrlTrainerMixin`` gives
the trainer transformers' helpers: ``args`` and ``processing_class``, the callback list (``add_callback``,
``pop_callback``, ``remove_callback``), ``log_metrics``, ``save_metrics``, ``save_state``, and the
``TrainOutput`` that ``train()`` returns. None of it is GRPO: ``minigrpo/trainer.py`` keeps the loop and the
update, and only fires the callbacks' events.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from minigrpo.run import checkpoints, distributed
from minigrpo.run.callbacks import CallbackHandler
from minigrpo.run.trackers import reporting_callbacks, resolve_trackers

if TYPE_CHECKING:  # imported where train() returns: transformers.trainer_utils pulls in peft (and bitsandbytes)
    from transformers.trainer_utils import TrainOutput


class TrainerState:
    """TRL's ``trainer.state`` (transformers' TrainerState), read-only: what callbacks and curriculum rewards
    read. global_step, max_steps, epoch (fractional passes over the prompts), log_history (one dict per logged
    step), num_input_tokens_seen (prompt + completion tokens generated so far), and the process flags."""

    def __init__(self, trainer):
        self._trainer = trainer
        self.best_metric = None  # transformers' fields that minigrpo does not track (the trackers' callbacks read
        self.best_model_checkpoint = None  # some of them)
        self.is_hyper_param_search = False
        self.trial_name = None
        self.total_flos = 0.0

    @property
    def global_step(self) -> int:
        return self._trainer.step

    @property
    def max_steps(self) -> int:
        return self._trainer.max_steps

    @property
    def epoch(self) -> float:
        sampler = self._trainer.sampler
        return round(sampler.epoch + sampler.position / sampler.dataset_size, 4)

    @property
    def log_history(self) -> list[dict]:
        return self._trainer.history

    @property
    def num_input_tokens_seen(self) -> int:
        return self._trainer.num_tokens

    @property
    def num_train_epochs(self) -> float:
        return self._trainer.config.num_train_epochs

    @property
    def logging_steps(self) -> int:
        return self._trainer.config.logging_steps

    @property
    def eval_steps(self) -> float | None:
        return self._trainer.config.eval_steps

    @property
    def save_steps(self) -> float:
        return self._trainer.config.save_steps

    @property
    def is_world_process_zero(self) -> bool:
        return distributed.is_main_process()

    @property
    def is_local_process_zero(self) -> bool:
        return distributed.is_main_process()

    def to_dict(self) -> dict:
        """What save_state writes (trainer_state.json), with transformers' key names."""
        names = ("global_step", "max_steps", "epoch", "num_input_tokens_seen", "num_train_epochs", "logging_steps")
        return {name: getattr(self, name) for name in names} | {"log_history": self.log_history}


class TrlTrainerMixin:
    """transformers' Trainer helpers for ``Trainer`` (which provides config, tokenizer, output_dir, step,
    optimizer_steps_per_generation and the state TrainerState reads)."""

    def _init_trl_api(self, callbacks) -> None:
        """trainer.state and the callback list (transformers' TrainerCallback protocol, run.callbacks): the
        trackers' callbacks of config.report_to first (run.trackers; on the main process only, as the rows it logs
        are the run's), then the user's, as in transformers."""
        self.state = TrainerState(self)
        config = self.config
        if distributed.is_main_process():
            trackers = reporting_callbacks(config.report_to, config.logging_dir)
        else:
            trackers = []
            resolve_trackers(config.report_to)  # a missing tracker fails on every process alike
        self.callback_handler = CallbackHandler([*trackers, *(callbacks or [])])

    @property
    def args(self):
        """The config, under TRL's name (``trainer.args``)."""
        return self.config

    @property
    def accelerator(self):
        """An ``accelerate.Accelerator`` for what a TRL script calls on it (``trainer.accelerator.print``,
        ``is_main_process``, ``wait_for_everyone``, ``device``), made on first use: importing minigrpo does not import
        accelerate, which stays optional. minigrpo's own loop does not go through it (plain PyTorch, torchrun)."""
        if getattr(self, "_accelerator", None) is None:
            try:
                from accelerate import Accelerator
            except ImportError:
                raise ImportError(
                    "trainer.accelerator needs accelerate: pip install accelerate (minigrpo's loop itself does not)."
                ) from None
            self._accelerator = Accelerator(cpu=self.config.use_cpu)
        return self._accelerator

    @property
    def processing_class(self):
        """The tokenizer, under TRL's name (``trainer.processing_class``)."""
        return self.tokenizer

    def add_callback(self, callback) -> None:
        """Add a transformers TrainerCallback (instance or class), as Trainer.add_callback."""
        self.callback_handler.add(callback)

    def pop_callback(self, callback):
        """Remove and return a callback (an instance, or the first of a class); None when absent."""
        return self.callback_handler.pop(callback)

    def remove_callback(self, callback) -> None:
        self.callback_handler.pop(callback)

    def log_metrics(self, split: str, metrics: dict) -> None:
        """Print `metrics` as a table, as transformers' Trainer.log_metrics (rank 0 only)."""
        if not distributed.is_main_process():
            return
        print(f"***** {split} metrics *****")
        width = max((len(key) for key in metrics), default=0)
        for key in sorted(metrics):
            print(f"  {key:<{width}} = {metrics[key]}")

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """Write <output_dir>/<split>_results.json (and merge it into all_results.json), as transformers does."""
        if not distributed.is_main_process():
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        # checkpoints.dumps, as metrics.jsonl: a NaN metric is written as null, so the file stays valid JSON
        (self.output_dir / f"{split}_results.json").write_text(
            checkpoints.dumps(metrics, indent=4, sort_keys=True) + "\n"
        )
        if combined:
            path = self.output_dir / "all_results.json"
            combined_metrics = json.loads(path.read_text()) if path.exists() else {}
            path.write_text(checkpoints.dumps({**combined_metrics, **metrics}, indent=4, sort_keys=True) + "\n")

    def save_state(self) -> None:
        """Write <output_dir>/trainer_state.json: step, epoch and log history, as transformers' save_state."""
        if not distributed.is_main_process():
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "trainer_state.json").write_text(checkpoints.dumps(self.state.to_dict()) + "\n")

    def train_output(self, steps: int, loss_sum: float, runtime: float) -> TrainOutput:
        """TRL's (transformers') return value of train() for the `steps` optimizer steps of this call: training_loss
        is their mean loss; metrics hold train_runtime, train_samples_per_second (completions),
        train_steps_per_second, train_loss and epoch."""
        from transformers.trainer_utils import TrainOutput  # here, not at import: it takes peft along (seconds)

        generations = steps / self.optimizer_steps_per_generation()
        metrics = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(generations * self.config.num_completions / max(runtime, 1e-9), 3),
            "train_steps_per_second": round(steps / max(runtime, 1e-9), 3),
            "train_loss": loss_sum / steps if steps else 0.0,
            "epoch": self.state.epoch,
        }
        return TrainOutput(self.step, metrics["train_loss"], metrics)

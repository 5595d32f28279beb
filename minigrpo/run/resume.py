"""The trainer's checkpoints: start fresh or resume, save, restore, write the final model.

``CheckpointMixin`` holds the Trainer methods that talk to ``minigrpo.run.checkpoints``
(which does the file work: atomic writes, safe reads, fallback, locking), so that
``trainer.py`` reads as the loop and the GRPO step. A checkpoint is written only
between generations, so a resumed run continues exactly.
"""

from __future__ import annotations

import contextlib
import copy
import random
import signal
import threading
import warnings
from pathlib import Path

import torch

from minigrpo.models import is_peft_model
from minigrpo.rewards import reward_func_name
from minigrpo.run import checkpoints, distributed
from minigrpo.run.checkpoints import COMPLETIONS_FILE, CheckpointError
from minigrpo.run.completions_log import keep_steps_up_to
from minigrpo.run.datasets import dataset_record
from minigrpo.run.distributed import tie_weights
from minigrpo.run.metrics import average_metrics
from minigrpo.run.schedule import schedule_change_note


@contextlib.contextmanager
def _signal_handlers(names: tuple[str, ...], handler):
    """Handle the signals `names` (those this platform has: Windows has no SIGHUP) with `handler` while the block
    runs, then give the previous handlers back. Off the main thread (Python lets only it set handlers) and under
    torchrun the signals keep their own behaviour."""
    if threading.current_thread() is not threading.main_thread() or distributed.is_distributed():
        yield
        return
    previous = {name: signal.signal(getattr(signal, name), handler) for name in names if hasattr(signal, name)}
    try:
        yield
    finally:
        for name, old in previous.items():
            signal.signal(getattr(signal, name), old)


@contextlib.contextmanager
def termination_as_interrupt():
    """While training, SIGTERM and SIGHUP raise KeyboardInterrupt, so they save and stop as Ctrl-C does: `kill`,
    `docker stop`, SLURM's pre-emption and a notebook runtime shutting down send SIGTERM; a closed terminal SIGHUP.
    Python lets only the main thread set handlers: elsewhere the signals keep their own behaviour. Under torchrun too:
    torchrun ends the other ranks with SIGTERM when one fails, and a rank blocked in a collective (waiting for the
    failed one) could not run a Python handler, so it would hang instead of ending."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received: stopping as Ctrl-C does")

    with _signal_handlers(("SIGTERM", "SIGHUP"), interrupt):
        yield


DEFERRED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT, SIGTERM and SIGHUP back while the block runs (a checkpoint being written), then deliver them.

    A signal that stopped a save half-way would leave no checkpoint of the step just logged (and, before the
    temporary folder was cleaned up, a .checkpoint-N.tmp filling the disk). So each signal that arrives is only
    noted; when the block ends the previous handlers are back and each noted signal is raised again
    (signal.raise_signal): termination_as_interrupt's KeyboardInterrupt, Python's Ctrl-C, or the default action,
    once the checkpoint is complete. A second Ctrl-C during the save does not cut it short (kill -9 still does:
    the temporary folder is then never renamed, and a resume skips it). Only the main thread can set handlers,
    and under torchrun the signals keep their own behaviour (as in termination_as_interrupt)."""
    received: list[int] = []
    try:
        with _signal_handlers(DEFERRED_SIGNALS, lambda signum, frame: received.append(signum)):
            yield
    finally:  # the previous handlers are back: each noted signal once, in the order they came
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


class CheckpointMixin:
    """Checkpoint, resume and save_model for ``Trainer`` (which provides config, model, optimizer, sampler, step,
    history, output_dir, metrics_path, callback_handler and optimizer_param_groups)."""

    def _begin(
        self, resume_from_checkpoint: bool | str | None, allow_config_change: bool, allow_dataset_change: bool = False
    ) -> None:
        """Resume (from a path, or the newest checkpoint in output_dir that reads completely), or start fresh."""
        if not resume_from_checkpoint:
            self._start_fresh(replace=self.config.overwrite_output_dir)
            return
        modules = self.trainable_modules()
        if resume_from_checkpoint is not True:  # a checkpoint named by the user: no fallback to another one
            path = Path(resume_from_checkpoint)
            state = checkpoints.read_checkpoint(path, modules, self.optimizer)
            self._restore(path, state, allow_config_change, allow_dataset_change)
            return
        found = checkpoints.find_resumable(self.output_dir, modules, self.optimizer)
        if found is None:
            print(f"no checkpoint in {self.output_dir} to resume: starting a fresh run (seed {self.config.seed})")
            self._start_fresh(replace=True)  # metrics without a checkpoint cannot be continued
            return
        path, state, problems = found
        for problem in problems:
            warnings.warn(f"{self.output_dir}: {problem}", stacklevel=3)
        self._restore(path, state, allow_config_change, allow_dataset_change)

    def _start_fresh(self, replace: bool) -> None:
        """Seed, once output_dir holds no earlier run (replaced when `replace`, refused otherwise)."""
        self._claim_folders(replace)
        random.seed(self.config.seed)
        torch.manual_seed(self.config.seed)

    def _claim_folders(self, replace: bool, resuming_from: Path | None = None) -> None:
        """Make output_dir (and a separate logging_dir) ready for this run's files: an earlier run's are refused,
        or deleted (and said so) when `replace` (checkpoints.claim_output_dir, claim_logging_dir)."""
        if distributed.is_main_process():  # a refusal raises on rank 0; the others stop with it (torchrun)
            checkpoints.claim_output_dir(self.output_dir, replace, resuming_from)
            logging_dir = self._separate_logging_dir()
            if logging_dir is not None:
                checkpoints.claim_logging_dir(logging_dir, replace)
        distributed.barrier()

    @contextlib.contextmanager
    def _locked_folders(self):
        """Lock output_dir, and a separate logging_dir, against a second trainer while the block runs
        (checkpoints.output_dir_lock): two runs would interleave their rows in one metrics.jsonl. Under torchrun only
        rank 0 writes to them, so only rank 0 holds the locks."""
        with contextlib.ExitStack() as locks:
            if distributed.is_main_process():
                locks.enter_context(checkpoints.output_dir_lock(self.output_dir))
                logging_dir = self._separate_logging_dir()
                if logging_dir is not None:
                    locks.enter_context(checkpoints.output_dir_lock(logging_dir, "logging_dir"))
            yield

    def _separate_logging_dir(self) -> Path | None:
        """The folder of metrics.jsonl (config.logging_dir) when it is not output_dir itself, else None."""
        folder = self.metrics_path.parent
        return None if _same_folder(folder, self.output_dir) else folder

    @contextlib.contextmanager
    def checkpoint_on_failure(self, what: str, unlogged: list[dict] | None = None):
        """If the block fails, save the state it began in and re-raise, so a resumed run redoes the block exactly.

        The state it began in: the RNG states and the prompt sampler's position as they were then, with the weights
        and optimizer, so only while no optimizer step has been taken inside the block (after one, that state no
        longer fits the weights). Nothing is saved before the first step (there is nothing to resume), nor under
        torchrun when one rank fails alone (the others are not there to save with it), nor when the block saved
        or tried to (a completed save holds this state already; a failed one would only fail again). `unlogged`:
        the metrics of the steps whose logging the block was doing, kept as the step's row of the history
        (rewritten on resume). A save that fails too is reported, and the original error is the one raised."""
        rng, sampler, steps_before = checkpoints.rng_state(), self.sampler.state_dict(), self.optimizer_steps
        saves_before = self.save_attempts
        try:
            yield
        except BaseException as error:
            weights_changed = self.optimizer_steps != steps_before
            saved = self.save_attempts != saves_before
            if not weights_changed and not saved and self.step > 0 and distributed.stopped_together(error):
                if unlogged is not None and (not self.history or self.history[-1]["step"] != self.step):
                    self.history.append({"step": self.step, **average_metrics(unlogged)})
                self._save_after_failure(what, rng, sampler)
            raise

    def _save_after_failure(self, what: str, rng: dict, sampler: dict) -> None:
        try:
            path = self.save_checkpoint(rng_state=rng, sampler_state=sampler)
        except Exception as error:
            print(f"\n{what} failed, and saving the state after step {self.step} failed too: {error}")
            return
        print(
            f"\n{what} failed: the state after step {self.step} is saved in {path}; "
            "resume with --resume (or train(resume_from_checkpoint=True))."
        )

    # --- checkpoints (minigrpo.run.checkpoints does the work) -------------------------------
    def trainable_modules(self) -> dict[str, torch.nn.Module]:
        """Modules whose weights a checkpoint must hold; 'model' is the policy."""
        return {"model": self.model}

    def save_checkpoint(self, rng_state: dict | None = None, sampler_state: dict | None = None) -> Path:
        """Write output_dir/checkpoint-{step} atomically, keep only the newest save_total_limit, and tell the
        callbacks (on_save).

        rng_state / sampler_state: the state to resume from, when it is not the
        current one (a failed step saves the state it started from).
        Under torchrun every rank calls it and rank 0 writes (every rank holds the same weights and optimizer
        state, and draws the same prompts); the others wait until the folder is complete. Ctrl-C, SIGTERM and
        SIGHUP wait until the checkpoint is written (signals_deferred), then stop the run.
        """
        self.save_attempts += 1
        path = self.output_dir / f"checkpoint-{self.step}"
        with signals_deferred():
            # FSDP2: every rank takes part in gathering the whole weights and optimizer state for rank 0.
            full_states = distributed.full_state_dicts(self.model, self.optimizer) if self._sharded else None
            if distributed.is_main_process():
                path = checkpoints.write_checkpoint(
                    self.output_dir,
                    self.step,
                    self.trainable_modules(),
                    self.tokenizer,
                    self.optimizer,
                    sampler_state or self.sampler.state_dict(),
                    rng_state or checkpoints.rng_state(),
                    self.history,
                    self.run_args(),
                    full_states,
                )
                checkpoints.rotate_checkpoints(self.output_dir, self.config.save_total_limit)
            distributed.barrier()
            self.callback_handler.fire("on_save", self)
        return path

    def run_args(self) -> dict:
        """What defines this run (config, model, reward functions, training set), saved with each checkpoint."""
        if getattr(self, "_train_dataset_record", None) is None:  # hashed once: every value of every row
            self._train_dataset_record = dataset_record(self.train_dataset)
        names = [reward_func_name(f) for f in self.reward_funcs]
        return checkpoints.run_args(self.config, self.model, names, self._train_dataset_record)

    def load_checkpoint(
        self, path: str | Path, allow_config_change: bool = False, allow_dataset_change: bool = False
    ) -> None:
        """Restore model(s), optimizer, step, RNG, data position and metric history; every file is read and
        checked first, and a run whose training-defining settings differ is refused unless allow_config_change,
        one on another training set unless allow_dataset_change."""
        state = checkpoints.read_checkpoint(path, self.trainable_modules(), self.optimizer)
        self._restore(Path(path), state, allow_config_change, allow_dataset_change)

    def _restore(self, path: Path, state: dict, allow_config_change: bool, allow_dataset_change: bool = False) -> None:
        current = self.run_args()
        changes = checkpoints.changed_run_fields(state["args"], current)
        if changes and not allow_config_change:
            raise CheckpointError(
                f"{path} belongs to a run with other settings ({'; '.join(changes)}): resume with the same "
                "settings, or pass allow_config_change=True (--allow-config-change) to continue with the new ones."
            )
        if not state["args"].get("train_dataset"):
            print(f"{path} predates training-set fingerprints (minigrpo before 0.3.0): the dataset is not checked")
        new_data = checkpoints.changed_train_dataset(state["args"], current)
        if new_data and not allow_dataset_change:
            raise CheckpointError(
                f"{path} was trained on another training set ({new_data}): resume with the checkpoint's dataset, or "
                "pass allow_dataset_change=True (--allow-dataset-change) to continue on this one, its prompt "
                "sampler starting afresh."
            )
        if not _same_folder(path.parent, self.output_dir):
            # A checkpoint of another run (run A) continued into this output_dir (run B), as transformers' Trainer
            # does: B's own checkpoints and metrics are never overwritten with A's, so B must hold no earlier run.
            self._claim_folders(self.config.overwrite_output_dir, resuming_from=path)
        load_full_states = None
        if self._sharded:  # FSDP2: every rank reads the whole states and keeps its shards
            load_full_states = lambda weights, optimizer_state: distributed.load_full_state_dicts(  # noqa: E731
                self.model, self.optimizer, tie_weights(self.model, dict(weights)), optimizer_state
            )
        checkpoints.apply_checkpoint(state, self.trainable_modules(), self.optimizer, load_full_states)
        if changes:
            self._apply_config_to_optimizer()
            print(f"resuming with changed settings: {'; '.join(changes)}")
        if new_data:  # its epoch and position index the old set's rows: this set starts at its beginning
            print(f"continuing on a new training set: {new_data}; the prompt sampler starts afresh")
        else:
            self.sampler.load_state_dict(state["sampler"])
        checkpoints.set_rng_state(state["rng"])
        self.step, self.history = state["step"], state["history"]
        self.set_learning_rate(self.step)  # the schedule is a function of the step: nothing else to restore
        note = schedule_change_note(state["args"].get("config", {}), self.config, self.step, self.max_steps)
        if note and distributed.is_main_process():
            print(note)
        # TRL's num_tokens goes on from the last logged count (metrics logged before num_tokens existed: 0)
        self.num_tokens = next((int(row["num_tokens"]) for row in reversed(self.history) if "num_tokens" in row), 0)
        if distributed.is_main_process():
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.metrics_path, "w") as f:  # drop lines logged after the checkpoint
                f.writelines(checkpoints.dumps(m) + "\n" for m in self.history)
            keep_steps_up_to(self.output_dir / COMPLETIONS_FILE, self.step)  # log_completions' rows, likewise
            print(f"resumed from {path} at step {self.step}")

    def _apply_config_to_optimizer(self) -> None:
        """After a resume with allow_config_change: the checkpoint's optimizer state carries the old betas and
        weight decay; the current config's take over (the moments are kept). The learning rate needs nothing:
        each step sets it from the current config (set_learning_rate)."""
        for group in self.optimizer.param_groups:
            group["betas"] = (self.config.adam_beta1, self.config.adam_beta2)
            group["weight_decay"] = self.config.weight_decay

    def save_model(self, path: str | Path | None = None, merged: bool = False) -> Path:
        """The trained policy and tokenizer, loadable with load_model_and_tokenizer(path).

        A LoRA policy writes its adapters only (adapter_config.json + adapter_model.safetensors, megabytes),
        which load on top of the base model they name; ``merged=True`` writes the base model with the
        adapters merged into its weights instead (W + (alpha/r) BA: a plain model, as large as the base).
        The merge runs on a copy, so training can go on with the adapters as they were.
        path: the folder (None: output_dir, as in TRL; `python -m minigrpo train` passes <output_dir>/final).
        """
        path = Path(path) if path is not None else self.output_dir
        weights = distributed.full_state_dicts(self.model, self.optimizer)[0] if self._sharded else None
        if distributed.is_main_process():  # under torchrun: every rank calls it, rank 0 writes
            if merged and is_peft_model(self.model):
                copy.deepcopy(self.model).merge_and_unload().save_pretrained(path)
            else:
                self.model.save_pretrained(path, state_dict=weights)
            self.tokenizer.save_pretrained(path)
        distributed.barrier()
        return path


def _same_folder(a: Path, b: Path) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()

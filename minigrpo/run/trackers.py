"""report_to: experiment trackers (TensorBoard, Weights & Biases, trackio) through transformers' own callbacks.

transformers' ``TensorBoardCallback``, ``WandbCallback`` and ``TrackioCallback`` are ``TrainerCallback``\\ s: they
read ``args`` (the config: ``to_dict``, ``to_json_string``, ``run_name``, ``project``, ...) and ``state``
(``global_step``, ``is_world_process_zero``) and write on ``on_train_begin`` (the config, once), ``on_log`` (each
logged row) and ``on_train_end``. minigrpo fires those events with the same arguments (run.callbacks), so the
callbacks run unchanged: each row of ``trainer.state.log_history`` reaches the tracker at step ``global_step``,
under transformers' names (``rewrite_logs``: ``reward`` -> ``train/reward``, ``eval_accuracy`` ->
``eval/accuracy``), as a TRL run's does. No file format is written here.

Under torchrun only the main process gets the callbacks: the logged rows are already the means over processes.
"""

from __future__ import annotations

import importlib.util
import os

from minigrpo.trl_compat import TRACKERS, requested_trackers

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
"""The package each tracker needs (minigrpo's `trackers` extra installs them all)."""


class MissingTrackerError(ImportError):
    """report_to names a tracker whose package is not installed (the command line says so in one line)."""


def is_installed(tracker: str) -> bool:
    return importlib.util.find_spec(PACKAGES[tracker]) is not None


def resolve_trackers(report_to) -> list[str]:
    """report_to -> the tracker names to report to: "all" is every installed one; a named tracker that is not
    installed is one error naming the extra to install."""
    names = requested_trackers(report_to)
    if names == ["all"]:
        return [name for name in TRACKERS if is_installed(name)]
    missing = [name for name in names if not is_installed(name)]
    if missing:
        packages = " ".join(PACKAGES[name] for name in missing)
        raise MissingTrackerError(
            f"report_to={report_to!r}: {packages} is not installed. Install the trackers with "
            f"pip install 'minigrpo[trackers]' (or pip install {packages}), or set report_to='none'."
        )
    return names


def reporting_callbacks(report_to, logging_dir: str | None = None) -> list:
    """transformers' callback instance for each tracker in report_to (none for "none").

    logging_dir: where TensorBoard writes its event files (transformers' TENSORBOARD_LOGGING_DIR wins when set;
    without either, transformers' default <output_dir>/runs/<date>_<host>)."""
    names = resolve_trackers(report_to)
    if not names:
        return []
    from transformers.integrations import get_reporting_integration_callbacks  # here: only a run that reports pays

    callbacks = [callback_class() for callback_class in get_reporting_integration_callbacks(names)]
    for callback in callbacks:  # transformers 5's TensorBoardCallback has a logging_dir; 4.x reads args.logging_dir
        if hasattr(callback, "tb_writer") and getattr(callback, "logging_dir", None) is None and logging_dir:
            callback.logging_dir = os.path.expanduser(logging_dir)
    return callbacks

"""Callbacks with transformers' ``TrainerCallback`` protocol, for the events a minigrpo run has.

A TRL script passes ``callbacks=[...]`` to the trainer (or calls ``trainer.add_callback``); each callback's
``on_<event>(args, state, control, **kwargs)`` is called as transformers' Trainer calls it, with
``model``, ``processing_class``, ``optimizer`` and ``lr_scheduler`` (None: minigrpo's learning rate is a function
of the step, run.schedule.lr_at) in kwargs, ``logs`` for on_log and ``metrics`` for on_evaluate. The events:

    on_init_end      the trainer is built
    on_train_begin   train() starts (after a resume is applied)
    on_step_begin    before each generation
    on_step_end      after each generation and its optimizer steps (state.global_step has advanced by them)
    on_log           a row of metrics was logged (logs=...)
    on_evaluate      the held-out set was evaluated (metrics=...)
    on_save          a checkpoint was written
    on_train_end     training finished (also after a callback stopped it)

A GRPO generation feeds ``optimizer_steps_per_generation`` optimizer steps (one by default), so on_step_end
fires once per generation, not once per optimizer step when a generation feeds several. A callback may set
``control.should_training_stop`` (the run stops after this generation, with a checkpoint to resume from) or
``control.should_save`` (a checkpoint is written now); the other TrainerControl flags are not read: logging,
evaluation and saving follow logging_steps, eval_steps and save_steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: transformers' trainer modules pull in peft (and bitsandbytes), seconds
    from transformers import TrainerCallback, TrainerControl

EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_step_begin",
    "on_step_end",
    "on_log",
    "on_evaluate",
    "on_save",
    "on_train_end",
)


class CallbackHandler:
    """The trainer's callbacks, called in order for each event; holds the shared TrainerControl."""

    def __init__(self, callbacks=None):
        from transformers import TrainerControl

        self.callbacks: list[TrainerCallback] = []
        self.control = TrainerControl()
        for callback in callbacks or []:
            self.add(callback)

    def add(self, callback) -> None:
        """A TrainerCallback instance or class (a class is instantiated, as in transformers)."""
        callback = callback() if isinstance(callback, type) else callback
        if not any(callable(getattr(callback, event, None)) for event in EVENTS):
            raise TypeError(
                f"callbacks: {callback!r} has none of the methods {', '.join(EVENTS)}: pass a "
                "transformers.TrainerCallback (subclass it and override the events you need)."
            )
        self.callbacks.append(callback)

    def pop(self, callback) -> TrainerCallback | None:
        """Remove and return `callback` (an instance, or the first instance of a class); None if absent."""
        for i, existing in enumerate(self.callbacks):
            if existing is callback or (isinstance(callback, type) and isinstance(existing, callback)):
                return self.callbacks.pop(i)
        return None

    def fire(self, event: str, trainer, **kwargs) -> TrainerControl:
        """Call `event` on every callback that has it, as transformers does; returns the control flags."""
        from transformers import TrainerControl

        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is None:
                continue
            result = method(
                trainer.args,
                trainer.state,
                self.control,
                model=trainer.model,
                processing_class=trainer.processing_class,
                optimizer=trainer.optimizer,
                lr_scheduler=None,
                **kwargs,
            )
            if isinstance(result, TrainerControl):  # transformers lets a callback return a new control
                self.control = result
        return self.control

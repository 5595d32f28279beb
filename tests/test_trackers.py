"""report_to: each logged row reaches the tracker (through transformers' own callbacks) under transformers' names
and at its step; the trackers report_to accepts, and the error for one that is not installed."""

import math

import pytest

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.run import trackers
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset
from minigrpo.trl_compat import requested_trackers


def small_run(tmp_path, **fields) -> GRPOTrainer:
    """2 optimizer steps of 1 prompt x G=4, 8 new tokens, with an evaluation at step 2."""
    config = GRPOConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4,
                        max_steps=2, max_completion_length=8, learning_rate=1e-5, logging_steps=1,
                        save_strategy="no", bf16=False, seed=0, eval_steps=2, **fields)  # fmt: skip
    trainer = GRPOTrainer("tiny", [correctness_reward], config, make_arithmetic_dataset(8, "train"),
                          make_arithmetic_dataset(4, "test"))  # fmt: skip
    trainer.train()
    return trainer


def tracker_name(key: str) -> str:
    """transformers' rewrite_logs, spelled out: eval_x -> eval/x, everything else -> train/x."""
    return "eval/" + key.removeprefix("eval_") if key.startswith("eval_") else "train/" + key


def test_tensorboard_event_files_hold_every_logged_scalar_at_its_step(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'minigrpo[trackers]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = small_run(tmp_path, report_to="tensorboard", logging_dir=str(tmp_path / "tb"))
    (events_file,) = (tmp_path / "tb").glob("events.out.tfevents.*")  # one writer, in logging_dir
    events = EventAccumulator(str(events_file), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()

    history = trainer.state.log_history
    assert [row["step"] for row in history] == [1, 2] and "eval_accuracy" in history[1]
    expected = {(tracker_name(key), row["step"]): value for row in history for key, value in row.items()}
    written = {(tag, event.step): event.value for tag in events.Tags()["scalars"] for event in events.Scalars(tag)}
    assert written.keys() == expected.keys()  # every metric of every row, nothing else
    for (tag, step), value in written.items():  # event files hold float32
        want = expected[tag, step]
        assert (math.isnan(value) and math.isnan(want)) or value == pytest.approx(want, rel=1e-6, abs=1e-6), tag
    # the config is recorded once, as text (TensorBoardCallback's "args"), and it is this run's
    assert "args/text_summary" in events.Tags()["tensors"]
    (args_event,) = events.Tensors("args/text_summary")
    assert '"max_completion_length": 8' in args_event.tensor_proto.string_val[0].decode()


def test_report_to_is_read_as_transformers_reads_it():
    assert requested_trackers("none") == requested_trackers(None) == requested_trackers([]) == []
    assert requested_trackers(["none"]) == []
    assert requested_trackers("tensorboard") == ["tensorboard"]
    assert requested_trackers(["wandb", "trackio"]) == ["wandb", "trackio"]
    assert requested_trackers("all") == ["all"]
    assert GRPOConfig(report_to=["tensorboard", "wandb"]).report_to == ["tensorboard", "wandb"]


def test_an_unknown_tracker_is_refused_with_those_it_could_be():
    with pytest.raises(ValueError, match=r"report_to=\['tensorboard', 'mlflow'\]: minigrpo reports to tensorboard, "):
        GRPOConfig(report_to=["tensorboard", "mlflow"])


def test_all_means_the_installed_trackers(monkeypatch):
    monkeypatch.setattr(trackers, "is_installed", lambda name: name != "wandb")
    assert trackers.resolve_trackers("all") == ["tensorboard", "trackio"]
    monkeypatch.setattr(trackers, "is_installed", lambda name: False)
    assert trackers.resolve_trackers("all") == [] and trackers.reporting_callbacks("all") == []


def test_a_tracker_that_is_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setitem(trackers.PACKAGES, "wandb", "wandb_is_not_installed_here")
    with pytest.raises(ImportError) as error:
        trackers.resolve_trackers(["tensorboard", "wandb"])
    message = str(error.value)
    assert "wandb_is_not_installed_here is not installed" in message and "pip install 'minigrpo[trackers]'" in message
    assert "(or pip install wandb_is_not_installed_here)" in message  # only the missing one


def test_no_tracker_means_no_callback():
    assert trackers.reporting_callbacks("none") == [] and trackers.reporting_callbacks(None) == []

"""Runs that lose nothing, round three: a save that fails says why in one line and leaves no temporary folder; a
signal during a save lets it finish, then stops; a resume knows its training set and the values an older release
used for the fields it did not record; an overwritten output folder keeps nothing of the old run; dataset columns
cannot shadow what reward functions receive; the messages name the real cause (huge advantages, the accuracy
reward whatever the order of reward_funcs)."""

import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from datasets import Dataset

import minigrpo
from minigrpo import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
from minigrpo.rewards import accuracy_reward_index, accuracy_reward_note, compute_rewards
from minigrpo.run import checkpoints
from minigrpo.run.checkpoints import (
    ARGS_FILE,
    METRICS_FILE,
    CheckpointError,
    changed_run_fields,
    checkpoint_folders,
    read_checkpoint,
    rng_state,
    save_failure,
    write_checkpoint,
    write_errno,
)
from minigrpo.run.datasets import check_columns, dataset_record
from minigrpo.run.evaluation import evaluate_model
from minigrpo.run.metrics import reward_metrics
from minigrpo.run.resume import signals_deferred, termination_as_interrupt
from minigrpo.tasks.arithmetic import correctness_reward, format_reward
from minigrpo.trainer import NonFiniteError, advantage_overflow


class Tokenizer:
    """Stands in for a tokenizer: save_pretrained writes one file."""

    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


def stand_in_state(width: int = 64):
    """A small module and an AdamW with moments: what write_checkpoint needs, without a language model."""
    modules = {"model": torch.nn.Linear(width, width)}
    optimizer = torch.optim.AdamW(modules["model"].parameters(), lr=0.1)
    modules["model"].weight.sum().backward()
    optimizer.step()
    return modules, optimizer


def write(output_dir, step, modules, optimizer):
    return write_checkpoint(output_dir, step, modules, Tokenizer(), optimizer, {"epoch": 0}, rng_state(), [], {})


def leftovers(output_dir) -> list[str]:
    return [p.name for p in Path(output_dir).iterdir() if p.name.startswith(".checkpoint")]


# --- 1. a failed save: one line with the cause, no temporary folder -----------------------------------
FILE_SIZE_LIMIT = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    import torch
    from minigrpo.run.checkpoints import rng_state, write_checkpoint
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
    out, cli_dir = Path(sys.argv[1]), sys.argv[2]

    class Tokenizer:
        def save_pretrained(self, folder):
            (folder / "tokenizer.json").write_text("{}")

    model = torch.nn.Linear(64, 64)  # 16.6 kB of weights: over the 8 kB limit
    optimizer = torch.optim.AdamW(model.parameters())
    resource.setrlimit(resource.RLIMIT_FSIZE, (8_000, resource.RLIM_INFINITY))
    try:
        write_checkpoint(out, 3, {"model": model}, Tokenizer(), optimizer, {}, rng_state(), [], {})
    except OSError as error:
        print(json.dumps({"errno": error.errno, "message": str(error)}))
    # the whole command line: the tiny model's 1.06 MB of weights fit under 1.5 MB, its 2.1 MB optimizer state not
    resource.setrlimit(resource.RLIMIT_FSIZE, (1_500_000, resource.RLIM_INFINITY))
    from minigrpo.__main__ import main
    sys.exit(main(["train", "--model", "tiny", "--eval-size", "2", "--eval-steps", "0", "--max-steps", "1",
                   "--prompts-per-step", "2", "--num-generations", "2", "--max-completion-length", "8",
                   "--save-steps", "1", "--output-dir", cli_dir]))
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="POSIX file-size limits")
def test_a_save_under_a_file_size_limit_says_file_too_large_in_one_line_and_leaves_no_tmp(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    env["PYTHONPATH"] = str(Path(minigrpo.__file__).parent.parent)
    cli_dir = tmp_path / "cli"
    done = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path), str(cli_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # safetensors' error (weights): the errno read from its text
    first = json.loads(done.stdout.splitlines()[0])
    assert first["errno"] == errno.EFBIG and "\n" not in first["message"]
    assert first["message"].startswith(f"[Errno 27] could not write checkpoint-3 in {tmp_path}: File too large;")
    assert "file-size limit (ulimit -f)" in first["message"]
    assert leftovers(tmp_path) == [] and not (tmp_path / "checkpoint-3").exists()
    # torch.save's RuntimeError (optimizer state), through the command line: one line, exit status 2
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "enforce fail" not in done.stderr
    errors = re.findall(r"error: .*", done.stderr)  # the progress bar, left open, shares its line
    assert len(errors) == 1 and errors[0].startswith(f"error: [Errno 27] could not write checkpoint-1 in {cli_dir}: ")
    assert errors[0].endswith(
        "File too large; the temporary folder was removed and earlier checkpoints are kept. A "
        "file-size limit (ulimit -f) or the file system's largest file (FAT32: 4 GiB) is smaller "
        "than the checkpoint: raise the limit or choose an output_dir on another file system, "
        "then resume (--debug shows the traceback)"
    )
    assert leftovers(cli_dir) == [] and checkpoint_folders(cli_dir) == []


def test_the_cause_of_a_failed_write_is_named_whatever_raised_it():
    def torch_style(code):  # what torch.save into a Python file raises: a RuntimeError whose context is the OSError
        try:
            try:
                raise OSError(code, os.strerror(code))
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None
        except RuntimeError as error:
            error.__context__ = OSError(code, os.strerror(code))
            return error

    assert write_errno(torch_style(errno.ENOSPC)) == errno.ENOSPC
    assert write_errno(RuntimeError("Error while serializing: I/O error: File too large (os error 27)")) == 27
    old_safetensors = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left" })'
    assert write_errno(RuntimeError(old_safetensors)) == 28  # safetensors before 0.5
    assert write_errno(PermissionError(errno.EACCES, "Permission denied")) == errno.EACCES
    assert write_errno(RuntimeError("something else")) is None
    cases = {
        torch_style(errno.ENOSPC): ("No space left on device", "Free some space"),
        PermissionError(errno.EACCES, "Permission denied"): ("Permission denied", "Make output_dir writable"),
        OSError(errno.EROFS, "Read-only file system"): ("Read-only file system", "The file system is read-only"),
        RuntimeError("odd failure\nsecond line"): ("odd failure", "Check that output_dir is writable"),
    }
    for error, (cause, fix) in cases.items():
        message = str(save_failure(error, "checkpoint-4 in out"))
        assert f"could not write checkpoint-4 in out: {cause}; the temporary folder was removed" in message
        assert f"{fix}" in message and message.endswith(", then resume") and "\n" not in message


def test_a_permission_error_or_an_interrupt_mid_save_removes_the_temporary_folder(tmp_path, monkeypatch):
    modules, optimizer = stand_in_state()

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(checkpoints.torch, "save", refuse)
    with pytest.raises(OSError, match=r"Permission denied; the temporary folder was removed.*Make output_dir writ"):
        write(tmp_path, 1, modules, optimizer)
    assert leftovers(tmp_path) == [] and checkpoint_folders(tmp_path) == []

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):  # not turned into an OSError, but cleaned up
        write(tmp_path, 1, modules, optimizer)
    assert leftovers(tmp_path) == []


# --- 1. a signal during a save: the save finishes, then the run stops ---------------------------------
def make(tiny, dataset, config, reward_funcs=(correctness_reward,)):
    model, tokenizer = tiny
    return GRPOTrainer(model, list(reward_funcs), args=config, train_dataset=dataset, processing_class=tokenizer)


def logged_steps(output_dir) -> list[int]:
    return [json.loads(line)["step"] for line in open(Path(output_dir) / METRICS_FILE)]


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_a_save_leaves_the_last_logged_step_with_its_checkpoint(
    tiny, train_dataset, small_config, monkeypatch, signal_name
):
    """Two short steps (2 prompts x G=2, 8 tokens); the signal comes inside checkpoint-2's torch.save."""
    real_save = checkpoints.torch.save

    def signalled_mid_save(*args, **kwargs):  # in the middle of checkpoint-2: weights written, optimizer not yet
        os.kill(os.getpid(), getattr(signal, signal_name))
        time.sleep(0.05)  # the handler has run (it only notes the signal) before the write goes on
        return real_save(*args, **kwargs)

    config = small_config.replace(max_steps=3, save_steps=2, prompts_per_step=2, num_generations=2)
    trainer = make(tiny, train_dataset, config.replace(max_completion_length=8, per_device_train_batch_size=4))
    monkeypatch.setattr(checkpoints.torch, "save", signalled_mid_save)
    before = {name: signal.getsignal(getattr(signal, name)) for name in ("SIGINT", "SIGTERM")}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C's handler (a test worker may ignore SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # every handler is given back
        assert signal.getsignal(signal.SIGTERM) is before["SIGTERM"]
    finally:
        signal.signal(signal.SIGINT, before["SIGINT"])
    output = Path(small_config.output_dir)
    assert logged_steps(output) == [1, 2] and [p.name for p in checkpoint_folders(output)] == ["checkpoint-2"]
    assert read_checkpoint(output / "checkpoint-2", trainer.trainable_modules())["step"] == 2  # complete
    assert leftovers(output) == []


def test_a_signal_at_a_random_moment_of_a_save_never_loses_the_checkpoint(tmp_path):
    """The race, 40 times on a stand-in (a 512x512 layer: about 3 MB of weights and moments): SIGTERM at a random
    moment before, during or just after the write. Without signals_deferred, a signal landing inside
    write_checkpoint left a .tmp folder and no checkpoint. A signal before the save began stops it from starting."""
    modules, optimizer = stand_in_state(width=512)
    started = time.perf_counter()
    write(tmp_path / "timing", 1, modules, optimizer)
    duration = time.perf_counter() - started
    rng, during = random.Random(0), 0
    for attempt in range(40):
        output = tmp_path / f"try-{attempt}"
        delay = rng.uniform(0, 1.2 * duration)
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM))
        interrupted, began = False, False
        with termination_as_interrupt():
            try:
                timer.start()
                with signals_deferred():
                    began = True
                    write(output, 1, modules, optimizer)
                timer.join()
                deadline = time.monotonic() + 1
                while time.monotonic() < deadline:  # the handler runs between bytecodes: give it the chance
                    time.sleep(0.001)
            except KeyboardInterrupt:
                interrupted = True
            timer.join()
        assert interrupted, f"try {attempt}: the signal was lost"
        assert not output.exists() or leftovers(output) == []
        if began:  # a save that began was finished, whenever the signal came
            assert read_checkpoint(output / "checkpoint-1", modules)["step"] == 1
        during += began and delay < duration
    assert during >= 10  # most signals did land inside a save


# --- 2. resume on another training set --------------------------------------------------------------
def saved_at_step_2(tiny, dataset, config) -> GRPOTrainer:
    """A run's checkpoint-2, as a stopped run leaves it, without training: its sampler 8 rows into the set."""
    trainer = make(tiny, dataset, config)
    trainer.step, trainer.history = 2, [{"step": 1}, {"step": 2}]
    trainer.sampler.position = 8
    trainer.save_checkpoint()
    return trainer


def test_resume_on_another_training_set_refuses_naming_both_unless_told(tiny, small_config):
    config = small_config.replace(max_steps=2)
    first = make_arithmetic_dataset(n=16, split="train", seed=1)
    saved_at_step_2(tiny, first, config)
    record = dataset_record(first)
    assert record == dataset_record(make_arithmetic_dataset(n=16, split="train", seed=1))  # rebuilt: the same
    assert record["rows"] == 16 and len(record["fingerprint"]) == 64

    for other in (make_arithmetic_dataset(n=16, split="train", seed=2), first.select(range(5))):
        with pytest.raises(CheckpointError) as info:
            make(tiny, other, config).train(resume_from_checkpoint=True)
        message = str(info.value)
        assert f"16 rows (fingerprint {record['fingerprint'][:12]}, first prompt {record['first_prompt']!r})" in message
        assert f"this trainer has {len(other)} rows (fingerprint {dataset_record(other)['fingerprint'][:12]}" in message
        assert "allow_dataset_change=True (--allow-dataset-change)" in message

    same = make(tiny, make_arithmetic_dataset(n=16, split="train", seed=1), config)
    same.train(resume_from_checkpoint=True)
    assert same.sampler.state_dict() == {"epoch": 0, "position": 8}  # the same set: where the run was
    moved = make(tiny, make_arithmetic_dataset(n=16, split="train", seed=2), config)
    moved.train(resume_from_checkpoint=True, allow_dataset_change=True)
    assert moved.step == 2 and moved.sampler.state_dict() == {"epoch": 0, "position": 0}  # restarted


# --- 3. a checkpoint of an older release: its missing fields ----------------------------------------
def test_a_field_an_older_checkpoint_lacks_counts_as_that_releases_value_or_is_named(monkeypatch):
    model = torch.nn.Linear(2, 2)
    current = checkpoints.run_args(GRPOConfig.deepseekmath(prompts_per_step=16), model, ["correctness_reward"])

    def without(*names):
        return {**current, "config": {k: v for k, v in current["config"].items() if k not in names}}

    # added in 0.3.0, and every earlier run behaved as today's default: nothing to say
    assert changed_run_fields(without(*checkpoints.FIELDS_ADDED), current) == []
    # a value other than the old release's is a change, named with that release
    custom = {**current, "config": {**current["config"], "model_init_kwargs": {"dtype": "bfloat16"}}}
    assert changed_run_fields(without("model_init_kwargs"), custom) == [
        "model_init_kwargs: None (before 0.3.0, which added it) -> {'dtype': 'bfloat16'}"
    ]
    # a field the table does not know: named, never assumed
    assert changed_run_fields(without("epsilon_high"), current) == [
        "epsilon_high: not recorded (the checkpoint predates it: its value is unknown) -> None"
    ]
    # a field today's minigrpo does not know (a newer one wrote the checkpoint): named too
    newer = {**current, "config": {**current["config"], "a_newer_field": 1}}
    assert changed_run_fields(newer, current) == [
        "a_newer_field: 1 -> a field this minigrpo does not know (a newer one wrote it)"
    ]
    # a field whose old value is not today's default: the old value is what the checkpoint is compared with
    monkeypatch.setitem(checkpoints.FIELDS_ADDED, "epsilon_high", ("0.4.0", 0.28))
    assert changed_run_fields(without("epsilon_high"), current) == [
        "epsilon_high: 0.28 (before 0.4.0, which added it) -> None"
    ]
    resumed_with_the_old_value = {**current, "config": {**current["config"], "epsilon_high": 0.28}}
    assert changed_run_fields(without("epsilon_high"), resumed_with_the_old_value) == []


def test_an_older_checkpoint_resumes_with_the_old_value_or_names_the_field(tiny, train_dataset, small_config):
    config = small_config.replace(max_steps=2)
    path = saved_at_step_2(tiny, train_dataset, config).output_dir / "checkpoint-2"
    args = json.loads((path / ARGS_FILE).read_text())
    for name in (*checkpoints.FIELDS_ADDED, "train_dataset"):  # as 0.2.0 wrote it
        args["config"].pop(name, None)
    args.pop("train_dataset")
    (path / ARGS_FILE).write_text(json.dumps(args))
    resumed = make(tiny, train_dataset, config)
    resumed.train(resume_from_checkpoint=True)  # push_to_hub False, model_init_kwargs None, ... as 0.2.0 ran
    assert resumed.step == 2
    args["config"].pop("mask_truncated_completions")
    (path / ARGS_FILE).write_text(json.dumps(args))
    with pytest.raises(CheckpointError, match=r"mask_truncated_completions: not recorded .* -> False"):
        make(tiny, train_dataset, config).train(resume_from_checkpoint=True)


# --- 4. an overwritten output folder ----------------------------------------------------------------
def test_an_overwritten_output_folder_keeps_nothing_of_the_old_run_even_when_the_new_run_dies(
    tiny, train_dataset, small_config
):
    old = Path(small_config.output_dir)
    (old / "final").mkdir(parents=True)
    (old / "final" / "model.safetensors").write_text("the old run's model")
    (old / ".checkpoint-6.tmp").mkdir()
    for name in (METRICS_FILE, "all_results.json", "config.json", "model.safetensors", "notes.txt"):
        (old / name).write_text("old")
    with pytest.raises(FileExistsError, match=r"holds an earlier run \(metrics.jsonl, final, all_results.json"):
        make(tiny, train_dataset, small_config).train()

    def dies(prompts, completions, completion_ids, **columns):
        raise RuntimeError("the new run dies in its first step")

    with pytest.raises(Exception, match="the new run dies"):
        make(tiny, train_dataset, small_config.replace(overwrite_output_dir=True), [dies]).train()
    assert sorted(p.name for p in old.iterdir()) == [".minigrpo.lock", "notes.txt"]  # not a run's file: kept


# --- 5. reserved column names ------------------------------------------------------------------------
@pytest.mark.parametrize("column", ["prompts", "completions", "completion_ids", "trainer_state", "log_metric"])
def test_a_column_named_as_a_reward_keyword_is_refused_by_name(tiny, small_config, column):
    rows = [{"prompt": "What is 1 + 1?", "answer": "2", column: "shadow"}] * 4
    with pytest.raises(ValueError, match=f"train_dataset has a column named '{column}', a keyword the trainer"):
        make(tiny, Dataset.from_list(rows), small_config)
    with pytest.raises(ValueError, match=f"rename_column\\('{column}', 'reference_{column}'\\)"):
        check_columns(["prompt", column], "eval_dataset")
    with pytest.raises(ValueError, match=f"a dataset column is named '{column}'"):  # evaluate(other set) too
        compute_rewards([format_reward], ["q"], ["a"], [[1]], {column: ["shadow"]})
    check_columns(["prompt", "answer", "completion"], "train_dataset")  # TRL drops `completion`: harmless here


# --- 6. messages that name the real cause ------------------------------------------------------------
def test_rewards_of_1e30_unscaled_are_named_as_the_cause_not_the_learning_rate(tiny, train_dataset, small_config):
    def huge(prompts, completions, completion_ids, **columns):
        return [1e30 if i % 2 else -1e30 for i in range(len(completions))]

    config = small_config.replace(scale_rewards="none", max_completion_length=8, prompts_per_step=2)
    with pytest.raises(NonFiniteError) as info:
        make(tiny, train_dataset, config, [huge]).train()
    message = str(info.value)
    assert "Likely cause: the advantages, which reach 1e+30 in magnitude (scale_rewards='none'" in message
    assert "too high" not in message and "set scale_rewards='group'" in message

    unit = GRPOConfig(scale_rewards="group")
    assert advantage_overflow(torch.tensor([0.5, -2.0, 1e6]), unit) is None  # up to HUGE_ADVANTAGE: not blamed
    assert advantage_overflow(torch.tensor([0.5, -2e6]), unit).startswith("the advantages, which reach 2e+06 in ma")
    assert "scale_rewards='none'" not in advantage_overflow(torch.tensor([2e6]), unit)
    assert advantage_overflow(None, unit) is None and advantage_overflow(torch.tensor([]), unit) is None


def test_eval_accuracy_is_the_correctness_rewards_whatever_the_order(tiny, small_config):
    model, tokenizer = tiny
    problems = make_arithmetic_dataset(n=8, split="test", seed=0)
    config = small_config.replace(max_completion_length=16)
    metrics = evaluate_model(model, tokenizer, problems, [format_reward, correctness_reward], config)
    assert metrics["eval_accuracy"] == metrics["eval_rewards/correctness_reward/mean"]
    assert metrics["eval_accuracy"] != metrics["eval_rewards/format_reward/mean"]  # they differ on these 8


def test_the_accuracy_reward_is_found_by_mark_or_name_else_the_first_with_a_warning():
    def mine(prompts, completions, **kw):
        return [1.0] * len(completions)

    def accuracy_reward(completions, **kw):  # TRL's name (trl.rewards.accuracy_reward)
        return [1.0] * len(completions)

    assert accuracy_reward_index([format_reward, correctness_reward]) == 1
    assert accuracy_reward_index([format_reward, accuracy_reward]) == 1
    assert accuracy_reward_index([format_reward, mine]) == 0 and accuracy_reward_note([mine]) is None
    assert "will read 'format_reward', the first reward function" in accuracy_reward_note([format_reward, mine])
    mine.is_accuracy_reward = True
    assert accuracy_reward_index([format_reward, correctness_reward, mine]) == 2
    assert accuracy_reward_note([format_reward, mine]) is None

    # frac_reward_zero_std/all_correct reads it too: 2 groups of 2, [format 1, correct 0] and [format 0, correct 1]
    rewards_per_func = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])  # (N=4, F=2)
    metrics = reward_metrics(rewards_per_func, rewards_per_func.sum(1), [format_reward, correctness_reward], 2)
    assert metrics["frac_reward_zero_std/all_correct"] == 0.5 and metrics["frac_reward_zero_std/all_wrong"] == 0.5
    assert metrics["rewards/correctness_reward/mean"] == 0.5

"""A run's files are its own: a logging_dir or a resume never replaces another run's metrics or checkpoints, a
checkpoint is checked whole before any part of it is applied, the LoRA settings are part of what a resume compares,
and a metrics.jsonl cut short by a killed run still reads. No test here trains: each builds a trainer and saves or
resumes at once (the refusals come before the first step)."""

import json
import shutil
import time
import warnings
from pathlib import Path

import pandas
import pytest
import torch
from datasets import Dataset

import minigrpo.__main__
import minigrpo.models
import minigrpo.rollout
import minigrpo.trainer
from minigrpo import GRPOTrainer, load_model_and_tokenizer
from minigrpo.__main__ import main
from minigrpo.course.plots import load_history
from minigrpo.models import ADAPTER_CONFIG_FILE, add_adapters, lora_config, resolve_model_and_tokenizer
from minigrpo.rollout import render_prompts
from minigrpo.run.checkpoints import HISTORY_FILE, LOCK_FILE, METRICS_FILE, CheckpointError, RunMismatchError
from minigrpo.run.datasets import as_dataset
from minigrpo.run.schedule import resolve_max_steps
from minigrpo.tasks.arithmetic import correctness_reward


def make(train_dataset, config, peft_config=None):
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")  # a fresh copy: LoRA wraps it in place
    return GRPOTrainer(
        model, [correctness_reward], config, train_dataset, processing_class=tokenizer, peft_config=peft_config
    )


def saved_run(train_dataset, config, step: int, peft_config=None) -> Path:
    """A run's folder as a stopped run leaves it: checkpoint-<step> and a metrics.jsonl, without training."""
    trainer = make(train_dataset, config, peft_config)
    trainer.step, trainer.history = step, [{"step": s, "reward": s / 10} for s in range(1, step + 1)]
    output = Path(config.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in trainer.history))
    return trainer.save_checkpoint()


# --- 1. data loss: another run's metrics and checkpoints are never replaced ------------------------------------
def test_a_logging_dir_holding_another_run_is_refused_and_left_as_it_was(train_dataset, small_config, tmp_path):
    run_a = saved_run(train_dataset, small_config.replace(output_dir=str(tmp_path / "a")), step=2).parent
    metrics_a = (run_a / METRICS_FILE).read_text()
    config = small_config.replace(output_dir=str(tmp_path / "b"), logging_dir=str(run_a), overwrite_output_dir=True)
    with pytest.raises(FileExistsError, match=r"logging_dir .*/a is another run's output folder .*checkpoint-2"):
        make(train_dataset, config).train()
    assert (run_a / METRICS_FILE).read_text() == metrics_a

    logs = tmp_path / "logs"  # a folder with only an earlier metrics.jsonl: refused unless replacing is asked
    logs.mkdir()
    (logs / METRICS_FILE).write_text('{"step": 1}\n')
    config = small_config.replace(output_dir=str(tmp_path / "c"), logging_dir=str(logs))
    with pytest.raises(FileExistsError, match=r"logging_dir .*/logs holds the metrics.jsonl of an earlier run"):
        make(train_dataset, config).train()
    assert (logs / METRICS_FILE).read_text() == '{"step": 1}\n'


def test_resuming_another_runs_checkpoint_never_overwrites_this_output_dir(train_dataset, small_config, tmp_path):
    config_a = small_config.replace(output_dir=str(tmp_path / "a"), max_steps=2)
    checkpoint_a = saved_run(train_dataset, config_a, step=2)
    config_b = config_a.replace(output_dir=str(tmp_path / "b"))
    saved_run(train_dataset, config_b, step=1)
    files_b = lambda: {
        p: p.read_bytes() for p in Path(config_b.output_dir).rglob("*") if p.is_file() and p.name != LOCK_FILE
    }  # noqa: E731
    before = files_b()
    with pytest.raises(FileExistsError, match=r"resuming from .*a/checkpoint-2 \(another run's checkpoint\).*holds"):
        make(train_dataset, config_b).train(resume_from_checkpoint=str(checkpoint_a))
    assert files_b() == before

    # An empty output_dir branches off run A (as transformers does): A's history continues there, A is untouched.
    metrics_a = (checkpoint_a.parent / METRICS_FILE).read_text()
    branch = make(train_dataset, config_a.replace(output_dir=str(tmp_path / "c")))
    branch.train(resume_from_checkpoint=str(checkpoint_a))
    assert branch.step == 2 and [row["step"] for row in load_history(tmp_path / "c" / METRICS_FILE)] == [1, 2]
    assert (checkpoint_a.parent / METRICS_FILE).read_text() == metrics_a


# --- 2. checkpoints: a bad state falls back whole; LoRA settings are compared -----------------------------------
def test_a_checkpoint_with_a_negative_step_falls_back_to_the_previous_one(train_dataset, small_config):
    config = small_config.replace(save_total_limit=3)
    saved_run(train_dataset, config, step=1)
    broken = saved_run(train_dataset, config, step=2)
    plain = json.loads((broken / HISTORY_FILE).read_text())
    (broken / HISTORY_FILE).write_text(json.dumps({**plain, "step": -100}))
    trainer = make(train_dataset, config.replace(max_steps=1))
    with pytest.warns(UserWarning, match=r"skipped checkpoint-2: .*step -100 is negative"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.step == 1  # from checkpoint-1, already at max_steps: nothing more trained


def test_lora_settings_are_part_of_the_resume_check(train_dataset, small_config):
    config = small_config.replace(max_steps=1)
    saved_run(train_dataset, config, step=1, peft_config=lora_config(r=4, lora_alpha=8))
    with pytest.raises(CheckpointError, match=r"peft_config.lora_alpha: 8 -> 16.*--allow-config-change") as info:
        make(train_dataset, config, lora_config(r=4, lora_alpha=16)).train(resume_from_checkpoint=True)
    assert not isinstance(info.value, RunMismatchError)  # allowed with allow_config_change
    allowed = make(train_dataset, config, lora_config(r=4, lora_alpha=16))
    allowed.train(resume_from_checkpoint=True, allow_config_change=True)
    assert allowed.step == 1

    with pytest.raises(RunMismatchError, match=r"peft_config.r: 4 -> 8.*resume with the checkpoint's values"):
        make(train_dataset, config, lora_config(r=8, lora_alpha=8)).train(resume_from_checkpoint=True)
    with pytest.raises(RunMismatchError, match=r"written by a LoRA run.*pass the same peft_config.*keep them"):
        make(train_dataset, config).train(resume_from_checkpoint=True)


def test_a_full_run_resumed_with_a_peft_config_is_not_told_to_delete_its_checkpoints(train_dataset, small_config):
    config = small_config.replace(max_steps=1)
    saved_run(train_dataset, config, step=1)
    with pytest.raises(RunMismatchError) as info:
        make(train_dataset, config, lora_config()).train(resume_from_checkpoint=True)
    message = str(info.value)
    assert "full fine-tuning" in message and "leave out peft_config" in message and "keep them" in message
    assert "overwrite_output_dir" not in message
    assert (Path(config.output_dir) / "checkpoint-1").is_dir()


# --- metrics.jsonl cut short by a killed run --------------------------------------------------------------------
def test_a_metrics_file_cut_mid_line_reads_with_a_warning(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.75}\n{"step": 3, "rew')
    with pytest.warns(UserWarning, match=r"skipped line 3, cut short \(a run killed while writing it\)"):
        assert load_history(path) == [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.75}]
    path.write_text('{"step": 1}\ngarbage\n{"step": 3}\n')  # damage before the end is not a killed run's
    with pytest.raises(ValueError, match=r"line 2, is not JSON"), warnings.catch_warnings():
        load_history(path)


# --- 3. datasets: TRL's forms accepted, anything else one clear error before the model loads ---------------------
@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the trainer loads a model: the checks must come first."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the datasets were checked")

    monkeypatch.setattr(minigrpo.trainer, "resolve_model_and_tokenizer", forbidden)
    monkeypatch.setattr(minigrpo.models, "load_model_and_tokenizer", forbidden)


@pytest.mark.parametrize(
    "make_data, words",
    [
        (lambda rows: rows, "a list of rows, .*Dataset.from_list\\(rows\\)"),
        (lambda rows: {"prompt": [r["prompt"] for r in rows]}, "a dict of columns, .*Dataset.from_dict\\(columns\\)"),
        (lambda rows: pandas.DataFrame(rows), "a pandas DataFrame, .*Dataset.from_pandas\\(frame"),
    ],
)
def test_a_dataset_in_another_form_is_one_error_saying_how_to_convert(no_model_load, small_config, make_data, words):
    rows = [{"prompt": "What is 1 + 1?", "answer": "2"}] * 4
    with pytest.raises(TypeError, match=f"train_dataset is {words}"):
        GRPOTrainer("tiny", [correctness_reward], small_config, make_data(rows))


def test_an_iterable_dataset_is_read_as_far_as_the_run_draws(train_dataset, small_config):
    config = small_config.replace(max_steps=3)
    rows = as_dataset(train_dataset.to_iterable_dataset(), "train_dataset", config)
    assert rows["prompt"] == train_dataset[:12]["prompt"]  # 3 generations x 4 prompts, in order
    evaluated = as_dataset(train_dataset.to_iterable_dataset(), "eval_dataset")
    assert len(evaluated) == len(train_dataset)
    with pytest.raises(ValueError, match="IterableDataset, which has no length.*give max_steps"):
        as_dataset(train_dataset.to_iterable_dataset(), "train_dataset", config.replace(max_steps=-1))


@pytest.mark.parametrize(
    "prompts, words",
    [
        ([1, 7], "row 0: the prompt is 1 of type int"),
        (["What is 1 + 1?", None], "row 1: the prompt is None of type NoneType"),
        (["", "What is 1 + 1?"], "row 0: the prompt is an empty string"),
    ],
)
def test_a_prompt_that_is_not_text_or_is_empty_names_its_row(tiny, small_config, prompts, words):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=f"train_dataset {words}"):
        GRPOTrainer(model, [correctness_reward], small_config, Dataset.from_dict({"prompt": prompts}),
                    processing_class=tokenizer)  # fmt: skip


# --- 4. the command line: bad flags fail in one line before any model loads ---------------------------------------
@pytest.mark.parametrize(
    "flags, words",
    [
        (["--seed", str(2**64)], "seed=18446744073709551616 (--seed) is out of range"),
        (["--output-dir", ""], "output_dir='' (--output-dir) is empty"),
        (["--logging-dir", "{file}/logs"], "--logging-dir {file}/logs lies inside the file"),
        (["--eval-size", "100000000"], "--eval-size 100000000: accuracy needs"),
        (["--prompts-per-step", "100000000"], "--prompts-per-step 100000000: a step draws from the 2,000 training"),
    ],
)
def test_bad_flags_are_refused_before_the_model_loads(no_model_load, capsys, tmp_path, flags, words):
    file = tmp_path / "a-file"
    file.write_text("")
    flags = [flag.format(file=file) for flag in flags]
    assert main(["train", "--model", "tiny", "--output-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and words.format(file=file) in err[0], err


def test_max_steps_minus_one_is_accepted_and_an_absurd_epoch_count_is_refused(monkeypatch, small_config, tmp_path):
    reached = []

    def stop_at_load(name):
        reached.append(name)
        raise OSError("stop here")

    monkeypatch.setattr(minigrpo.__main__, "load_checked", stop_at_load)
    assert main(["train", "--model", "tiny", "--max-steps", "-1", "--output-dir", str(tmp_path / "run")]) == 2
    assert reached == ["tiny"]  # the flags passed their checks
    with pytest.raises(
        ValueError, match=r"num_train_epochs=1e\+300 means .* lower num_train_epochs, or give max_steps"
    ):
        resolve_max_steps(small_config.replace(max_steps=-1, num_train_epochs=1e300), 256, 1)


# --- 6. model folders -------------------------------------------------------------------------------------------
@pytest.fixture
def adapter_folder(tiny, tmp_path):
    """A LoRA run's saved adapters on the bundled tiny Qwen, and a function that rewrites the base they name."""
    model, tokenizer = tiny
    folder = tmp_path / "final"
    add_adapters(model, lora_config(r=2, lora_alpha=4)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    def name_base(base: str) -> Path:
        config = json.loads((folder / ADAPTER_CONFIG_FILE).read_text())
        (folder / ADAPTER_CONFIG_FILE).write_text(json.dumps({**config, "base_model_name_or_path": base}))
        return folder

    return folder, name_base


def test_an_adapter_folder_naming_itself_or_a_circle_as_its_base_is_a_clear_error(adapter_folder, tmp_path):
    folder, name_base = adapter_folder
    name_base(str(folder))
    with pytest.raises(ValueError, match=r"leads back to an adapter folder already on the way"):
        load_model_and_tokenizer(str(folder), device="cpu")
    other = tmp_path / "other"  # final -> other -> final
    shutil.copytree(folder, other)
    name_base(str(other))
    with pytest.raises(ValueError, match=r"final -> .*other -> .*final"):
        load_model_and_tokenizer(str(folder), device="cpu")


def test_a_moved_base_model_names_the_path_to_fix_and_eval_takes_a_lora_folder(adapter_folder, tmp_path):
    folder, name_base = adapter_folder
    assert minigrpo.__main__.check_model_name(str(folder)) == str(folder)  # `eval --model <LoRA run>/final`
    name_base(str(tmp_path / "moved-away" / "base"))
    with pytest.raises(FileNotFoundError, match=r"names its base model .*moved-away/base .*was moved or deleted"):
        load_model_and_tokenizer(str(folder), device="cpu")
    assert main(["eval", "--model", str(folder)]) == 2  # one line, before anything loads


def test_a_vocabulary_smaller_than_the_tokenizer_or_integer_weights_are_refused(tiny):
    model, tokenizer = tiny
    model.resize_token_embeddings(len(tokenizer) - 3)
    with pytest.raises(ValueError, match=f"Qwen2ForCausalLM: the model's vocabulary has {len(tokenizer) - 3} tokens"):
        resolve_model_and_tokenizer(model, tokenizer)
    model.resize_token_embeddings(len(tokenizer))
    model.model.norm.weight = torch.nn.Parameter(torch.ones(64, dtype=torch.int64), requires_grad=False)
    with pytest.raises(ValueError, match=r"1 weight\(s\) are of type torch.int64 \(e.g. model.norm.weight\)"):
        resolve_model_and_tokenizer(model, tokenizer)


def test_a_chat_template_that_loops_for_hours_is_stopped(tiny, monkeypatch):
    _, tokenizer = tiny
    tokenizer.chat_template = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    monkeypatch.setattr(minigrpo.rollout, "CHAT_TEMPLATE_SECONDS", 0.2)
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"chat template took more than 0.2 s to render prompt 0"):
        render_prompts(tokenizer, [[{"role": "user", "content": "What is 1 + 1?"}]])
    assert time.perf_counter() - started < 5

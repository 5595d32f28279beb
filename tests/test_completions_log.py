"""log_completions=True: every logging step prints the last generation's prompts, completions, per-function rewards
and advantages as a table (the first num_completions_to_print) and appends them all to completions.jsonl."""

import importlib.util
import json
import math

import pytest
import torch

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.advantages import group_relative_advantages
from minigrpo.rewards import completion_text
from minigrpo.rollout import render_prompts
from minigrpo.run import checkpoints, completions_log
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset


def format_reward(completions, **kwargs):
    """0.5 when the completion holds a digit: a second column in the table."""
    return [0.5 if any(c.isdigit() for c in completion_text(completion)) else 0.0 for completion in completions]


def test_a_run_prints_the_table_and_writes_every_completion_with_its_rewards_and_advantage(tmp_path, capsys):
    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                        max_steps=2, max_completion_length=8, learning_rate=1e-5, logging_steps=1,
                        save_strategy="no", eval_strategy="no", bf16=False, seed=0, temperature=1.0,
                        log_completions=True, num_completions_to_print=3)  # fmt: skip
    trainer = GRPOTrainer("tiny", [correctness_reward, format_reward], config, make_arithmetic_dataset(8, "train"))
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1] * 8 + [2] * 8  # every completion of each logged generation
    assert list(rows[0]) == ["step", "prompt", "completion", "correctness_reward", "format_reward", "advantage"]
    last = rows[8:]
    assert [row["completion"] for row in last] == trainer.step_samples["completion"]
    for row in last:  # each completion's own score
        assert row["format_reward"] == format_reward([row["completion"]])[0]
    mean_correct = trainer.state.log_history[1]["rewards/correctness_reward/mean"]
    assert sum(row["correctness_reward"] for row in last) / 8 == pytest.approx(mean_correct)
    # the advantages are the group-relative ones of the weighted total reward, group by group
    totals = torch.tensor([row["correctness_reward"] + row["format_reward"] for row in last])
    expected = group_relative_advantages(totals.view(2, 4), "group", "mean", 1, config.advantage_epsilon).flatten()
    assert [row["advantage"] for row in last] == pytest.approx(expected.tolist(), abs=1e-6)
    assert all(row["prompt"] == last[0]["prompt"] for row in last[:4])  # the first rows are one whole group

    printed = capsys.readouterr().out
    assert printed.count("Step 1") == 1 and printed.count("Step 2") == 1
    if importlib.util.find_spec("rich"):  # rich's table (a dependency of transformers 5), as TRL prints it
        assert printed.count("├") == 2 * 2  # 3 rows each (num_completions_to_print): 2 lines between them
    else:  # the plain-text table (transformers 4 brings no rich): a line a row
        assert sum(line.startswith("user: ") for line in printed.splitlines()) == 2 * 3
    assert "advantage" in printed and last[0]["completion"][:10] in printed


def test_the_plain_text_table_when_rich_is_not_installed(monkeypatch, capsys):
    rows = completions_log.completion_rows(
        7,
        {"prompt": [[{"role": "user", "content": "2+2?"}]] * 2, "completion": ["<answer>4</answer>", "five"],
         "rewards": {"correctness_reward": [1.0, 0.0]}, "advantage": [0.70710678, -0.70710678],
         "extra": {"source": ["a", "b"], "wrong_length": ["x"]}},
    )  # fmt: skip
    assert rows[1] == {"step": 7, "prompt": [{"role": "user", "content": "2+2?"}], "completion": "five",
                       "correctness_reward": 0.0, "advantage": -0.70710678, "source": "b"}  # fmt: skip
    monkeypatch.setattr(completions_log.importlib.util, "find_spec", lambda name: None)
    completions_log.print_table(rows, 7, num_to_print=1)
    assert capsys.readouterr().out.splitlines() == [
        "Step 7",
        "prompt      completion          correctness_reward  advantage  source",
        "user: 2+2?  <answer>4</answer>  1.00                0.71       a",
    ]


def test_a_long_text_is_cut_and_a_nan_reward_is_written_as_null(tmp_path):
    long = "x" * 100
    rows = completions_log.completion_rows(1, {"prompt": ["p"], "completion": [long], "rewards": {"r": [math.nan]}})
    table = completions_log.plain_table(rows, 1).splitlines()
    assert table[2].split()[1] == "x" * 57 + "..."
    checkpoints.append_jsonl(tmp_path / "c.jsonl", rows)
    checkpoints.append_jsonl(tmp_path / "c.jsonl", [{**rows[0], "step": 2}])
    assert json.loads((tmp_path / "c.jsonl").read_text().splitlines()[0])["r"] is None
    completions_log.keep_steps_up_to(tmp_path / "c.jsonl", 1)  # a resume at step 1 drops step 2's rows
    assert [json.loads(line)["step"] for line in (tmp_path / "c.jsonl").read_text().splitlines()] == [1]


def test_num_completions_to_print_must_print_something():
    with pytest.raises(ValueError, match="num_completions_to_print=0: print 1 or more"):
        GRPOConfig(log_completions=True, num_completions_to_print=0)


# --- under dynamic sampling: the logged rows are the rows the update trained on ----------------------------------
def counting_reward(completions, drop, prompt_id, log_extra, **kwargs):
    """0 for every completion of a prompt marked `drop` (a group of equal rewards: dynamic sampling drops it); the
    row's place in the call otherwise (never all equal). Logs each row's prompt_id as a log_extra column."""
    log_extra("prompt_id", list(prompt_id))
    return [0.0 if dropped else float(i) for i, dropped in enumerate(drop)]


class RecordingTrainer(GRPOTrainer):
    """Keeps the rollout and rewards each update trains on, to hold the completions log against them."""

    def update(self, rollout, rewards):
        self.trained.append((rollout, rewards.tolist()))
        return super().update(rollout, rewards)


@pytest.mark.parametrize("drop_every", [None, 2], ids=["no-group-dropped", "groups-dropped"])
def test_under_dynamic_sampling_each_logged_row_is_the_kept_rollout_row(tmp_path, drop_every):
    dataset = make_arithmetic_dataset(8, "train")
    dataset = dataset.add_column("prompt_id", list(range(8)))
    dataset = dataset.add_column("drop", [drop_every is not None and i % drop_every == 0 for i in range(8)])
    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                        max_steps=3, max_completion_length=8, learning_rate=1e-5, logging_steps=1,
                        save_strategy="no", eval_strategy="no", bf16=False, seed=0, log_completions=True,
                        dynamic_sampling=True, max_num_gen_batches=3)  # fmt: skip
    trainer = RecordingTrainer("tiny", [counting_reward], config, dataset)
    trainer.trained = []
    trainer.train()

    history = trainer.state.log_history
    dropped = sum(row["dynamic_sampling/groups_generated"] - row["dynamic_sampling/groups_kept"] for row in history)
    assert (dropped > 0) == (drop_every is not None)
    logged = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    tokenizer = trainer.tokenizer
    for step, (rollout, rewards) in enumerate(trainer.trained, start=1):
        rows = [row for row in logged if row["step"] == step]
        assert len(rows) == len(rollout.completions) == len(rewards)
        for i, row in enumerate(rows):
            assert row["completion"] == rollout.completions[i]
            assert row["counting_reward"] == rewards[i]
            prompt_tokens = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()]
            assert render_prompts(tokenizer, [row["prompt"]])[0] == tokenizer.decode(prompt_tokens)
            assert dataset[row["prompt_id"]]["prompt"] == row["prompt"]  # the log_extra column, row for row
            assert not dataset[row["prompt_id"]]["drop"]  # no dropped group is logged

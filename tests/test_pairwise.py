"""Every option of a run with every other: a covering array of the options (tests/pairwise_runs.py), each row a tiny
two-generation run that must train to max_steps with finite metrics and the logs its options ask for. The pairs the
trainer refuses are refused at construction, with a message that names both options. Two rows run under torchrun on
two processes too.

Options tested one at a time broke together before: log_completions with dynamic_sampling logged the wrong rows, and
crashed when a group was dropped.
"""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pairwise_runs
import pytest
from pairwise_runs import OPTIONS, REFUSED_PAIRS, covering_rows, non_finite_metrics, refused, run_row

ROOT = Path(__file__).resolve().parents[1]
ROWS = covering_rows()
TORCHRUN_TIMEOUT = 240  # seconds; a hang fails the test instead of the suite


def row_id(row: dict) -> str:
    """The options a row sets away from their first value, e.g. 'loss_type=dapo,beta=0.04,lora'."""
    changed = [name for name, value in row.items() if value != OPTIONS[name][0]]
    return ",".join(name if row[name] is True else f"{name}={row[name]}" for name in changed) or "first-values"


def test_the_rows_cover_every_pair_of_values_that_is_not_refused():
    for (a, values_a), (b, values_b) in itertools.combinations(OPTIONS.items(), 2):
        for value_a, value_b in itertools.product(values_a, values_b):
            covered = any(row[a] == value_a and row[b] == value_b for row in ROWS)
            assert covered != refused({a: value_a, b: value_b}), f"{a}={value_a!r} with {b}={value_b!r}"
    assert len(ROWS) <= 20  # pairs, not the 2**12 * 48 combinations


def check_run(row: dict, result: dict, num_processes: int = 1) -> None:
    """What a row's run must show: every step taken, finite metrics, and the logs its options ask for."""
    assert "refused" not in result, f"{row_id(row)} was refused: {result.get('refused')}"
    assert result["steps"] == result["max_steps"]
    history = result["history"]
    assert not non_finite_metrics(history)
    assert history[-1]["step"] == result["max_steps"] and "eval_accuracy" in history[-1]
    assert ("eval_loss" in history[-1]) == (row["num_generations_eval"] is not None)
    if row["dynamic_sampling"]:
        assert all("dynamic_sampling/groups_kept" in h for h in history if "loss" in h)
    assert all(("tools/call_frequency" in h) == row["tools"] for h in history if "loss" in h)
    logged = result["completions"]
    assert bool(logged) == row["log_completions"]
    for step in {r["step"] for r in logged}:
        rows = [r for r in logged if r["step"] == step]
        drop = [r["prompt_id"] % 2 == 0 for r in rows]  # pairwise_runs.dataset: every other prompt is dropped
        if row["dynamic_sampling"]:  # only the kept groups, the rows the update trained on
            assert not any(drop)
        else:  # the whole generation: B = 2 x steps_per_generation prompts per process, G = 2
            assert len(rows) == 4 * row["steps_per_generation"] * num_processes
        assert all(r["counting_reward"] == 0.0 for r, dropped in zip(rows, drop, strict=True) if dropped)


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_each_row_trains_to_the_end_with_finite_metrics(row, tmp_path):
    result = run_row(row, tmp_path)
    check_run(row, result)
    if row["report_to"] == "tensorboard":
        assert list((tmp_path / "logs").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("pair", REFUSED_PAIRS, ids=lambda pair: ",".join(f"{k}={v}" for k, v in pair.items()))
def test_a_refused_pair_is_refused_at_construction_naming_both_options(pair, tmp_path):
    result = run_row({**ROWS[0], **pair}, tmp_path)
    assert "refused" in result
    for name in pair:
        assert name in result["refused"]


def torchrun_rows() -> list[dict]:
    """Two rows for torchrun: of those without dynamic sampling (which torchrun refuses: each process would refill
    its own groups, tests/test_dynamic_sampling.py), the two that set the most options away from their first value."""
    candidates = [row for row in ROWS if not row["dynamic_sampling"]]
    return sorted(candidates, key=lambda row: -len(row_id(row).split(",")))[:2]


def test_two_rows_train_under_torchrun_on_two_processes(tmp_path):
    rows = torchrun_rows()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    command += [pairwise_runs.__file__, str(tmp_path), json.dumps(rows)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results = json.loads((tmp_path / "rank0.json").read_text())
    for row, result in zip(rows, results, strict=True):
        check_run(row, result, num_processes=2)
    other_rank = json.loads((tmp_path / "rank1.json").read_text())
    assert [r["history"] for r in other_rank] == [r["history"] for r in results]  # the logged means over processes

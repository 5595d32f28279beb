"""Data-parallel GRPO on the CPU with gloo: 2 processes make the update 1 process makes.

Three launches of tests/distributed_worker.py (each start costs more than its training, so each runs several
short runs): plain `python`, as `python -m minigrpo train` runs, then torchrun with one process and with two.
Every run is 3 steps of 4 prompts x G=4 on the tiny Qwen. The 2-process launch ends with a run whose reward
function raises on rank 1, so it exits with an error; the runs before it have written their weights.
"""

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minigrpo import GRPOConfig, load_model_and_tokenizer
from minigrpo.rollout import generate_completions, repeat_for_group, tokenize_prompts
from minigrpo.run import distributed
from minigrpo.tasks.arithmetic import make_arithmetic_dataset

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240  # seconds per torchrun launch; a hang fails the test instead of the suite
LOSS_TYPES = ("grpo", "dapo", "bnpo", "dr_grpo")
TOLERANCE = 1e-5


def launch(nproc: int | None, out: Path, runs: list[dict], launcher: str = "torchrun") -> dict:
    """torchrun --nproc-per-node nproc tests/distributed_worker.py (nproc None: plain python, no torchrun; launcher
    "accelerate": accelerate launch --multi_gpu --num_processes nproc, which on a CPU is torchrun's launcher too);
    returns rc, output and seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable]
    if launcher == "accelerate":
        command += ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(nproc)]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # no config file
    elif nproc is not None:
        command += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone"]
    command += [str(ROOT / "tests" / "distributed_worker.py"), str(out), json.dumps(runs)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
        result = {"rc": done.returncode, "output": done.stdout + done.stderr}
    except subprocess.TimeoutExpired as expired:
        result = {"rc": None, "output": f"timed out after {LAUNCH_TIMEOUT}s: {expired.stderr}"}
    return {**result, "seconds": time.perf_counter() - started, "out": out}


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory):
    return launch(None, tmp_path_factory.mktemp("python"), [{"name": "grpo", "config": {"loss_type": "grpo"}}])


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    runs = [{"name": loss, "config": {"loss_type": loss}} for loss in LOSS_TYPES]
    return launch(1, tmp_path_factory.mktemp("k1"), runs + [EVAL_LOSS])


# One step, then evaluation with eval_loss (num_generations_eval: a sampled group per held-out prompt)
EVAL_LOSS = {"name": "eval", "config": {"max_steps": 1, "num_generations_eval": 4, "beta": 0.04}, "eval": True}


# A run that reports to TensorBoard, where it is installed (the test extra has it; Colab's pinned leg may not)
REPORT = {"name": "report", "config": {"max_steps": 1, "report_to": "tensorboard", "log_completions": True}}
REPORT_RUN = [REPORT] if importlib.util.find_spec("tensorboard") else []


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    runs = [{"name": loss, "config": {"loss_type": loss}} for loss in LOSS_TYPES]
    runs += [
        {"name": "resume", "config": {"max_steps": 2}},  # stops after step 2 with checkpoint-2 ...
        {"name": "resume", "resume": True},  # ... that a new trainer on every rank resumes to step 3
        {"name": "fsdp", "config": {"fsdp": True}},
        {"name": "fsdp-resume", "config": {"fsdp": True, "max_steps": 2}},
        {"name": "fsdp-resume", "config": {"fsdp": True}, "resume": True},
        *REPORT_RUN,
        EVAL_LOSS,
        {"name": "mismatch", "config_by_rank": {"1": {"max_steps": 5, "learning_rate": 1e-4}}, "expect_error": True},
        {"name": "fail", "fail_on_rank": 1},  # last: it ends the launch
    ]
    return launch(2, tmp_path_factory.mktemp("k2"), runs)


@pytest.fixture(scope="module")
def accelerate_two_processes(tmp_path_factory):
    pytest.importorskip("accelerate")
    runs = [{"name": "grpo", "config": {"loss_type": "grpo"}}]
    return launch(2, tmp_path_factory.mktemp("accelerate"), runs, launcher="accelerate")


def result(launched: dict, name: str, rank: int = 0) -> dict:
    path = launched["out"] / f"{name}.rank{rank}.pt"
    assert path.exists(), f"{path.name} missing; the launch said:\n{launched['output'][-3000:]}"
    return torch.load(path, weights_only=False)


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_two_processes_give_the_weights_of_one(one_process, two_processes, loss_type):
    single, rank0, rank1 = (result(one_process, loss_type), *(result(two_processes, loss_type, r) for r in (0, 1)))
    start = load_model_and_tokenizer("tiny", device="cpu")[0].state_dict()
    assert max_difference(single["weights"], start) > 1e-4  # the runs did train
    assert max_difference(rank0["weights"], rank1["weights"]) == 0.0  # DDP keeps the ranks identical
    assert max_difference(single["weights"], rank0["weights"]) < TOLERANCE
    for one, two in zip(single["history"], rank0["history"], strict=True):  # the step's metrics, reduced over ranks
        for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "loss", "grad_norm"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
        assert two["completions/min_length"] == one["completions/min_length"]
        assert two["completions/max_length"] == one["completions/max_length"]


def test_plain_python_and_torchrun_with_one_or_two_processes_train_the_same_weights(
    plain_python, one_process, two_processes
):
    # one sampling path: every group is sampled from its own seed (seed, step, group), with or without torchrun
    plain, single, pair = (result(launched, "grpo") for launched in (plain_python, one_process, two_processes))
    assert [h["step"] for h in plain["history"]] == [1, 2, 3]
    assert max_difference(plain["weights"], single["weights"]) < TOLERANCE
    assert max_difference(plain["weights"], pair["weights"]) < TOLERANCE
    assert [h["reward"] for h in plain["history"]] == pytest.approx([h["reward"] for h in pair["history"]], abs=1e-6)


def test_accelerate_launch_trains_exactly_as_torchrun(accelerate_two_processes, two_processes):
    # TRL's launcher: the same script, the same two processes (accelerate launch hands them to torchrun's launcher)
    torchrun = result(two_processes, "grpo")
    for rank in (0, 1):
        launched = result(accelerate_two_processes, "grpo", rank)
        assert max_difference(launched["weights"], torchrun["weights"]) == 0.0
        assert [h["loss"] for h in launched["history"]] == [h["loss"] for h in torchrun["history"]]


def test_only_the_main_process_reports_and_log_completions_gathers_every_process(two_processes):
    pytest.importorskip("tensorboard")
    result(two_processes, "report", 1)  # both ranks finished the run
    run_dir = two_processes["out"] / "report"
    assert len(list(run_dir.glob("runs/*/events.out.tfevents.*"))) == 1  # rank 0's writer only
    rows = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and {row["step"] for row in rows} == {1}  # 4 prompts x G=4: both ranks' 8, once
    assert [row["prompt"] for row in rows[::4]] != [rows[0]["prompt"]] * 4  # 4 groups, each with its own prompt


def test_every_process_reports_the_eval_loss_of_one(one_process, two_processes):
    def eval_loss(launched, rank=0):
        (row,) = [row for row in result(launched, "eval", rank)["history"] if "eval_loss" in row]
        return row["eval_loss"]

    alone = eval_loss(one_process)
    assert alone > 0  # beta * KL after a step away from the reference
    assert eval_loss(two_processes, 0) == eval_loss(two_processes, 1) == pytest.approx(alone, rel=1e-4)


def test_resume_under_two_processes_continues_exactly(two_processes):
    straight = result(two_processes, "grpo")
    for rank in (0, 1):  # every rank restored weights and AdamW's moments: both equal the run that never stopped
        resumed = result(two_processes, "resume", rank)
        assert max_difference(straight["weights"], resumed["weights"]) == 0.0
        assert [h["step"] for h in resumed["history"]] == [1, 2, 3]
        assert resumed["history"][-1]["loss"] == straight["history"][-1]["loss"]


def test_fsdp2_shards_give_the_weights_of_one_process(one_process, two_processes):
    single = result(one_process, "grpo")
    for rank in (0, 1):
        assert max_difference(single["weights"], result(two_processes, "fsdp", rank)["weights"]) < TOLERANCE
        resumed = result(two_processes, "fsdp-resume", rank)  # gathered checkpoint, loaded back into shards
        assert max_difference(result(two_processes, "fsdp", rank)["weights"], resumed["weights"]) == 0.0


def test_a_rank_that_raises_stops_every_rank_with_its_error(two_processes):
    assert two_processes["rc"] is not None, two_processes["output"]  # it ended within the timeout, no hang
    assert two_processes["rc"] != 0
    output = two_processes["output"]
    assert "ValueError: reward exploded on rank 1" in output  # rank 1's own error
    assert "RankFailedError: rank 1 failed in the rollout, so rank 0 stops too" in output  # rank 0 learned it
    # Both stopped at the start of step 2, together, so the state after step 1 was saved for resuming.
    assert (two_processes["out"] / "fail" / "checkpoint-1" / "trainer_state.pt").exists()


# --- the pieces, in one process ------------------------------------------------------------------
def test_ranks_started_with_different_configs_all_stop_with_one_clear_error(two_processes):
    """Not gloo's "Connection closed by peer" (another max_steps) or diverging replicas (another learning rate)."""
    errors = [result(two_processes, "mismatch", rank)["error"] for rank in (0, 1)]
    assert errors[0] == errors[1]
    assert "the 2 processes were started with different settings" in errors[0]
    assert "learning_rate: rank 0 0.0003, rank 1 0.0001" in errors[0] and "max_steps: rank 0 3, rank 1 5" in errors[0]


def test_group_seeded_sampling_does_not_depend_on_the_other_groups_in_the_batch():
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    config = GRPOConfig.tiny_cpu(num_generations=4, per_device_train_batch_size=4)
    prompts = list(make_arithmetic_dataset(n=3, split="train", seed=3)["prompt"])
    seeds = distributed.group_seeds(0, 7, range(3))

    def sample(group_indices):
        group_prompts = repeat_for_group([prompts[b] for b in group_indices], 4)
        ids, mask = tokenize_prompts(tokenizer, group_prompts, config.max_prompt_length, "cpu")
        completions = generate_completions(
            model, tokenizer, ids, mask, config, num_generations=4, group_seeds=[seeds[b] for b in group_indices]
        )
        return [row[row != tokenizer.pad_token_id].tolist() for row in completions]  # (G * groups) token lists

    together = sample([0, 1, 2])
    assert sample([2]) == together[8:12]  # group 2 alone: the same 4 completions as in the batch of 3
    assert sample([1, 2]) == together[4:12]
    assert len({tuple(c) for c in together}) > 3  # it samples: the completions are not all alike


def test_group_seeds_depend_on_seed_step_and_group_only():
    assert distributed.group_seeds(0, 3, [5]) == distributed.group_seeds(0, 3, range(4, 6))[1:]
    seeds = {s for step in range(20) for s in distributed.group_seeds(0, step, range(50))}
    assert len(seeds) == 1000 and all(0 <= s < 2**63 for s in seeds)  # distinct, valid for Generator.manual_seed
    assert distributed.group_seeds(1, 0, [0]) != distributed.group_seeds(0, 0, [0])


def test_outside_torchrun_everything_is_one_process():
    assert not distributed.is_distributed() and distributed.world_size() == 1 and distributed.is_main_process()
    # every group, with the seeds torchrun's ranks would give it
    assert distributed.local_groups([4, 1, 7], seed=0, step=0) == ([4, 1, 7], distributed.group_seeds(0, 0, range(3)))
    assert distributed.local_groups([4, 1], seed=0, step=0, first_group=3)[1] == distributed.group_seeds(0, 0, [3, 4])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert distributed.step_token_count(mask) == 3.0
    assert distributed.map_shards(lambda part: [x * 2 for x in part], [1, 2, 3]) == [2, 4, 6]
    metrics = {"reward": 0.5, "completions/min_length": 3.0}
    assert distributed.reduce_metrics(metrics) == metrics


def test_buffer_sync_is_turned_off_in_the_spelling_this_torch_accepts(monkeypatch):
    accepted = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    ((name, value),) = distributed.no_buffer_sync().items()
    assert name in accepted and value is False
    assert name == ("forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers")

    def older_ddp(self, module, device_ids=None, broadcast_buffers=True):  # torch 2.11's: no forward_sync_buffers
        pass

    def newer_ddp(self, module, device_ids=None, broadcast_buffers=None, forward_sync_buffers=None):  # torch 2.13's
        pass

    monkeypatch.setattr(torch.nn.parallel.DistributedDataParallel, "__init__", older_ddp)
    assert distributed.no_buffer_sync() == {"broadcast_buffers": False}
    monkeypatch.setattr(torch.nn.parallel.DistributedDataParallel, "__init__", newer_ddp)
    assert distributed.no_buffer_sync() == {"forward_sync_buffers": False}


def test_metrics_combine_by_their_meaning():
    reduce = distributed._reduction
    assert reduce("completions/min_length")([3.0, 5.0]) == 3.0
    assert reduce("completions/max_length")([3.0, 5.0]) == 5.0
    assert reduce("step_time")([1.0, 2.0]) == 2.0 and reduce("time/rollout")([1.0, 2.0]) == 2.0
    assert reduce("reward")([0.25, 0.75]) == 0.5 and reduce("completions/mean_length")([2.0, 4.0]) == 3.0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(prompts_per_step=3, num_generations=4, per_device_train_batch_size=4), "prompts_per_step=3 cannot be"),
        (dict(prompts_per_step=4, num_generations=4, per_device_train_batch_size=4), None),
        (dict(prompts_per_step=12, num_generations=2, per_device_train_batch_size=8), "N/K = 12 completions"),
    ],
)
def test_batch_that_does_not_split_over_ranks_is_a_clear_error(monkeypatch, changes, message):
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    config = GRPOConfig.tiny_cpu(**changes)
    if message is None:
        distributed.check_config(config)  # 16 completions -> 8 per rank -> micro-batches of 4: fine
        return
    with pytest.raises(ValueError, match=message):
        distributed.check_config(config)

"""Every script in bench/ in its fast mode, as docs/performance.md shows it: it exits 0 and its last line is one JSON
object with exactly the keys docs/performance.md lists for it. A benchmark that nothing runs breaks silently when the
package moves."""

import ast
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ("minigrpo", "trl")
NEEDS = {
    "vs_trl.py": ("trl",),
    "time_to_accuracy.py": ("trl",),
    "scaling.py": ("trl",),
    "gpu_check.py": ("trl", "dashscope"),
}
"""The modules a script's fast mode needs beyond the core: trl (the bench extra), dashscope (the test extra)."""


def readme_rows() -> dict[str, tuple[list[str], set[str]]]:
    """{script name: (fast-mode arguments, documented keys)} from the table of bench scripts in docs/performance.md."""
    readme = (ROOT / "docs" / "performance.md").read_text()
    rows = {}
    for script, fast, keys in re.findall(r"^\| `bench/(\w+\.py)` \| `([^`]+)` \| (.+) \|$", readme, re.M):
        names = set()
        for key in re.findall(r"`([^`]+)`", keys):
            if key.startswith("<trainer>_"):
                names |= {key.replace("<trainer>", trainer) for trainer in TRAINERS}
            else:
                names.add(key)
        rows[script] = (fast.split(), names)
    return rows


def test_every_bench_script_is_in_the_readme_table():
    assert set(readme_rows()) == {path.name for path in (ROOT / "bench").glob("*.py")}


def check_vs_trl(summary: dict, stdout: str) -> None:
    assert summary["max_loss_diff"] <= 1e-5 and summary["max_advantage_diff"] <= 1e-5  # the cross-check agrees
    for trainer in TRAINERS:
        assert len(summary[f"{trainer}_step_times"]) == 2
        assert summary[f"{trainer}_tokens_per_step"] > 0 and summary[f"{trainer}_peak_memory_mib"] > 0
    assert "TRL's prompt token ids equal minigrpo's: True" in stdout


def check_time_to_accuracy(summary: dict, stdout: str) -> None:
    threshold, problems = summary["threshold"], summary["eval_problems"]
    assert summary["seeds"] == [0] and summary["eval_every"] == 1
    for trainer in TRAINERS:
        (curve,) = summary[f"{trainer}_curves"]  # one seed
        assert [point["step"] for point in curve] == list(range(1, summary["steps"] + 1))  # evaluated after every step
        for clock in ("time", "cpu_time"):  # training time only, so it grows with every step
            times = [point[clock] for point in curve]
            assert times[0] > 0 and all(earlier < later for earlier, later in zip(times[:-1], times[1:], strict=True))
        for accuracy in summary[f"{trainer}_initial_accuracy"] + [point["accuracy"] for point in curve]:
            right = accuracy * problems  # a share of the held-out problems: a whole number of them right
            assert 0.0 <= accuracy <= 1.0 and abs(right - round(right)) < 1e-4
        assert summary[f"{trainer}_final_accuracy"] == [curve[-1]["accuracy"]]
        first = next((point for point in curve if point["accuracy"] >= threshold), None)
        expected = [None] * 3 if first is None else [first["time"], first["cpu_time"], first["step"]]
        figures = ("time_to_threshold", "cpu_time_to_threshold", "steps_to_threshold")
        assert [summary[f"{trainer}_{figure}"][0] for figure in figures] == expected
    # the same weights and the same greedy evaluation on the same problems: the same accuracy before training
    assert summary["minigrpo_initial_accuracy"] == summary["trl_initial_accuracy"]
    for ratio, figure in (("time_ratio", "time_to_threshold"), ("cpu_time_ratio", "cpu_time_to_threshold")):
        ours, theirs = summary[f"minigrpo_{figure}"][0], summary[f"trl_{figure}"][0]
        expected = None if ours is None or theirs is None else ours / theirs
        assert summary[ratio] == [expected] and summary[f"median_{ratio}"] == expected
    assert f"time to {threshold:g} (s)" in stdout and "median minigrpo / TRL" in stdout  # the table


def check_gpu_check(summary: dict, stdout: str) -> None:
    assert summary["dry_run"] is True and summary["failed"] == []
    assert summary["minigrpo_seconds_per_step"] > 0 and summary["trl_seconds_per_step"] > 0
    assert summary["fast_path_equal"] is True
    assert "151643 BPE ranks" in stdout  # the real Qwen2.5 tokenizer the GPU run needs is buildable offline


def check_memory(summary: dict, stdout: str) -> None:
    assert summary["completion_length"] == 24  # forced to the tiny preset's max_completion_length
    assert summary["weights_bytes"] > 0 and summary["activations_bytes"] > 0
    parts = summary["weights_bytes"] + summary["gradients_bytes"] + summary["optimizer_state_bytes"]
    assert summary["peak_bytes"] >= parts


def check_ppo_vs_grpo(summary: dict, stdout: str) -> None:
    assert summary["seeds"] == 2
    low, high = summary["grpo_accuracy_ci"]
    assert 0.0 <= summary["grpo_accuracy"] <= 1.0 and low <= high


def check_pass_at_k(summary: dict, stdout: str) -> None:
    assert summary["ks"] == [1, 2, 4] and (summary["problems"], summary["samples"]) == (2, 4)
    assert summary["before"] == summary["after"]  # --quick: the same model twice, the same seeded samples
    for pass_k, maj_k in zip(summary["before"]["pass@k"], summary["before"]["maj@k"], strict=True):
        assert 0.0 <= maj_k <= pass_k <= 1.0  # a right majority needs a right sample


def check_profile_step(summary: dict, stdout: str) -> None:
    phases = summary["phase_seconds"]
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["sampling"] > 0 and phases["update: backward"] > 0
    parts = sum(seconds for name, seconds in phases.items() if name != "step")
    assert abs(parts - phases["step"]) < 1e-6 * max(1, len(phases))  # --quick times one step: the parts add up
    assert all(0 < fraction < 1 for fraction in summary["operator_fraction"].values())


def check_scaling(summary: dict, stdout: str) -> None:
    assert (summary["generations"], summary["completion_lengths"]) == ([2, 4], [4, 8])
    cells = summary["cells"]
    assert [(c["generations"], c["max_completion_length"]) for c in cells] == [(2, 4), (2, 8), (4, 4), (4, 8)]
    for cell in cells:
        for trainer in TRAINERS:
            assert cell[f"{trainer}_step_time"] > 0 and cell[f"{trainer}_cpu_time"] > 0
            assert cell[f"{trainer}_mean_length"] == cell["max_completion_length"]  # no completion stopped early
        assert math.isclose(cell["step_time_ratio"], cell["minigrpo_step_time"] / cell["trl_step_time"], rel_tol=1e-12)
        assert math.isclose(cell["cpu_time_ratio"], cell["minigrpo_cpu_time"] / cell["trl_cpu_time"], rel_tol=1e-12)
    # the exponents are the least-squares fit log t = c + a log G + b log T over the cells
    sizes = np.array([[1.0, math.log(c["generations"]), math.log(c["max_completion_length"])] for c in cells])
    for trainer in TRAINERS:
        for figure, suffix in (("step_time", ""), ("cpu_time", "_cpu")):
            fit = np.linalg.lstsq(sizes, np.log([c[f"{trainer}_{figure}"] for c in cells]), rcond=None)[0]
            a, b = summary[f"{trainer}_g_exponent{suffix}"], summary[f"{trainer}_length_exponent{suffix}"]
            assert math.isfinite(a) and math.isfinite(b)
            assert np.allclose([a, b], fit[1:], rtol=1e-9, atol=1e-12)
    assert "minigrpo / TRL step time, wall (CPU)" in stdout and "growth exponents" in stdout


def check_rft_vs_grpo(summary: dict, stdout: str) -> None:
    assert summary["seeds"] == [0, 1] and summary["ks"] == [1, 2, 4]
    for algorithm in ("before", "rft", "grpo"):
        entry = summary["algorithms"][algorithm]
        for interval in [entry["greedy"], *entry["pass@k"], *entry["maj@k"]]:
            assert 0 <= interval["low"] <= interval["mean"] <= interval["high"] <= 1, (algorithm, interval)
        assert entry["pass@k"][0]["mean"] <= entry["pass@k"][-1]["mean"]  # pass@k grows with k
    assert 0 <= summary["algorithms"]["rft"]["kept_fraction"] <= 1 and summary["algorithms"]["grpo"]["step_seconds"] > 0
    assert "RFT - GRPO" in stdout


def check_calculator_tools(summary: dict, stdout: str) -> None:
    assert summary["seeds"] == [0] and summary["steps"] == 1
    for arm in ("calculator", "control"):
        for key, value in summary[arm].items():
            if key not in ("train_seconds", "gain", "after_accuracy_per_seed"):
                assert 0 <= value <= 1, (arm, key, value)
        assert summary[arm]["gain"] == summary[arm]["after_accuracy"] - summary[arm]["before_accuracy"]
    assert summary["control"]["before_accuracy"] == 0.0  # its calculator is off, and guesses are never right here
    assert summary["gain_over_control"] == summary["calculator"]["gain"] - summary["control"]["gain"]
    assert "beyond the control's" in stdout


CHECKS = {"vs_trl.py": check_vs_trl, "gpu_check.py": check_gpu_check, "memory.py": check_memory,
          "ppo_vs_grpo.py": check_ppo_vs_grpo, "pass_at_k.py": check_pass_at_k,
          "profile_step.py": check_profile_step, "time_to_accuracy.py": check_time_to_accuracy,
          "scaling.py": check_scaling, "rft_vs_grpo.py": check_rft_vs_grpo,
          "calculator_tools.py": check_calculator_tools}  # fmt: skip


@pytest.mark.parametrize("script", sorted(CHECKS))
def test_fast_mode_ends_with_the_documented_json(script, tmp_path):
    for module in NEEDS.get(script, ()):
        pytest.importorskip(module, reason="bench / test extra")
    arguments, keys = readme_rows()[script]
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *arguments],
        capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(summary) == keys, (sorted(set(summary) - keys), sorted(keys - set(summary)))
    CHECKS[script](summary, done.stdout)


TRL_INTERNALS = {"_generate_and_score_completions", "_tokenize_prompts"}
"""TRL's private methods the benches wrap to time TRL's rollout, or call to check its prompt tokens."""


@pytest.mark.parametrize("script", sorted(CHECKS))
def test_benches_use_no_private_name_of_minigrpo(script):
    tree = ast.parse((ROOT / "bench" / script).read_text())
    private = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr.startswith("_")}
    assert {name for name in private if not name.startswith("__")} <= TRL_INTERNALS
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names]
    assert not [name for name in imported if name.startswith("_")]


def load_bench_script(name: str):
    """bench/<name>.py as a module (bench/ is not a package); the environment it sets at import is put back."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(os.environ):
        spec.loader.exec_module(module)
    return module


def test_time_to_accuracy_summary_on_hand_made_curves():
    """The first evaluation at or above the threshold (equal counts), None where no evaluation reaches it, the final
    accuracy is the last evaluation's (not the best), and ratios only for the seeds where both trainers got there."""
    bench = load_bench_script("time_to_accuracy")

    def run(*points):  # (step, wall s, CPU s, accuracy) per evaluation
        names = ("step", "time", "cpu_time", "accuracy")
        return {"initial_accuracy": 0.4, "curve": [dict(zip(names, point, strict=True)) for point in points]}

    seed_0 = {
        "minigrpo": run((10, 5.0, 4.0, 0.6), (20, 10.0, 8.0, 0.7), (30, 15.0, 12.0, 0.65)),
        "trl": run((10, 20.0, 10.0, 0.75), (20, 40.0, 20.0, 0.8), (30, 60.0, 30.0, 0.9)),
    }
    seed_1 = {
        "minigrpo": run((10, 6.0, 5.0, 0.71), (20, 12.0, 10.0, 0.8)),
        "trl": run((10, 21.0, 11.0, 0.5), (20, 42.0, 22.0, 0.69)),
    }
    summary = bench.summarize([seed_0, seed_1], threshold=0.7)
    assert summary["minigrpo_time_to_threshold"] == [10.0, 6.0]
    assert summary["minigrpo_cpu_time_to_threshold"] == [8.0, 5.0]
    assert summary["minigrpo_steps_to_threshold"] == [20, 10]
    assert summary["trl_time_to_threshold"] == [20.0, None] and summary["trl_steps_to_threshold"] == [10, None]
    assert summary["minigrpo_final_accuracy"] == [0.65, 0.8] and summary["trl_final_accuracy"] == [0.9, 0.69]
    assert summary["trl_initial_accuracy"] == [0.4, 0.4]
    assert summary["time_ratio"] == [0.5, None] and summary["median_time_ratio"] == 0.5
    assert summary["cpu_time_ratio"] == [0.8, None] and summary["median_cpu_time_ratio"] == 0.8
    nobody = bench.summarize([seed_1], threshold=0.95)
    assert nobody["minigrpo_time_to_threshold"] == [None] and nobody["median_time_ratio"] is None

"""bench/gpu_check.py on a CPU: the dry run prints the plan and finds every import the GPU run needs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_dry_run_prints_the_plan():
    pytest.importorskip("trl", reason="bench extra")
    pytest.importorskip("dashscope", reason="test extra")
    result = run("--dry-run")
    assert result.returncode == 0, result.stderr
    for check in ("vs_trl", "t4_preset", "fast_path", "ppo_vs_grpo"):
        assert check in result.stdout
    assert "151643 BPE ranks" in result.stdout
    assert "imports OK" in result.stdout


def test_without_a_gpu_it_says_what_to_do(tmp_path):
    result = run("--json-out", str(tmp_path / "out.json"))
    assert result.returncode == 2
    assert "--dry-run" in result.stderr

"""bench/gpu_check.py on a CPU without --dry-run says what to do (tests/test_bench.py runs its dry run)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_without_a_gpu_it_says_what_to_do(tmp_path):
    result = run("--json-out", str(tmp_path / "out.json"))
    assert result.returncode == 2
    assert "--dry-run" in result.stderr

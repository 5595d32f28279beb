"""The layout's import rules (CONTRIBUTING.md, "Who may import whom"), checked with import-linter.

The contracts live in pyproject.toml ([tool.importlinter]): the algorithm at the top of the package imports no
trainer, run/, course/, measuring/ or grading/ module; run/ imports only the algorithm; the trainer imports them
and run/; course/ and measuring/ never import each other; inside grading/, the reports build on the runner, the
runner on the judge, the judge on the sandbox and the checks, which never import each other, and all of them on the
exercises and the check framework; and no two modules or folders import each other in a cycle, annotation-only
imports included.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_imports_follow_the_layout():
    lint_imports = shutil.which("lint-imports")
    if lint_imports is None:
        pytest.fail("import-linter is not installed: pip install -e '.[test]'")
    result = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout, result.stdout

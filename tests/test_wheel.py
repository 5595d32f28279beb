"""The installed package, not the checkout: the wheel holds every module and file that lesson 00 and the CLI need.

A module or an asset left out of the wheel (a new subpackage that packages.find does not include, the tiny model's
files missing from package-data) passes every other test, which import the checkout. This one builds the wheel from
the package's sources, installs it into a fresh virtual environment that borrows this environment's dependencies
(nothing is downloaded), and runs lesson 00 and a two-step training run from a folder
outside the repository, with no PYTHONPATH pointing back at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
BUILD_INPUTS = ("pyproject.toml", "README.md", "minigrpo")  # what setuptools reads to build the wheel


def checked(command: list, cwd: Path, env: dict, timeout: int = 600) -> str:
    """Run a command; fail with its output when it fails. Returns its stdout."""
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    shown = " ".join(map(str, command))
    assert result.returncode == 0, (
        f"{shown} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout


def running_site_packages() -> list[str]:
    """The folders this interpreter imports installed packages from: its own site-packages (a virtual
    environment's, when it runs in one) and those it reaches beyond it (the base interpreter's, the user's)."""
    return [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages") and Path(path).is_dir()]


def borrow_site_packages(venv_dir: Path) -> Path:
    """Let the virtual environment at venv_dir import this interpreter's packages, after its own: a .pth file in its
    site-packages lists their folders. (venv's system_site_packages=True would give the *base* interpreter's, not an
    outer virtual environment's, where a learner has installed torch.) Their own .pth files are not run, so an
    editable install of minigrpo there cannot shadow the wheel. Returns the .pth file."""
    (own,) = venv_dir.glob("lib/python*/site-packages")
    pth = own / "borrowed-site-packages.pth"
    pth.write_text("".join(f"{path}\n" for path in running_site_packages()))
    return pth


@pytest.fixture(scope="module")
def installed(tmp_path_factory, copy_from_checkout):
    """(the venv's python, a folder outside the repository, the environment to run in) with the wheel installed."""
    home = tmp_path_factory.mktemp("wheel")
    source = home / "source"
    source.mkdir()
    copy_from_checkout(BUILD_INPUTS, source)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # nothing points at the checkout
    env.update(MINIGRPO_QUICK="1", HF_HUB_OFFLINE="1", TQDM_DISABLE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", home / "dist"]
    checked([*build, source], cwd=home, env=env)
    (wheel,) = (home / "dist").glob("minigrpo-*.whl")
    venv.create(home / "venv")  # pip too is borrowed
    borrow_site_packages(home / "venv")  # torch, transformers, ...: this interpreter's, wherever they are
    python = home / "venv" / "bin" / "python"
    checked([python, "-m", "pip", "install", "-q", "--no-deps", wheel], cwd=home, env=env)
    outside = home / "outside"
    outside.mkdir()
    return python, outside, env


def test_the_nested_environment_borrows_this_interpreters_packages(installed):
    python, outside, env = installed
    found = checked([python, "-c", "import torch, transformers; print(torch.__file__)"], cwd=outside, env=env).strip()
    assert any(Path(found).is_relative_to(path) for path in running_site_packages()), found


def test_the_wheel_is_what_python_imports(installed):
    python, outside, env = installed
    location = checked([python, "-c", "import minigrpo; print(minigrpo.__file__)"], cwd=outside, env=env).strip()
    assert Path(location).is_relative_to(python.parent.parent), f"imported {location}, not the wheel"
    assert not Path(location).is_relative_to(ROOT)


def test_the_wheel_reports_pyprojects_version(installed):
    """minigrpo.__version__ is read from the installed metadata: pyproject.toml's version, not a second literal."""
    python, outside, env = installed
    version = checked([python, "-c", "import minigrpo; print(minigrpo.__version__)"], cwd=outside, env=env).strip()
    assert version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_lesson_00_runs_from_the_wheel(installed):
    python, outside, env = installed
    shutil.copy(ROOT / "notebooks" / "00_tour_and_setup.ipynb", outside)
    nbval = ["--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=300", "-p", "no:cacheprovider", "-q"]
    checked([python, "-m", "pytest", *nbval, "--rootdir", outside, "00_tour_and_setup.ipynb"], cwd=outside, env=env)


def test_train_runs_from_the_wheel(installed):
    python, outside, env = installed
    small = [
        "--prompts-per-step",
        "2",
        "--num-generations",
        "4",
        "--per-device-train-batch-size",
        "8",
        "--eval-size",
        "8",
    ]
    out = checked([python, "-m", "minigrpo", "train", "--max-steps", "2", *small, "--output-dir", "run"], outside, env)
    assert "accuracy before:" in out and (outside / "run" / "final" / "model.safetensors").is_file(), out[-2000:]

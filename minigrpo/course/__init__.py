"""What every notebook needs in its first cells: where am I, which model, how long to train, and the Colab setup.

The one switch for short runs is the environment variable MINIGRPO_QUICK
("1" = quick). It is read here and nowhere else: the test suite sets it so
that nbval runs every notebook in CI in seconds per training cell, while a
learner (in Colab or on a laptop) gets the full-length runs.

Which model a lesson uses is decided here too. Lessons 00-05 teach mechanics
(sampling, advantages, the loss) that read best in seconds, and lessons 07 and
08 compare short runs (the variants; minigrpo beside TRL), so they use the
bundled tiny Qwen on any machine;
lesson 06 trains for real and asks for Qwen2.5-0.5B-Instruct when a GPU is
there (`real_on_gpu=True`).

The Colab setup cell (written into every notebook by scripts/stamp_colab.py,
from pyproject.toml's version) runs before minigrpo is installed, so it is
plain code; in Colab it pip-installs COLAB_INSTALL, prints one line of
INSTALL_HELP if pip fails, then calls colab_setup() from here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys

import torch

from minigrpo import __version__
from minigrpo.config import GRPOConfig
from minigrpo.models import QWEN_MODEL_ID

QUICK: bool = os.environ.get("MINIGRPO_QUICK", "").lower() in ("1", "true", "yes")


def colab_install(version: str) -> str:
    """The one pip requirement a Colab setup cell installs: the course at `version`, with what Colab lacks (the
    colab extra)."""
    return f"minigrpo[colab]=={version}"


COLAB_INSTALL: str = colab_install(__version__)

# What the setup cell prints, after pip's own last line, when pip could not install COLAB_INSTALL in Colab.
INSTALL_HELP = "check the runtime's internet, or upload a wheel (`python scripts/build_dist.py`) and `%pip install` it."


def in_colab() -> bool:
    return "google.colab" in sys.modules


def colab_setup() -> None:
    """Colab only (a no-op elsewhere): turn on the custom widget manager, so that Colab renders the course's
    ipywidgets explorers (Colab's built-in manager only knows its own ipywidgets version)."""
    if not in_colab():
        return
    from google.colab import output

    output.enable_custom_widget_manager()


# Lesson 08 sets minigrpo beside TRL, at the version the cross-check targets (pyproject.toml's test extra pins the
# same). Colab has no TRL, and TRL 1.16 needs a newer datasets than Colab's (>= 4.7 against 4.0).
TRL_REQUIREMENT = "trl==1.16.0"
TRL_MISSING = (
    f"This cell needs TRL, which is not installed: `pip install {TRL_REQUIREMENT}` (in Colab the lesson's TRL cell "
    "does it), restart the kernel, and run the lesson again."
)


def install_trl(requirement: str = TRL_REQUIREMENT) -> bool:
    """Colab, lesson 08: pip-install TRL; returns whether this runtime may import it now, and says so in one line.

    It may not when pip moved a package this runtime has already imported (TRL 1.16 moves Colab's datasets 4.0,
    which `import minigrpo` imports): Python keeps the old module, so the runtime must restart first."""
    before = installed_versions()
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], capture_output=True, text=True)
    if pip.returncode != 0:
        print(f"pip could not install {requirement}:", (pip.stderr.strip().splitlines() or ["?"])[-1])
        return False
    importlib.invalidate_caches()
    moved = moved_imports(before, installed_versions(), imported_distributions())
    if moved:
        print(
            f"Installed {requirement}, which moved {', '.join(moved)} after this runtime imported it: restart the "
            "runtime from Colab's Runtime menu, then run the lesson again from the top."
        )
        return False
    print(f"Installed {requirement}.")
    return True


def moved_imports(before: dict[str, str], after: dict[str, str], imported: set[str]) -> list[str]:
    """The distributions whose version pip changed (before/after: name -> version) among those this process has
    imported (`imported`, names): ["datasets 4.0.0 -> 4.8.5", ...], sorted."""
    return [
        f"{name} {version} -> {after.get(name, 'removed')}"
        for name, version in sorted(before.items())
        if name in imported and after.get(name) != version
    ]


def installed_versions() -> dict[str, str]:
    """Every installed distribution: lower-case name -> version."""
    return {dist.metadata["Name"].lower(): dist.version for dist in importlib.metadata.distributions()}


def imported_distributions() -> set[str]:
    """The (lower-case) names of the distributions that provide a module this process has imported."""
    providers = importlib.metadata.packages_distributions()
    top_level = {name.partition(".")[0] for name in list(sys.modules)}
    return {dist.lower() for module in top_level for dist in providers.get(module, [])}


def on_gpu() -> bool:
    return torch.cuda.is_available()


def model_name(real_on_gpu: bool = False) -> str:
    """The model a lesson uses: the bundled tiny Qwen, unless `real_on_gpu` is set and a GPU is there (and not
    QUICK), then Qwen2.5-0.5B-Instruct. Lesson 06 passes real_on_gpu=True; every other lesson keeps the default (the
    tiny model on any machine: mechanics, and many short runs, in seconds)."""
    return QWEN_MODEL_ID if real_on_gpu and on_gpu() and not QUICK else "tiny"


def steps(full: int, quick: int) -> int:
    """`full` steps for a learner, `quick` under MINIGRPO_QUICK (CI)."""
    return quick if QUICK else full


def course_config(model: str = "tiny", **overrides) -> GRPOConfig:
    """The preset for `model` (pass what model_name() returned): tiny_cpu() for "tiny", qwen_t4() (fits a 15 GB
    T4) for a real Qwen. Taking the model name keeps the config and the loaded model from disagreeing.

    A lesson's run replaces the run an earlier execution of the same notebook left in its output_dir
    (overwrite_output_dir=True); pass overwrite_output_dir=False to be asked instead."""
    return GRPOConfig.for_model(model, **{"overwrite_output_dir": True, **overrides})


def describe(model: str | None = None) -> str:
    """One line for the top of a notebook: device, model (default: model_name()), quick mode."""
    device = torch.cuda.get_device_name(0) if on_gpu() else "CPU"
    return f"device: {device} | model: {model or model_name()} | quick mode: {QUICK} | torch {torch.__version__}"

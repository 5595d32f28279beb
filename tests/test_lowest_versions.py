"""scripts/lowest_versions.py: which versions the lowest-versions run installs (the run itself is a step of .ci/run)."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("tomllib", reason="the script reads pyproject.toml with tomllib (Python 3.11+)")

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("lowest_versions", ROOT / "scripts" / "lowest_versions.py")
lowest_versions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lowest_versions)


def project(dependencies, **extras):
    return {"project": {"dependencies": dependencies, "optional-dependencies": extras}}


def test_each_lower_bound_becomes_an_exact_pin():
    toml = project(
        ["transformers>=4.56,<6", "ipywidgets>=7.7,<9", "torch>=2.4,<2.15"], test=["trl==1.16.0", "pytest>=8"]
    )
    pins = lowest_versions.lowest_pins(toml, extras=("test",))
    assert pins == ["transformers==4.56", "ipywidgets==7.7", "torch==2.13.0", "pytest==8"]  # trl left out


def test_a_dependency_without_a_lower_bound_is_refused():
    with pytest.raises(ValueError, match="declare one lower bound"):
        lowest_versions.lowest_pins(project(["numpy<3"]), extras=())


def test_the_real_project_pins_every_declared_dependency():
    import tomllib

    pins = lowest_versions.lowest_pins(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert all("==" in pin for pin in pins) and "torch==2.13.0" in pins
    assert not any(pin.startswith("trl") for pin in pins)
    assert "ipywidgets==7.7" in pins  # Colab's ipywidgets: the explorers' kernel side runs there
    assert {"nbformat==5.10", "nbclient==0.10", "ipykernel==6.29"} <= set(pins)  # the grade extra's

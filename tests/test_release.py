"""Releasing the package: one version (pyproject.toml's), one build script that CI and the release workflow both run.

The build itself (python -m build, twine check --strict) runs in .ci/run's "Build and check the distributions" step;
these tests check the wiring that keeps CI and a release from drifting apart, and the release's refusals.
"""

import importlib.metadata
import importlib.util
from pathlib import Path

import tomllib
import yaml

import minigrpo

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_SCRIPT = "scripts/build_dist.py"

spec = importlib.util.spec_from_file_location("build_dist", ROOT / BUILD_SCRIPT)
build_dist = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_dist)


def workflow(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def commands(text: str) -> list[list[str]]:
    """Each line of shell text split at spaces, comment lines and blank lines dropped."""
    lines = (line.strip() for line in text.splitlines())
    return [line.split() for line in lines if line and not line.startswith("#")]


def step_commands(job: dict) -> list[list[str]]:
    return [words for step in job["steps"] if "run" in step for words in commands(step["run"])]


def test_the_version_is_pyprojects():
    assert minigrpo.__version__ == PYPROJECT["project"]["version"]


def test_a_checkout_without_an_install_reads_its_pyproject(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert minigrpo._version() == PYPROJECT["project"]["version"]


def test_ci_and_the_release_run_the_same_build_script():
    ci_run = commands((ROOT / ".ci" / "run").read_text())
    assert any(words[:2] == ["python", BUILD_SCRIPT] for words in ci_run), f".ci/run must call {BUILD_SCRIPT}"
    build = workflow("release.yml")["jobs"]["build"]
    released = [words for words in step_commands(build) if words[:2] == ["python", BUILD_SCRIPT]]
    assert len(released) == 1 and "--release" in released[0] and "--tag" in released[0]
    ci = workflow("ci.yml")["jobs"]["ci"]
    assert [".ci/run"] in step_commands(ci), "the CI workflow runs .ci/run"


def test_the_release_publishes_on_a_version_tag_with_trusted_publishing():
    release = workflow("release.yml")
    assert release[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as True
    publish = release["jobs"]["publish"]
    assert publish["needs"] == "build" and publish["permissions"] == {"id-token": "write"}
    assert [step["uses"] for step in publish["steps"]][-1] == "pypa/gh-action-pypi-publish@release/v1"
    assert not any("password" in step.get("with", {}) for step in publish["steps"]), "trusted publishing: no token"


def test_the_build_scripts_tools_are_declared_in_the_release_extra():
    names = {
        requirement.split(">")[0].split("=")[0]
        for requirement in PYPROJECT["project"]["optional-dependencies"]["release"]
    }
    assert names == {"build", "twine"}


def test_a_release_needs_its_tag_to_name_the_version_and_a_repository_url():
    published = {"version": "1.2.0", "urls": {"Repository": "https://github.com/a/minigrpo"}}
    assert build_dist.release_problems(published, "v1.2.0") == []
    assert build_dist.release_problems(published, None) == []
    (wrong_tag,) = build_dist.release_problems(published, "v1.2.1")
    assert "'v1.2.1' does not name pyproject.toml's version 1.2.0: tag the commit v1.2.0" in wrong_tag
    (no_url,) = build_dist.release_problems({"version": "1.2.0", "urls": {}}, "v1.2.0")
    assert "[project.urls] has no Repository" in no_url
    assert len(build_dist.release_problems({"version": "1.2.0"}, "1.2.0")) == 2


def test_pyproject_has_the_metadata_pypi_shows():
    project = PYPROJECT["project"]
    for field in ("name", "version", "description", "readme", "license", "requires-python", "authors", "classifiers"):
        assert project.get(field), f"pyproject.toml's [project] needs {field}"
    assert "urls" in project, "[project.urls]: the one place the repository's URL is set"
    assert "colab" in project["optional-dependencies"], "the setup cells install minigrpo[colab]"

"""Build minigrpo's sdist and wheel and check them: the one build that CI and a release both run.

    python scripts/build_dist.py                        # dist/: sdist + wheel, then `twine check --strict`
    python scripts/build_dist.py --outdir /tmp/dist
    python scripts/build_dist.py --release --tag v0.3.0  # also: the tag names pyproject.toml's version, the URL is set

Needs the release extra (`pip install build twine`, or `pip install -e ".[release]"`). `.ci/run` calls it on every
run, so a change that breaks the release (metadata twine rejects, a README PyPI cannot render) fails CI before a tag
is pushed; .github/workflows/release.yml calls it with --release on a version tag, then publishes what it built.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def release_problems(project: dict, tag: str | None) -> list[str]:
    """What keeps `project` (pyproject.toml's [project] table) from being released under git tag `tag` ("v0.3.0"):
    a tag that is not "v" + the version, and no Repository URL (the badges and PyPI's links need it). Empty: none."""
    problems = []
    version = project["version"]
    if tag is not None and tag != f"v{version}":
        problems.append(f"the tag {tag!r} does not name pyproject.toml's version {version}: tag the commit v{version}")
    if not project.get("urls", {}).get("Repository"):
        problems.append(
            'pyproject.toml\'s [project.urls] has no Repository: set Repository = "https://github.com/OWNER/minigrpo" '
            "and run python scripts/stamp_colab.py, so that the notebooks' badges open the published course"
        )
    return problems


def build(outdir: Path) -> list[Path]:
    """sdist and wheel into `outdir` (emptied first), each checked by `twine check --strict`. Returns their paths."""
    shutil.rmtree(outdir, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)], check=True)
    built = sorted(outdir.glob("minigrpo-*"))
    subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, built)], check=True)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outdir", type=Path, default=ROOT / "dist", help="where the sdist and wheel go (emptied)")
    parser.add_argument("--release", action="store_true", help="refuse to build what must not be published")
    parser.add_argument("--tag", help="the git tag being released (v<version>); with --release")
    args = parser.parse_args(argv)
    if args.release:
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        problems = release_problems(project, args.tag)
        if problems:
            print("not releasable:", *problems, sep="\n  ", file=sys.stderr)
            return 1
    for path in build(args.outdir):
        print("built", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

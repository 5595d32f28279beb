"""Rehearse Google Colab on a CPU: the course at Colab's own versions (scripts/colab_pins.txt).

    python scripts/colab_env.py                  # make (or reuse) the environment, then run every part below
    python scripts/colab_env.py --part lesson08  # one part (distributed, lessons, lesson08, capstone)
    python scripts/colab_env.py --build-only     # only the environments
    python scripts/colab_env.py --rebuild        # make the cached environments afresh

The environment: a virtual environment on a Python at Colab's version (pyenv's, found with `pyenv prefix 3.13`, or the
interpreter that PYTHON313 names), torch at Colab's version first, then the other pins and the test tools (at
pyproject.toml's bounds). PyPI has no CPU-only torch for Linux, so torch is its default build, which runs on a CPU
(about 4.6 GB with its CUDA libraries). It is cached outside the checkout, in
~/.cache/minigrpo/colab-<hash of the pins file> (MINIGRPO_CACHE moves the folder); a changed pins file makes a new one
and the old is removed. Beside it, a hard-linked copy to which lesson 08's own Colab setup has added TRL
(minigrpo.course.install_trl, run in that environment). The cold build costs minutes and gigabytes of downloads; a warm
run only installs the package's wheel, built from the checkout every run, into both.

What runs there, from a copy of tests/, notebooks/ and solutions/ outside the checkout (so that nothing imports the
checkout: the wheel is tested, as a learner installs it), in quick mode (the root conftest.py), each part timed:

- distributed: tests/test_distributed.py (torchrun and DDP on Colab's torch);
- lessons: every lesson but 08 through nbval (--nbval-lax, as pyproject.toml's addopts: checked outputs compared), as
  Colab runs a notebook opened from its badge: in a fresh runtime of its own, without minigrpo (a hard-linked copy of
  the environment, made in about a second, from which the package is uninstalled), from a scratch folder with nothing
  of the repository beside it (Colab's /content), in a kernel that starts with a stand-in google.colab imported. So
  each lesson's own setup cell pip-installs `minigrpo[colab]==<version>` into its runtime, and a lesson that ran
  without installing it fails on its first import. pip finds the package in the wheel's folder (PIP_FIND_LINKS) and
  nothing on the network (PIP_NO_INDEX). Two lessons run at a time, one per core; each runtime is removed after its
  lesson;
- lesson08: lesson 08 without TRL (every cell runs; the cells that need TRL print course.TRL_MISSING and nothing else;
  the other checked cells print what the notebook holds), then through nbval in the environment with TRL;
- capstone: `python -m minigrpo grade` on solutions/12_grpo_from_scratch.ipynb earns full marks.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "scripts" / "colab_pins.txt"
CACHE = Path(os.environ.get("MINIGRPO_CACHE", Path.home() / ".cache" / "minigrpo"))
# The test tools the leg runs (not Colab's: Colab has no pytest), at pyproject.toml's test extra's bounds.
TEST_TOOLS = ("pytest", "pytest-xdist", "nbval", "nbclient", "nbformat", "ipykernel")
LESSON_08 = "notebooks/08_from_minigrpo_to_trl.ipynb"
CAPSTONE = "solutions/12_grpo_from_scratch.ipynb"
COPIED = ("tests", "notebooks", "solutions", "conftest.py", "pyproject.toml")  # what the parts read; no minigrpo/
NEEDS_TRL = "if trl is None:"  # how a line of each cell of lesson 08 that needs TRL begins (its guard)
CHECK = "# NBVAL_CHECK_OUTPUT"
PARTS = ("distributed", "lessons", "lesson08", "capstone")
RUNTIMES_AT_ONCE = 2  # lessons run at once in the lessons part, each in its own runtime: one per core


# --- the pins and the interpreter ----------------------------------------------------------------
def read_pins(text: str) -> tuple[str, list[str]]:
    """(Python version, pip pins) from the pins file: a `# python X.Y` line and one `name==version` a line."""
    pythons = [line.split()[2] for line in text.splitlines() if line.startswith("# python ")]
    pins = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(pythons) != 1:
        raise ValueError("the pins file must name Colab's Python in one line, `# python 3.13`")
    if not any(pin.startswith("torch==") for pin in pins) or not all("==" in pin for pin in pins):
        raise ValueError(f"every pin must be exact (name==version), torch's among them; got {pins}")
    return pythons[0], pins


def pins_key(text: str) -> str:
    """The cache key of an environment: the first 12 hex digits of the pins file's sha256."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def find_python(version: str, environ: dict | None = None) -> Path:
    """Colab's Python: the interpreter PYTHON<digits> names (PYTHON313 for 3.13), else pyenv's `X.Y`."""
    environ = os.environ if environ is None else environ
    variable = "PYTHON" + version.replace(".", "")
    if environ.get(variable):
        return Path(environ[variable])
    try:
        prefix = subprocess.run(["pyenv", "prefix", version], capture_output=True, text=True, check=True).stdout
        return Path(prefix.strip().splitlines()[-1]) / "bin" / f"python{version}"
    except (OSError, subprocess.CalledProcessError, IndexError):
        raise RuntimeError(
            f"Colab runs Python {version} and this machine has none that pyenv knows: install it "
            f"(`pyenv install {version}`) or set {variable} to a python{version} interpreter."
        ) from None


def test_tools(pyproject_text: str) -> list[str]:
    """TEST_TOOLS as pyproject.toml's test and grade extras declare them ("pytest>=8", ...)."""
    import tomllib

    extras = tomllib.loads(pyproject_text)["project"]["optional-dependencies"]
    declared = extras["test"] + extras.get("grade", [])  # the grader's nbclient, nbformat, ipykernel: its own extra
    by_name = {text.split(">")[0].split("=")[0].split("<")[0].strip(): text for text in declared}
    return [by_name[name] for name in TEST_TOOLS]


def trl_requirement() -> str:
    """minigrpo.course.TRL_REQUIREMENT, read from the source (this script imports nothing of the package)."""
    tree = ast.parse((ROOT / "minigrpo" / "course" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(getattr(target, "id", None) == "TRL_REQUIREMENT" for target in targets):
                return ast.literal_eval(node.value)
    raise RuntimeError("minigrpo/course/__init__.py no longer defines TRL_REQUIREMENT")


# --- the environments ------------------------------------------------------------------------------
def run(*command, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, command)), flush=True)
    return subprocess.run([str(part) for part in command], **{"check": True, **kwargs})


def make_environment(venv: Path, interpreter: Path, pins: list[str], tools: list[str]) -> Path:
    """A fresh virtual environment: torch's pin first (nothing after it may swap its build), then every pin and tool at
    once (torch's pin again, so that a pin in conflict with it is an error); `pip check`. Returns its python."""
    shutil.rmtree(venv, ignore_errors=True)
    run(interpreter, "-m", "venv", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", *[pin for pin in pins if pin.startswith("torch==")])
    run(python, "-m", "pip", "install", "-q", *pins, *tools)
    run(python, "-m", "pip", "check")
    return python


def with_trl(base: Path, venv: Path, wheel: Path) -> Path:
    """A hard-linked copy of `base` (seconds, no second 4.6 GB) with the package, to which lesson 08's own Colab setup,
    course.install_trl(), adds TRL. pip replaces files by new ones, so `base` keeps its own. Returns its python."""
    shutil.rmtree(venv, ignore_errors=True)
    run("cp", "-al", base, venv)
    python = venv / "bin" / "python"
    install_wheel(python, wheel)
    run(python, "-c", "from minigrpo import course; course.install_trl()", env=leg_environment())
    run(python, "-m", "pip", "check")
    return python


def cached(venv: Path, make, rebuild: bool) -> Path:
    """`venv`'s python, made by make() unless a finished build is there (a build that stopped half-way is redone)."""
    finished = venv / ".finished"
    if rebuild or not finished.exists():
        started = time.monotonic()
        make()
        finished.unlink(missing_ok=True)  # a hard link to base's own, in the copy with TRL: write a new file
        finished.write_text(f"built in {time.monotonic() - started:.0f} s\n")
    return venv / "bin" / "python"


def build_wheel(folder: Path) -> Path:
    """The package's wheel, built from the checkout with this python's setuptools (nothing downloaded)."""
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", folder, ROOT)
    (wheel,) = folder.glob("minigrpo-*.whl")
    return wheel


def install_wheel(python: Path, wheel: Path) -> None:
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel)


def environments(rebuild: bool) -> tuple[Path, Path, Path]:
    """(python without TRL, python with TRL, this checkout's wheel), the environments made or reused under CACHE,
    with the wheel installed."""
    pins_text = PINS.read_text()
    version, pins = read_pins(pins_text)
    home = CACHE / f"colab-{pins_key(pins_text)}"
    for stale in CACHE.glob("colab-*"):
        if stale != home:
            print(f"removing {stale}: made from other pins", flush=True)
            shutil.rmtree(stale, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(Path(tempfile.mkdtemp(prefix="minigrpo-wheel-")))
    tools = test_tools((ROOT / "pyproject.toml").read_text())
    base, trl_name = home / "base", "with-" + trl_requirement().replace("==", "-")
    plain = cached(base, lambda: make_environment(base, find_python(version), pins, tools), rebuild)
    install_wheel(plain, wheel)
    with_trl_python = cached(home / trl_name, lambda: with_trl(base, home / trl_name, wheel), rebuild)
    install_wheel(with_trl_python, wheel)
    return plain, with_trl_python, wheel


# --- the parts -----------------------------------------------------------------------------------------
def leg_environment() -> dict:
    """This process's environment without PYTHONPATH (nothing may import the checkout), offline."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def workspace() -> Path:
    """A copy of what the parts read (COPIED), outside the checkout."""
    folder = Path(tempfile.mkdtemp(prefix="minigrpo-colab-"))
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__", "runs", ".*"))
        else:
            shutil.copy(source, folder / name)
    return folder


# The rehearsal's Colab: what a lesson's kernel finds there (the course calls only output.enable_custom_widget_manager).
COLAB_STANDIN = '''"""A stand-in for Colab's google.colab (scripts/colab_env.py): what minigrpo.course calls."""

import types

output = types.SimpleNamespace(enable_custom_widget_manager=lambda: None)
'''
COLAB_KERNEL_STARTUP = "import google.colab  # Colab's kernels start with it imported: the setup cell's test\n"


def colab_content(folder: Path, lessons: list[str], wheel: Path) -> tuple[list[str], dict]:
    """Colab in `folder`: the lessons copied into folder/content (Colab's /content: nothing of the repository beside
    them), the stand-in google.colab on the path, a kernel profile that imports google.colab. Returns (the copied
    lessons, relative to `folder`; the environment variables they run with)."""
    standin = folder / "colab-standin"
    (standin / "google" / "colab").mkdir(parents=True)  # google/ stays a namespace package (protobuf's google.*)
    (standin / "google" / "colab" / "__init__.py").write_text(COLAB_STANDIN)
    startup = folder / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-google-colab.py").write_text(COLAB_KERNEL_STARTUP)
    (folder / "content").mkdir()
    copied = []
    for lesson in lessons:
        shutil.copy(folder / lesson, folder / "content")
        copied.append(f"content/{Path(lesson).name}")
    offline_pip = {"PIP_FIND_LINKS": str(wheel.parent), "PIP_NO_INDEX": "1"}  # the wheel, and nothing downloaded
    return copied, {"PYTHONPATH": str(standin), "IPYTHONDIR": str(folder / "ipython"), **offline_pip}


def fresh_runtime(base: Path, runtime: Path) -> Path:
    """A new Colab runtime for one lesson: a hard-linked copy of `base` (about a second; pip replaces files, never
    writes into them, so `base` keeps its own) from which minigrpo is uninstalled. Returns its python."""
    shutil.rmtree(runtime, ignore_errors=True)
    runtime.parent.mkdir(parents=True, exist_ok=True)
    run("cp", "-al", base, runtime)
    python = runtime / "bin" / "python"
    run(python, "-m", "pip", "uninstall", "-q", "-y", "minigrpo")
    return python


class LessonsInFreshRuntimes:
    """The lessons part: each lesson through nbval in a fresh runtime of its own (fresh_runtime), RUNTIMES_AT_ONCE at a
    time; called with the leg's environment, returns True when every lesson passed."""

    def __init__(self, base: Path, folder: Path, lessons: list[str], colab_env: dict):
        self.base, self.folder, self.lessons, self.colab_env = base, folder, lessons, colab_env

    def command(self, lesson: str) -> list[str]:
        """pytest's arguments for one lesson (-n 0: the lesson's cells in pytest's own process, one kernel)."""
        return ["-m", "pytest", "-p", "no:cacheprovider", "-n", "0", lesson]

    def run_one(self, lesson: str, env: dict) -> bool:
        runtime = self.base.parent / "runtimes" / Path(lesson).stem  # beside base: hard links need one file system
        python = fresh_runtime(self.base, runtime)
        started = time.monotonic()
        # One thread a lesson, as the root conftest.py sets under pytest-xdist: two lessons with a thread per core
        # each spin against each other (lessons 05 and 06 took 148 s each so, against 104 s for the whole part).
        threads = {"OMP_NUM_THREADS": "1"} if RUNTIMES_AT_ONCE > 1 else {}
        lesson_env = {**env, **self.colab_env, **threads}
        done = subprocess.run(
            [str(python), *self.command(lesson)], cwd=self.folder, env=lesson_env, capture_output=True, text=True
        )
        shutil.rmtree(runtime, ignore_errors=True)
        last_line = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"{lesson}, in a fresh runtime: {last_line} ({time.monotonic() - started:.0f} s)", flush=True)
        if done.returncode != 0:
            print(done.stdout[-6000:], done.stderr[-3000:], sep="\n", flush=True)
        return done.returncode == 0

    def __call__(self, env: dict) -> bool:
        with concurrent.futures.ThreadPoolExecutor(RUNTIMES_AT_ONCE) as pool:
            return all(list(pool.map(lambda lesson: self.run_one(lesson, env), self.lessons)))


def lesson_without_trl(notebook: Path) -> list[str]:
    """Run every cell of lesson 08 in this (TRL-less) environment; returns what went wrong (empty: nothing).

    A cell that needs TRL (a line of it begins with NEEDS_TRL) must print course.TRL_MISSING and nothing else; every
    other cell must run, and a checked one print what the notebook holds."""
    import nbclient
    import nbformat

    from minigrpo.course import TRL_MISSING

    committed = nbformat.read(notebook, as_version=4)
    executed = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(executed, timeout=600, allow_errors=True, kernel_name="python3")
    client.execute(cwd=str(notebook.parent))
    problems = []
    for index, (expected, got) in enumerate(zip(committed.cells, executed.cells, strict=True)):
        if got.cell_type != "code":
            continue
        text = printed(got.outputs)
        errors = [f"{o.ename}: {o.evalue}" for o in got.outputs if o.output_type == "error"]
        needs_trl = any(line.startswith(NEEDS_TRL) for line in got.source.splitlines())
        if errors:
            problems.append(f"cell {index} raised {errors[0]}")
        elif needs_trl and text != TRL_MISSING + "\n":
            problems.append(f"cell {index} needs TRL and printed {text!r}, not course.TRL_MISSING")
        elif got.source.startswith(CHECK) and not needs_trl and text != printed(expected.outputs):
            problems.append(f"cell {index} printed {text!r}, the notebook holds {printed(expected.outputs)!r}")
    return problems


def printed(outputs) -> str:
    """What a cell printed on stdout or returned: what a checked cell keeps (scripts/refresh_checked_outputs.py)."""
    parts = []
    for output in outputs:
        if output.output_type == "stream" and output.name == "stdout":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data") and "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"])
    return "".join(parts)


def parts(plain: Path, trl_python: Path, folder: Path, wheel: Path) -> dict[str, list]:
    """Each part's commands, run in `folder` (the workspace): (python, arguments, environment variables beyond the
    leg's), or a callable that runs its own (the lessons, each in its own runtime)."""
    lessons = sorted(str(path.relative_to(folder)) for path in (folder / "notebooks").glob("*.ipynb"))
    in_colab, colab_env = colab_content(folder, [lesson for lesson in lessons if lesson != LESSON_08], wheel)
    grade = [CAPSTONE, "--json", "--timeout", "600"]
    return {
        "distributed": [(plain, ["-m", "pytest", "-p", "no:cacheprovider", "tests/test_distributed.py"])],
        "lessons": [LessonsInFreshRuntimes(plain.parent.parent, folder, in_colab, colab_env)],
        "lesson08": [
            (plain, [str(Path(__file__).resolve()), "--lesson-without-trl", LESSON_08]),
            (trl_python, ["-m", "pytest", "-p", "no:cacheprovider", LESSON_08]),
        ],
        "capstone": [(plain, ["-m", "minigrpo", "grade", *grade])],
    }


def capstone_problems(stdout: str) -> list[str]:
    """What keeps the graded capstone from full marks (empty: full marks, no error), from `grade --json`'s output."""
    (notebook,) = json.loads(stdout)["notebooks"]
    problems = [f"error: {error}" for error in notebook["errors"]]
    if notebook["status"] != "ok" or notebook["points"] != notebook["max_points"] or not notebook["max_points"]:
        problems.append(f"{notebook['status']}: {notebook['points']} of {notebook['max_points']} points")
    for check in notebook.get("checks", []):  # each case that lost points, with the grader's hint
        for case in check["cases"]:
            if not case["passed"]:
                problems.append(f"{check['check']}: {case['name']}: {case['message']}")
    return problems


def run_part(name: str, commands: list, folder: Path) -> bool:
    env = {**leg_environment(), "MINIGRPO_QUICK": "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    ok = True
    for command in commands:
        if callable(command):
            ok = command(env) and ok
            continue
        python, arguments, *extra = command
        capture = name == "capstone"
        command_env = {**env, **(extra[0] if extra else {})}
        done = run(python, *arguments, cwd=folder, env=command_env, check=False, capture_output=capture, text=True)
        if capture:
            print(done.stderr[-3000:], end="")
            problems = capstone_problems(done.stdout) if done.returncode == 0 else [f"exit {done.returncode}"]
            print("capstone:", "; ".join(problems) or "full marks", flush=True)
            ok = ok and not problems
        else:
            ok = ok and done.returncode == 0
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, action="append", help="run only this part (again for more)")
    parser.add_argument("--build-only", action="store_true", help="make the environments, run nothing")
    parser.add_argument("--rebuild", action="store_true", help="make the cached environments afresh")
    parser.add_argument("--lesson-without-trl", type=Path, help=argparse.SUPPRESS)  # run inside the environment
    args = parser.parse_args(argv)
    if args.lesson_without_trl:
        problems = lesson_without_trl(args.lesson_without_trl.resolve())
        print("lesson 08 without TRL:", "; ".join(problems) or "every cell ran as it should", flush=True)
        return 1 if problems else 0
    started = time.monotonic()
    plain, trl_python, wheel = environments(args.rebuild)
    times = {"environments": time.monotonic() - started}
    if args.build_only:
        print(f"environments ready in {times['environments']:.0f} s: {plain}, {trl_python}")
        return 0
    folder, failed = workspace(), []
    for name, commands in parts(plain, trl_python, folder, wheel).items():
        if args.part and name not in args.part:
            continue
        started = time.monotonic()
        if not run_part(name, commands, folder):
            failed.append(name)
        times[name] = time.monotonic() - started
    shutil.rmtree(folder, ignore_errors=True)
    print("Colab leg:", ", ".join(f"{name} {seconds:.0f} s" for name, seconds in times.items()))
    print("failed:", ", ".join(failed) if failed else "nothing", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The grader: `python -m minigrpo grade PATH [--json] [--timeout S]`.

It executes each notebook in a fresh kernel of the current Python (nbclient,
`allow_errors=True`, so a cell that raises NotImplementedError does not stop
the check cells after it), with MINIGRPO_GRADE_FILE set for the kernel: every
check the notebook runs appends its result there (the protocol is in
`minigrpo.grading.framework`). A check that the notebook's code cells call
(`check_xxx(`) but that never reported (its cell failed first, or the notebook
timed out) scores 0 out of its maximum, with the reason. The grader also sets
MINIGRPO_QUICK=1 unless it is already set, so the notebooks' training cells
stay short.

This is feedback for learners, not a sandbox: the learner's code runs with the
grader's permissions.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from minigrpo.grading.framework import CASES, GRADE_FILE_ENV, format_points, last_traceback_line, max_points

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the minigrpo package: the kernels import this copy, not another one on their path."""


_CHECK_CALL_RE = re.compile(r"\b(check_\w+)\s*\(")


@dataclass
class NotebookReport:
    """The grade of one notebook: one CheckResult-like dict per check, and how the run went."""

    path: str
    checks: list[dict] = field(default_factory=list)
    status: str = "ok"  # ok | timeout | kernel died
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def exercise(self) -> str:
        return Path(self.path).stem

    @property
    def points(self) -> float:
        return sum(c["points"] for c in self.checks)

    @property
    def max_points(self) -> float:
        return sum(c["max_points"] for c in self.checks)

    def to_dict(self) -> dict:
        return {
            "exercise": self.exercise,
            "path": self.path,
            "points": self.points,
            "max_points": self.max_points,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "errors": self.errors,
            "checks": self.checks,
        }


class GradingError(RuntimeError):
    """Grading itself could not run (no kernel, unreadable notebook): exit code 1."""


def find_notebooks(path: str | Path) -> list[Path]:
    """A .ipynb file, or every .ipynb under a folder (sorted, checkpoints skipped)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: give a .ipynb file or a folder of them.")
    if path.is_file():
        if path.suffix != ".ipynb":
            raise FileNotFoundError(f"{path} is not a notebook (.ipynb).")
        return [path]
    notebooks = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not notebooks:
        raise FileNotFoundError(f"no .ipynb notebooks under {path}.")
    return notebooks


def expected_checks(nb) -> list[str]:
    """The checks a notebook's code cells call, in order of first appearance."""
    names: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            names += [n for n in _CHECK_CALL_RE.findall(cell.source) if n in CASES and n not in names]
    return names


def _cell_error(nb, check: str) -> str | None:
    """'NameError: ...' from the first cell that calls `check` and failed, if any."""
    for cell in nb.cells:
        if cell.cell_type == "code" and check in cell.source:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    return f"{output['ename']}: {output['evalue']}"
    return None


def collect(nb, record_file: Path, report: NotebookReport) -> None:
    """Fill report.checks from the records the checks wrote; checks that never reported get 0."""
    recorded: dict[str, dict] = {}
    if record_file.exists():
        for line in record_file.read_text().splitlines():
            if line.strip():
                result = json.loads(line)
                recorded[result["check"]] = result  # the last run of a check wins
    for name in expected_checks(nb) + [n for n in recorded if n not in expected_checks(nb)]:
        if name in recorded:
            report.checks.append(recorded[name])
            continue
        reason = _cell_error(nb, name) or (
            f"the notebook {report.status}" if report.status != "ok" else "the check was never called"
        )
        report.checks.append(
            {"check": name, "points": 0.0, "max_points": max_points(name), "cases": [], "not_run": reason}
        )


def _kernel_manager(kernel_dir: Path):
    """A kernel of the Python running the grader (not whatever 'python' is on PATH)."""
    # Imported here, not at the top: jupyter_client, nbclient and nbformat come with the package's
    # `notebooks` / `test` extras, and a learner's `from minigrpo.grading import check_x` must not need them.
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = kernel_dir / "kernels" / "minigrpo-grader"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minigrpo grader",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(kernel_dir / "kernels")])
    return AsyncKernelManager(kernel_name="minigrpo-grader", kernel_spec_manager=specs)


def _kernel_env(record_file: Path, jobs: int) -> dict:
    env = dict(os.environ)
    env[GRADE_FILE_ENV] = str(record_file)
    env.setdefault("MINIGRPO_QUICK", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, _cpu_count() // jobs))
    return env


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


async def _grade_notebook(path: Path, timeout: float, jobs: int, workdir: Path) -> NotebookReport:
    import nbformat  # lazy, like jupyter_client in _kernel_manager: an optional dependency
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    report = NotebookReport(str(path))
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as error:
        raise GradingError(f"cannot read {path}: {last_traceback_line(error)}") from error
    record_file = workdir / f"{path.stem}-{abs(hash(str(path)))}.jsonl"
    record_file.unlink(missing_ok=True)
    client = NotebookClient(
        nb,
        timeout=int(timeout),
        allow_errors=True,
        km=_kernel_manager(workdir / f"kernel-{abs(hash(str(path)))}"),
        resources={"metadata": {"path": str(path.parent.resolve())}},
        extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no start-up warnings on the grader's stderr
    )
    started = time.monotonic()
    try:
        async with client.async_setup_kernel(env=_kernel_env(record_file, jobs)):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = timeout - (time.monotonic() - started)
                if remaining <= 0:
                    raise CellTimeoutError("the notebook ran out of time")
                client.timeout = max(1, int(math.ceil(remaining)))
                await client.async_execute_cell(cell, index)
    except CellTimeoutError:
        report.status = "timed out"
        report.errors.append(f"the notebook ran longer than --timeout {timeout:g} s; later cells did not run")
    except DeadKernelError as error:
        report.status = "kernel died"
        report.errors.append(f"the kernel died: {last_traceback_line(error)}")
    except RuntimeError as error:
        if client.kc is None:  # the kernel never started: grading could not run
            raise GradingError(f"could not start a kernel for {path}: {last_traceback_line(error)}") from error
        raise
    report.seconds = time.monotonic() - started
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error" and output["ename"] != "NotImplementedError":
                report.errors.append(f"{output['ename']}: {output['evalue']}")
    collect(nb, record_file, report)
    return report


async def _grade_all(notebooks: list[Path], timeout: float, jobs: int, workdir: Path, progress) -> list[NotebookReport]:
    gate = asyncio.Semaphore(jobs)

    async def one(path: Path) -> NotebookReport:
        async with gate:
            report = await _grade_notebook(path, timeout, jobs, workdir)
            progress(report)
            return report

    return list(await asyncio.gather(*(one(p) for p in notebooks)))


def grade_notebooks(
    paths: Sequence[str | Path], timeout: float = 600, jobs: int | None = None, progress=None
) -> list[NotebookReport]:
    """Execute each notebook in its own kernel (`jobs` at a time) and collect its checks."""
    notebooks = [Path(p) for p in paths]
    if jobs is None:
        jobs = int(os.environ.get("MINIGRPO_GRADE_JOBS", "0")) or min(len(notebooks), _cpu_count(), 4)
    jobs = max(1, jobs)
    with tempfile.TemporaryDirectory(prefix="minigrpo-grade-") as tmp:
        return asyncio.run(_grade_all(notebooks, timeout, jobs, Path(tmp), progress or (lambda report: None)))


def format_scores(reports: list[NotebookReport]) -> str:
    """The score table: exercise, check, points, max; then a total and what failed."""
    width = max([len("exercise")] + [len(r.exercise) for r in reports])
    check_width = max([len("check")] + [len(c["check"]) for r in reports for c in r.checks])
    lines = [f"{'exercise':<{width}}  {'check':<{check_width}}  {'points':>6}  {'max':>4}"]
    lines.append("-" * len(lines[0]))
    for report in reports:
        rows = report.checks or [{"check": "(no checks)", "points": 0, "max_points": 0}]
        for check in rows:
            lines.append(
                f"{report.exercise:<{width}}  {check['check']:<{check_width}}  "
                f"{format_points(check['points']):>6}  {format_points(check['max_points']):>4}"
            )
    lines.append("-" * len(lines[0]))
    total, most = sum(r.points for r in reports), sum(r.max_points for r in reports)
    lines.append(f"{'total':<{width}}  {'':<{check_width}}  {format_points(total):>6}  {format_points(most):>4}")
    details = []
    for report in reports:
        if report.status != "ok":
            details.append(f"{report.exercise}: {report.status}")
        for check in report.checks:
            if "not_run" in check:
                details.append(f"{report.exercise} / {check['check']}: did not run ({check['not_run']})")
            for case in check.get("cases", []):
                if not case["passed"]:
                    details.append(f"{report.exercise} / {check['check']} / {case['name']}: {case['message']}")
    if details:
        lines += ["", "what lost points:"] + [f"  {d}" for d in details]
    return "\n".join(lines)


def grade_command(path: str, as_json: bool = False, timeout: float = 600) -> int:
    """`python -m minigrpo grade PATH`: 0 whatever the score; 2 for a bad PATH, 1 when grading could not run."""
    try:
        notebooks = find_notebooks(path)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def progress(report: NotebookReport) -> None:
        score = f"{format_points(report.points)}/{format_points(report.max_points)}"
        print(
            f"graded {report.path}: {score} in {report.seconds:.1f} s"
            + ("" if report.status == "ok" else f" ({report.status})"),
            file=sys.stderr,
        )

    started = time.monotonic()
    try:
        reports = grade_notebooks(notebooks, timeout=timeout, progress=progress)
    except GradingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    total, most = sum(r.points for r in reports), sum(r.max_points for r in reports)
    if as_json:
        summary = {
            "path": str(path),
            "points": total,
            "max_points": most,
            "seconds": round(time.monotonic() - started, 2),
        }
        print(json.dumps({**summary, "notebooks": [r.to_dict() for r in reports]}, indent=1))
    else:
        print(format_scores(reports))
    return 0

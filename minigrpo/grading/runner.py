"""The grader: `python -m minigrpo grade PATH [--json] [--timeout S] [--jobs N] [--csv FILE]`.

How a notebook is graded, and why its score can be trusted
-----------------------------------------------------------
1. Read it: only a regular file of at most 16 MiB is read as a notebook
   (`minigrpo.grading.limits`); anything else named *.ipynb scores 0 as
   unreadable, with the reason.
2. Run it: nbclient executes the notebook in a fresh kernel of the current
   Python (`allow_errors=True`, so a cell that raises NotImplementedError does
   not stop the cells after it), under a SID of its own (setsid), with
   $MINIGRPO_GRADING_RUN set to a random token, its stdin, stdout and stderr
   /dev/null, and its connection file, kernel spec and TMPDIR in a folder of the
   grader's temporary folder (`minigrpo.grading.kernels`). Its checks only
   remember the function they were given. Of its output the grader keeps at
   most 1 MiB per cell and 8 MiB per notebook, and reads only the errors.
3. Judge it: a separate process of the package's own code
   (`minigrpo.grading.judge`), started isolated from every folder a learner may
   write (`processes.judge_command`), runs the cases of every check that the
   notebook's code cells call (`check_xxx(`), computing the expected answers and
   the points itself; it calls the learner's functions in the kernel and gets
   back plain data only (`minigrpo.grading.remote`). Patching the package in the
   kernel, or writing anything anywhere, changes no point: learner code never
   runs in the judge. A function that is, wraps, calls or runs the package's own
   solution of the exercise earns 0 for that check, with the reason
   (`minigrpo.grading.references`).
4. Accept it: the judge's records come back signed (HMAC under a key only the
   runner and the judge know). A record for a check the notebook does not call,
   with points above the check's maximum, or malformed, is rejected: that check
   scores 0 with the reason. A notebook that cannot be read, times out, kills
   its kernel or breaks its judge scores 0 on its own checks only.
5. Clean up, however grading ends: every process with the kernel's SID, and
   every process carrying the token, is killed (`minigrpo.grading.processes`),
   and the notebook's folder (connection file included) is removed.

A check that the notebook calls but that did not run (its cell failed first, or
the notebook timed out) scores 0 out of its maximum, with the reason. The
grader sets MINIGRPO_QUICK=1 unless it is already set, so the notebooks'
training cells stay short.

SIGINT (Ctrl-C) or SIGTERM stops grading: the notebooks being graded are cleaned
up as above, none of them gets a score, the report lists the notebooks that were
not graded, and the command exits with 128 + the signal's number (130, 143).
Names and messages a learner made are printed escaped (`limits.printable`).

The learner's code still runs with the grader's user account: it cannot change
a score through Python, files or the kernel's output, but it can read files,
write to the grader's open files through /proc, or disturb other processes of
that user. Grade untrusted notebooks in a container.
"""

from __future__ import annotations

import ast
import asyncio
import hmac
import json
import math
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from minigrpo.grading.framework import CASES, GRADING_RUN_ENV, format_points, last_traceback_line, max_points
from minigrpo.grading.limits import LIMITS, NotebookRefused, printable, read_notebook
from minigrpo.grading.processes import Interrupts, alive, judge_command, kill_leftovers, without_working_folder

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the minigrpo package: the kernels import this copy, not another one on their path."""


_CHECK_CALL_RE = re.compile(r"\b(check_\w+)\s*\(")


@dataclass
class NotebookReport:
    """The grade of one notebook: one CheckResult-like dict per check, and how the run went."""

    path: str
    checks: list[dict] = field(default_factory=list)
    status: str = "ok"  # ok | timed out | kernel died | unreadable
    seconds: float = 0.0  # running the notebook and judging its checks
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the grader left out (output over its caps): no points lost

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
            "notes": self.notes,
            "checks": self.checks,
        }


class GradingError(RuntimeError):
    """Grading itself could not run (no kernel): exit code 1."""


class GradingInterrupted(Exception):
    """SIGINT or SIGTERM stopped grading: the notebooks graded before it, and those not graded (no score)."""

    def __init__(self, signal_number: int, reports: list[NotebookReport], not_graded: list[Path]):
        self.signal_number, self.reports, self.not_graded = signal_number, reports, not_graded
        self.signal_name = signal.Signals(signal_number).name
        super().__init__(f"interrupted by {self.signal_name}: {len(not_graded)} notebook(s) not graded")


def find_notebooks(path: str | Path) -> list[Path]:
    """A .ipynb path, or every .ipynb under a folder (sorted, checkpoints skipped); none of them is opened here."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{printable(str(path))} does not exist: give a .ipynb file or a folder of them.")
    if not path.is_dir():
        if path.suffix != ".ipynb":
            raise FileNotFoundError(f"{printable(str(path))} is not a notebook (.ipynb).")
        return [path]  # a FIFO or a device too: reading refuses it, and the report says why
    notebooks = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts and not p.is_dir())
    if not notebooks:
        raise FileNotFoundError(f"no .ipynb notebooks under {printable(str(path))}.")
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


def check_calls(nb) -> dict[str, dict]:
    """check -> {"cell": index in nb.cells, "argument": the expression passed} of its last call in the code cells."""
    from IPython.core.inputtransformer2 import TransformerManager  # %magics -> Python

    calls: dict[str, dict] = {}
    transformer = TransformerManager()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "check_" not in cell.source:
            continue
        try:
            source = transformer.transform_cell(cell.source)
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in CASES:
                passed = node.args[0] if node.args else (node.keywords[0].value if node.keywords else None)
                argument = ast.get_source_segment(source, passed) if passed is not None else None
                calls[name] = {"cell": index, "argument": argument}
    return calls


def accept_records(records, expected: list[str]) -> tuple[dict[str, dict], list[str]]:
    """The judge's records that make sense, by check, and a line for each one rejected."""
    accepted, problems = {}, []
    for record in records if isinstance(records, list) else []:
        check = record.get("check") if isinstance(record, dict) else None
        problem = _record_problem(record, expected, accepted)
        if problem:
            problems.append(f"{check or record!r}: record rejected, {problem}")
            if check in expected and check not in accepted:
                accepted[check] = {"check": check, "not_run": f"its record was rejected ({problem})"}
        else:
            accepted[check] = record
    return accepted, problems


def _record_problem(record, expected: list[str], accepted: dict) -> str | None:
    if not isinstance(record, dict) or not isinstance(record.get("check"), str):
        return "not a check's record"
    check = record["check"]
    if check not in expected:
        return "the notebook does not call this check"
    if check in accepted:
        return "a second record for the same check"
    if "not_run" in record:
        return None if isinstance(record["not_run"], str) else "a malformed reason"
    cases = record.get("cases")
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        return "no list of cases"
    most = max_points(check)
    points = [c.get("points") for c in cases]
    maxima = [c.get("max_points") for c in cases]
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in points + maxima):
        return "points that are not finite numbers"
    if any(not 0 <= p <= m for p, m in zip(points, maxima, strict=True)):
        return "a case with more points than its maximum"
    if abs(sum(maxima) - most) > 1e-9 or record.get("max_points") != most:
        return f"a maximum other than the check's {format_points(most)}"
    if record.get("points") != sum(points) or record["points"] > most:
        return f"{record.get('points')!r} points, more than its cases' or the check's maximum"
    return None


def collect(nb, records: dict[str, dict], report: NotebookReport) -> None:
    """Fill report.checks from the judge's accepted records; a check without one scores 0, with the reason."""
    for name in expected_checks(nb):
        record = records.get(name, {})
        if record and "not_run" not in record:
            report.checks.append(record)
            continue
        reason = (
            record.get("not_run")
            or _cell_error(nb, name)
            or (f"the notebook {report.status}" if report.status != "ok" else "the check was never called")
        )
        report.checks.append(
            {"check": name, "points": 0.0, "max_points": max_points(name), "cases": [], "not_run": reason}
        )


def _environment(jobs: int, tmp: Path, **extra: str) -> dict:
    """The environment of a kernel or a judge: this package first on the path, quick runs, threads, its own TMPDIR."""
    env = dict(os.environ)
    env.pop(GRADING_RUN_ENV, None)
    env.setdefault("MINIGRPO_QUICK", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env["TMPDIR"] = str(tmp)  # removed with the notebook's folder
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, _cpu_count() // jobs))
    return {**env, **extra}


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class JudgeFailed(Exception):
    """The judge of one notebook did not give usable records: that notebook's checks score 0."""


async def _judge(nb, km, kernel_pid: int, budget: float, jobs: int, folder: Path) -> list:
    """Run the judge on a notebook whose kernel is still up; its records, authenticated."""
    key = secrets.token_bytes(32)
    connection = {k: v.decode() if isinstance(v, bytes) else v for k, v in km.get_connection_info().items()}
    (folder / "judge").mkdir()
    request = {
        "key": key.hex(),
        "checks": expected_checks(nb),
        "calls": check_calls(nb),
        "cells": [cell.source if cell.cell_type == "code" else "" for cell in nb.cells],
        "connection": connection,
        "kernel_pid": kernel_pid,
        "workdir": str(folder / "judge"),  # request and response files, exchanged with the kernel
    }
    process = await asyncio.create_subprocess_exec(
        *judge_command(PACKAGE_ROOT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_environment(jobs, folder / "tmp"),
        cwd=os.path.abspath(os.sep),  # a relative entry of its path is looked up where a learner cannot write
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(json.dumps(request).encode() + b"\n"), budget)
    except asyncio.TimeoutError:
        raise JudgeFailed(f"its checks ran longer than {budget:g} s") from None
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    if process.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise JudgeFailed(f"the judge stopped with exit code {process.returncode}: {last}")
    return read_answer(out, key)


def read_answer(out: bytes, key: bytes) -> list:
    """The judge's records from its stdout: the last line whose HMAC verifies (a line forged by others does not)."""
    from minigrpo.grading.judge import sign

    for line in reversed(out.decode(errors="replace").splitlines()):
        try:
            answer = json.loads(line)
            records, mac = answer["records"], answer["mac"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(mac, str) and hmac.compare_digest(sign(key, records), mac):
            return records
    raise JudgeFailed("no answer from the judge passed authentication")


def _check_cells_ran(nb) -> bool:
    """Did any cell that calls a check execute? (If none did, there is nothing to judge.)"""
    names = expected_checks(nb)
    return any(
        cell.cell_type == "code" and cell.get("execution_count") and any(n in cell.source for n in names)
        for cell in nb.cells
    )


async def _grade_notebook(
    path: Path, timeout: float, jobs: int, workdir: Path, interrupts: Interrupts
) -> NotebookReport:
    import nbformat  # lazy, like the kernels module: an optional dependency
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    from minigrpo.grading import kernels

    report = NotebookReport(str(path))
    try:
        nb = nbformat.reads(read_notebook(path), as_version=4)
    except Exception as error:  # this notebook scores 0; the others are still graded
        report.status = "unreadable"
        reason = str(error) if isinstance(error, NotebookRefused) else last_traceback_line(error)
        report.errors.append(f"cannot read {printable(str(path))}: {reason}")
        return report
    token = secrets.token_hex(16)
    folder = workdir / f"notebook-{token}"  # its kernel's spec, connection file and TMPDIR; the judge's files
    (folder / "tmp").mkdir(parents=True)
    client = kernels.grading_client(nb, folder, path.parent.resolve(), timeout)
    started, kernel_pid, records = time.monotonic(), None, []
    try:
        try:
            env = _environment(jobs, folder / "tmp", **{GRADING_RUN_ENV: token})
            kernel_pid = await kernels.start_kernel(client, env)
            await client.async_start_new_kernel_client()
        except Exception as error:  # no kernel: grading could not run
            reason = f"could not start a kernel for {printable(str(path))}: {last_traceback_line(error)}"
            raise GradingError(reason) from error
        try:
            code_cells = (index for index, cell in enumerate(nb.cells) if cell.cell_type == "code")
            for count, index in enumerate(code_cells, start=1):
                remaining = timeout - (time.monotonic() - started)
                if remaining <= 0:
                    raise CellTimeoutError("the notebook ran out of time")
                client.timeout = max(1, int(math.ceil(remaining)))
                # execution_count from here, not from the kernel's output messages: they may be lost (limits.py)
                await client.async_execute_cell(nb.cells[index], index, execution_count=count)
        except CellTimeoutError:
            report.status = "timed out"
            report.errors.append(f"the notebook ran longer than --timeout {timeout:g} s; later cells did not run")
            await client.km.interrupt_kernel()  # stop the running cell, so the judge can reach the kernel
        except DeadKernelError as error:
            report.status = "kernel died"
            report.errors.append(f"the kernel died: {last_traceback_line(error)}")
        interrupts.check()  # a signal, which nbclient may have reported as a dead kernel
        client.kc.stop_channels()  # what the kernel prints while the judge calls it is read by no one
        if alive(kernel_pid) and _check_cells_ran(nb):
            try:
                records = await _judge(nb, client.km, kernel_pid, timeout + 60, jobs, folder)
            except JudgeFailed as failed:
                report.errors.append(f"grading failed: {failed}")
                records = [{"check": name, "not_run": f"grading failed: {failed}"} for name in expected_checks(nb)]
    finally:  # on every way out, an interrupt (cancellation) included: the kills first, they cannot be cut short
        kill_leftovers(kernel_pid, GRADING_RUN_ENV, token)
        shutil.rmtree(folder, ignore_errors=True)
        await kernels.stop_kernel(client)
    report.seconds = time.monotonic() - started  # the notebook's run and the judging of its checks (which may train)
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error" and output["ename"] != "NotImplementedError":
                report.errors.append(f"{output['ename']}: {output['evalue']}")
    report.notes += [note for note in (client.budget.note(), client.lost_output_note()) if note]
    accepted, problems = accept_records(records, expected_checks(nb))
    report.errors += problems
    collect(nb, accepted, report)
    return report


async def _grade_all(notebooks: list[Path], timeout: float, jobs: int, workdir: Path, interrupts, done) -> None:
    """Grade every notebook, `jobs` at a time; done(index, report) as each one finishes."""
    gate = asyncio.Semaphore(jobs)

    async def one(index: int, path: Path) -> None:
        async with gate:
            done(index, await _grade_notebook(path, timeout, jobs, workdir, interrupts))

    await asyncio.gather(*(one(i, p) for i, p in enumerate(notebooks)))


def grade_notebooks(
    paths: Sequence[str | Path], timeout: float = 600, jobs: int | None = None, progress=None
) -> list[NotebookReport]:
    """Execute each notebook in its own kernel (`jobs` at a time) and collect its checks.

    SIGINT or SIGTERM (in the main thread) stops grading: raises GradingInterrupted with the reports finished
    before the signal; the notebooks being graded then are cleaned up and get no report.
    """
    notebooks = [Path(p) for p in paths]
    if jobs is None:
        jobs = int(os.environ.get("MINIGRPO_GRADE_JOBS", "0")) or min(len(notebooks), _cpu_count(), 4)
    jobs = max(1, jobs)
    reports: dict[int, NotebookReport] = {}
    with Interrupts() as interrupts, without_working_folder():

        def done(index: int, report: NotebookReport) -> None:
            if interrupts.signal is None:  # a notebook that finishes after the signal is not graded
                reports[index] = report
                (progress or (lambda report: None))(report)

        async def grade_all(workdir: Path) -> None:
            interrupts.watch(asyncio.current_task())
            await _grade_all(notebooks, timeout, jobs, workdir, interrupts, done)

        with tempfile.TemporaryDirectory(prefix="minigrpo-grade-") as tmp:
            try:
                asyncio.run(grade_all(Path(tmp)))
            except asyncio.CancelledError:
                if interrupts.signal is None:
                    raise
    if interrupts.signal is not None:
        graded = [reports[i] for i in sorted(reports)]
        not_graded = [p for i, p in enumerate(notebooks) if i not in reports]
        raise GradingInterrupted(interrupts.signal, graded, not_graded)
    return [reports[i] for i in range(len(notebooks))]


def format_scores(reports: list[NotebookReport], not_graded: Sequence[Path] = ()) -> str:
    """The score table: exercise, check, points, max; then a total, what failed, and what was not graded.

    Every name and message a learner made is escaped (`limits.printable`): one line of text is one line of the table.
    """
    names = [printable(r.exercise) for r in reports]
    width = max([len("exercise")] + [len(n) for n in names])
    check_width = max([len("(no checks)")] + [len(c["check"]) for r in reports for c in r.checks])
    lines = [f"{'exercise':<{width}}  {'check':<{check_width}}  {'points':>6}  {'max':>4}"]
    lines.append("-" * len(lines[0]))
    for name, report in zip(names, reports, strict=True):
        rows = report.checks or [{"check": "(no checks)", "points": 0, "max_points": 0}]
        for check in rows:
            lines.append(
                f"{name:<{width}}  {check['check']:<{check_width}}  "
                f"{format_points(check['points']):>6}  {format_points(check['max_points']):>4}"
            )
    lines.append("-" * len(lines[0]))
    total, most = sum(r.points for r in reports), sum(r.max_points for r in reports)
    lines.append(f"{'total':<{width}}  {'':<{check_width}}  {format_points(total):>6}  {format_points(most):>4}")
    details, notes = [], []
    for name, report in zip(names, reports, strict=True):
        if report.status != "ok":
            details.append(f"{name}: {report.status}" + (f" ({report.errors[0]})" if report.errors else ""))
        for check in report.checks:
            if "not_run" in check:
                details.append(f"{name} / {check['check']}: did not run ({check['not_run']})")
            for case in check.get("cases", []):
                if not case["passed"]:
                    details.append(f"{name} / {check['check']} / {case['name']}: {case['message']}")
        notes += [f"{name}: {note}" for note in report.notes]
    if details:
        lines += ["", "what lost points:"] + [f"  {printable(d)}" for d in details]
    if notes:
        lines += ["", "notes:"] + [f"  {printable(n)}" for n in notes]
    if not_graded:
        lines += ["", "not graded (grading was interrupted; no score recorded):"]
        lines += [f"  {printable(str(p))}" for p in not_graded]
    return "\n".join(lines)


def say(text: str, stream=None) -> None:
    """Print `text` so that any stream can write it: what its encoding lacks is written as a backslash escape."""
    stream = stream or sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream, flush=True)


CSV_COLUMNS = ("path", "exercise", "check", "points", "max_points", "status", "seconds", "lost_points")


def csv_rows(reports: list[NotebookReport]) -> list[dict]:
    """One row per notebook and check, for an instructor's spreadsheet: CSV_COLUMNS; lost_points says what failed
    (the cases' names and hints, or why the check did not run). A notebook with no checks gets one row."""
    rows = []
    for report in reports:
        common = {"path": report.path, "exercise": report.exercise, "status": report.status}
        common["seconds"] = round(report.seconds, 1)
        for check in report.checks or [{"check": "", "points": 0.0, "max_points": 0.0}]:
            lost = [f"{c['name']}: {c['message']}" for c in check.get("cases", []) if not c["passed"]]
            lost += [f"did not run: {check['not_run']}"] if "not_run" in check else []
            lost += [] if report.checks else report.errors[:1]
            rows.append(
                {
                    **common,
                    "check": check["check"],
                    "points": format_points(check["points"]),
                    "max_points": format_points(check["max_points"]),
                    "lost_points": " | ".join(lost),
                }
            )
    return rows


def write_csv(reports: list[NotebookReport], path: str | Path) -> None:
    """csv_rows(reports) to `path`. A text a learner made is written escaped (`limits.printable`), and one that a
    spreadsheet would run as a formula (=, +, -, @ first) starts with an apostrophe."""
    import csv

    def cell(value):
        text = printable(str(value)) if isinstance(value, str) else value
        return "'" + text if isinstance(text, str) and text[:1] in ("=", "+", "-", "@") else text

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in csv_rows(reports):
            writer.writerow({key: cell(value) for key, value in row.items()})


def grade_command(
    path: str, as_json: bool = False, timeout: float = 600, jobs: int | None = None, csv_path: str | None = None
) -> int:
    """`python -m minigrpo grade PATH`: 0 whatever the score; 2 for a bad PATH, 1 when grading could not run,
    128 + the signal's number when SIGINT or SIGTERM stopped it (130, 143). jobs: notebooks graded at once
    (None: $MINIGRPO_GRADE_JOBS, else up to 4); csv_path: also write csv_rows there."""
    try:
        notebooks = find_notebooks(path)
    except FileNotFoundError as error:
        say(f"error: {error}", sys.stderr)
        return 2
    csv_path = None if csv_path is None else os.path.abspath(csv_path)  # grading leaves the working folder

    def progress(report: NotebookReport) -> None:
        score = f"{format_points(report.points)}/{format_points(report.max_points)}"
        status = "" if report.status == "ok" else f" ({report.status})"
        say(f"graded {printable(report.path)}: {score} in {report.seconds:.1f} s{status}", sys.stderr)

    started, not_graded, stopped = time.monotonic(), [], None
    try:
        reports = grade_notebooks(notebooks, timeout=timeout, jobs=jobs, progress=progress)
    except GradingError as error:
        say(f"error: {error}", sys.stderr)
        return 1
    except GradingInterrupted as interrupted:
        reports, not_graded, stopped = interrupted.reports, interrupted.not_graded, interrupted
    total, most = sum(r.points for r in reports), sum(r.max_points for r in reports)
    if as_json:
        summary = {
            "path": str(path),
            "points": total,
            "max_points": most,
            "seconds": round(time.monotonic() - started, 2),
            "limits": LIMITS,
        }
        if stopped:
            summary |= {"interrupted": stopped.signal_name, "not_graded": [str(p) for p in not_graded]}
        say(json.dumps({**summary, "notebooks": [r.to_dict() for r in reports]}, indent=1))  # ASCII: any stdout
    else:
        say(format_scores(reports, not_graded))
    if csv_path is not None:
        write_csv(reports, csv_path)
    if stopped:
        names = ", ".join(printable(str(p)) for p in not_graded) or "none"
        say(
            f"interrupted by {stopped.signal_name}: grading stopped; not graded (no score recorded): {names}",
            sys.stderr,
        )
        return 128 + stopped.signal_number
    return 0

"""Grading notebooks: run each one in its own kernel, judge its exercise's checks, report the points.

`python -m minigrpo grade PATH` (`minigrpo.grading.reports.gradebook`) finds the notebooks and their students, and calls
`grade_notebooks` here; this module grades them, `jobs` at a time.

How a notebook is graded, and why its score can be trusted
-----------------------------------------------------------
1. Read it: only a regular file of at most 16 MiB, inside the graded folder, is
   read as a notebook (`minigrpo.grading.sandbox.limits`); anything else named *.ipynb (a
   symbolic link out of the folder too) scores 0 as unreadable, with the reason,
   and a file that does not parse is reported by its error's type, never its bytes.
   Of a notebook that parses it keeps the exercise's stamp and each cell's type
   and source (`kept`): a cell without a type, whose source is not text, or whose
   code is nested too deeply for the grader's parser, makes the notebook
   unreadable, and the outputs, execution counts and metadata saved in it are
   never read (an error saved in a cell that never runs is not the run's).
2. Know its exercise (`minigrpo.grading.exercises.identify`): the stamp in its
   metadata, else its file name, else the checks it calls. The exercise's checks
   and maximum are what it is graded on: a check of the exercise that the notebook
   does not call scores 0 of its points ("was its cell deleted?"), a check of
   another exercise is ignored, and an unreadable notebook scores 0 of the
   exercise's maximum. Another version's handout whose checks changed is refused
   (0 points, with the reason) without being run. An empty notebook (no code in
   it) is not run either: each check scores 0, saying that nothing was handed in.
3. Run it: nbclient executes the notebook in a fresh kernel of the current
   Python (`allow_errors=True`, so a cell that raises NotImplementedError does
   not stop the cells after it), under a SID of its own (setsid), with
   $MINIGRPO_GRADING_RUN set to a random token, its stdin, stdout and stderr
   /dev/null, and its connection file, kernel spec and TMPDIR in a folder of the
   grader's temporary folder (`minigrpo.grading.sandbox.kernels`). Its checks only
   remember the function they were given. Of its output the grader keeps at
   most 1 MiB per cell and 8 MiB per notebook, and reads only the errors.
4. Judge it: a separate process of the package's own code
   (`minigrpo.grading.judge`), started isolated from every folder a learner may
   write (`processes.judge_command`), runs the cases of every check of the exercise
   that the notebook's kernel ran, whatever name the notebook called it by (an
   alias, `getattr`), computing the expected answers and the points itself, its
   random cases drawn from a secret it draws at every grading; it calls the learner's functions in the kernel and gets
   back plain data only (`minigrpo.grading.sandbox.remote`). Patching the package in the
   kernel, or writing anything anywhere, changes no point: learner code never
   runs in the judge. A function that is, wraps, calls or runs the package's own
   solution of the exercise earns 0 for that check, with the reason
   (`minigrpo.grading.references`).
5. Accept it: the judge's records come back signed (HMAC under a key only the
   runner and the judge know). A record for a check the judge was not asked for,
   with points above the check's maximum, or malformed, is rejected: that check
   scores 0 with the reason. A notebook that cannot be read, times out, kills
   its kernel or breaks its judge scores 0 on its own checks only, and so does
   one on which the grader itself raises an error no rule foresaw (`_unforeseen`).
6. Clean up, however grading ends: every process with the kernel's SID, and
   every process carrying the token, is killed (`minigrpo.grading.sandbox.processes`),
   and the notebook's folder (connection file included) is removed.

Time
----
A notebook's limit covers its kernel and its cells, and the judging of its checks
as far as it goes: the judge always has at least its checks' cases' own limits
(`judge_budget`), so a notebook whose cells were slow still has every check judged,
and a case that runs long costs its own points. By default it is its exercise's `time_limit` (3x the time its
solution takes to grade, `minigrpo.grading.exercises`); --timeout sets one
limit for every notebook. A cell may run for at most half the limit (CELL_SHARE):
a cell that hangs is interrupted (KeyboardInterrupt) and the cells after it
still run and are judged; when it does not stop, or the limit is spent, the
notebook is stopped and says that it ran out of time. A cell is named as the learner
finds it (`cells.cell_label`: "code cell 3 (`while True:`)", code cells counted from 1).
The judge splits its time
between the checks, each getting at least its cases' own limits, so an infinite
loop in one learner function leaves the next check its time. While notebooks run, `progress` gets a
line at least every HEARTBEAT_S seconds ("12/41 graded; running: ...").

A check that the notebook calls but that did not run (its cell failed first, or
the notebook timed out) scores 0 out of its maximum, with the reason: the error of
its cell, said after the import error of an earlier cell when its cell's error is a
NameError that import would likely have prevented. The
grader sets MINIGRPO_QUICK=1 unless it is already set, so the notebooks'
training cells stay short.

SIGINT (Ctrl-C) or SIGTERM stops grading: the notebooks being graded are cleaned
up as above, none of them gets a score, the report lists the notebooks that were
not graded, and the command exits with 128 + the signal's number (130, 143).
Names and messages a learner made are printed escaped (`limits.printable`).

On Linux each kernel runs in an operating-system sandbox (`sandbox.bubblewrap`):
its scratch folder, read-only Python and package, no other process, no network.
Where none can run, the learner's code runs with the grader's user account: it
cannot change a score through Python, files or the kernel's output, but it can
read files, write to the grader's open files through /proc, or disturb other
processes of that user (`grade` says so, and `--require-sandbox` refuses).
"""

from __future__ import annotations

import ast
import asyncio
import functools
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

from minigrpo.grading.cells import TooDeep, cell_label, code_cell_numbers, python_of
from minigrpo.grading.exercises import EXERCISES, METADATA_KEY, TIME_LIMIT_FACTOR, identify, owner
from minigrpo.grading.framework import (
    CASES,
    GRADING_RUN_ENV,
    format_points,
    last_traceback_line,
    max_points,
    time_needed,
)
from minigrpo.grading.sandbox import bubblewrap
from minigrpo.grading.sandbox.limits import NotebookRefused, printable, read_notebook
from minigrpo.grading.sandbox.processes import (
    Interrupts,
    alive,
    judge_command,
    kill_leftovers,
    kill_strays,
    without_working_folder,
)
from minigrpo.grading.sandbox.remote import INTERRUPT_WAIT_S

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder that holds the minigrpo package: the kernels import this copy, not another one on their path."""


_CHECK_CALL_RE = re.compile(r"\b(check_\w+)\s*\(")
CELL_SHARE = 0.5
"""A cell may run for at most this share of its notebook's limit: after a cell that hangs, the others still run."""
HEARTBEAT_S = 20.0
"""While notebooks run, a progress line at least this often (seconds)."""
JUDGE_MARGIN_S = INTERRUPT_WAIT_S + 1.0
"""The judge ends its last case this long before the notebook's deadline: time to stop a learner's function
(INTERRUPT_WAIT_S) and send the records before the runner kills the judge at the deadline."""
KERNEL_ANSWER_S = 10.0
"""After interrupting a cell that ran out of time, how long the kernel has to answer before it counts as stuck."""
JUDGE_START_S = 3.0
"""About how long the judge takes to start (it imports torch and the package): with less time left it is not run."""


@dataclass
class Submission:
    """One notebook to grade, and whose it is (`layouts.read_layout` finds them in a class's folders)."""

    path: Path
    student: str
    folder: Path | None = None  # the graded folder it was found in: nothing outside it is read (None: path alone)


@dataclass
class NotebookReport:
    """The grade of one notebook: one CheckResult-like dict per check of its exercise, and how the run went.

    exercise: the exercise's id (None: not identified, graded on the checks it calls; `exercises.identify`).
    """

    path: str
    checks: list[dict] = field(default_factory=list)
    status: str = "ok"  # ok | timed out | kernel died | unreadable | refused
    seconds: float = 0.0  # running the notebook and judging its checks
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the grader left out or noticed: no points lost
    student: str = ""  # "" : the file's stem
    exercise: str | None = None
    identified_by: str = ""  # metadata | file name | checks | "" (not identified)
    time_limit: float = 0.0

    def __post_init__(self):
        self.student = self.student or self.name

    @property
    def name(self) -> str:
        """The notebook's file stem."""
        return Path(self.path).stem

    @property
    def points(self) -> float:
        return sum(c["points"] for c in self.checks)

    @property
    def max_points(self) -> float:
        return sum(c["max_points"] for c in self.checks)

    def to_dict(self) -> dict:
        return {
            "student": self.student,
            "exercise": self.exercise,
            "identified_by": self.identified_by,
            "path": self.path,
            "points": self.points,
            "max_points": self.max_points,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "time_limit": self.time_limit,
            "errors": self.errors,
            "notes": self.notes,
            "checks": self.checks,
        }


KERNEL_START_ATTEMPTS = 2
"""A kernel that does not answer at start is started once more, on new ports. Kernels started at the same moment
(a class graded with --jobs, other Jupyter kernels on the machine) each pick free TCP ports, and two can pick the same
one: one kernel cannot bind it, and its client waits on the other's until nbclient gives up (60 s)."""


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
    """The checks a notebook's code cells call, by their names or by an alias (`from minigrpo.grading import
    check_kl_k3 as check`), in order of first appearance."""
    names: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            names += [n for n in _CHECK_CALL_RE.findall(cell.source) if n in CASES and n not in names]
    return names + [name for name in check_calls(nb) if name not in names]


IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")


def _cell_error(nb, check: str) -> str | None:
    """'NameError: ...' from the first cell that calls `check` and failed, if any. A NameError that follows an import
    that failed in an earlier cell is said after that import's error, which is the one to fix (the missing name is
    most likely one the import was to bind)."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and check in cell.source and (error := _error_of(cell)) is not None:
            said = f"{error['ename']}: {error['evalue']}"
            if error["ename"] != "NameError":
                return said
            for earlier, before in enumerate(nb.cells[:index]):
                failed = _error_of(before) if before.cell_type == "code" else None
                if failed is not None and failed["ename"] in IMPORT_ERRORS:
                    return (
                        f"{failed['ename']}: {failed['evalue']}, in {cell_label(nb.cells, earlier)}; "
                        f"this check's cell then raised {said}"
                    )
            return said
    return None


def _error_of(cell) -> dict | None:
    """The error output of a code cell that ran and raised, if any."""
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def check_calls(nb) -> dict[str, dict]:
    """check -> {"cell": index in nb.cells, "argument": the expression passed} of its last call in the code cells
    (cell magics' bodies included), whatever name the check is called by: its own, an attribute (`grading.check_x`),
    or an alias bound by an import or an assignment (`as check`, `check = check_x`)."""
    calls: dict[str, dict] = {}
    aliases: dict[str, str] = {}  # a name the notebook binds -> the check it stands for
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "check_" not in cell.source and not aliases:
            continue
        for source, tree in python_of(cell.source):
            aliases.update(_check_aliases(tree))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                name = name if name in CASES else aliases.get(getattr(node.func, "id", None))
                if name in CASES:
                    passed = node.args[0] if node.args else (node.keywords[0].value if node.keywords else None)
                    argument = ast.get_source_segment(source, passed) if passed is not None else None
                    calls[name] = {"cell": index, "argument": argument}
    return calls


def _check_aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound to a check in `tree`: `from minigrpo.grading import check_x as y`, `y = check_x`, `y = g.check_x`."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minigrpo"):
            aliases.update((a.asname, a.name) for a in node.names if a.asname and a.name in CASES)
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            named = getattr(node.value, "id", None) or getattr(node.value, "attr", None)
            if named in CASES or named in aliases:
                check = named if named in CASES else aliases[named]
                aliases.update((t.id, check) for t in node.targets if isinstance(t, ast.Name))
    return aliases


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


NOT_FOUND = "this check was not found in your notebook (was its cell deleted?)"
EMPTY = "nothing was handed in: your notebook has no code in it"


def has_code(nb) -> bool:
    """Does any code cell hold something? A notebook without (saved empty, or with text only) is not run."""
    return any(cell.cell_type == "code" and cell.source.strip() for cell in nb.cells)


def graded_checks(nb, exercise: str | None) -> list[str]:
    """The checks a notebook is graded on: its exercise's, all of them; a notebook of no exercise, those it calls."""
    if exercise is not None:
        return list(EXERCISES[exercise].checks)
    return expected_checks(nb) if nb is not None else []


def ignored_checks(nb, exercise: str | None) -> list[str]:
    """A note for each check the notebook calls that its exercise does not own (pasted from another exercise)."""
    if exercise is None or nb is None:
        return []
    return [
        f"{name} belongs to exercise {owner(name).id}, not {exercise}: ignored"
        for name in expected_checks(nb)
        if name not in EXERCISES[exercise].checks
    ]


def collect(nb, records: dict[str, dict], report: NotebookReport, checks: Sequence[str] | None = None) -> None:
    """Fill report.checks from the judge's accepted records; a check without one scores 0 of its points, with the
    reason. checks: those graded (default: `graded_checks(nb, report.exercise)`); nb: None when it was unreadable."""
    called = expected_checks(nb) if nb is not None else []
    for name in graded_checks(nb, report.exercise) if checks is None else checks:
        record = records.get(name, {})
        if record and "not_run" not in record:
            report.checks.append(record)
            continue
        if record.get("not_run"):
            reason = record["not_run"]
        elif nb is None:
            reason = f"the notebook is {report.status}"
        elif not has_code(nb):
            reason = EMPTY
        elif name not in called:
            reason = NOT_FOUND
        else:
            reason = _cell_error(nb, name) or (
                f"the notebook {report.status}" if report.status != "ok" else "the check was never called"
            )
        report.checks.append(
            {"check": name, "points": 0.0, "max_points": max_points(name), "cases": [], "not_run": reason}
        )


def _sandbox(folder: Path, notebook_folder: Path):
    """What turns a kernel's command into its sandboxed one: it writes to `folder` only and never sees the class's
    `notebook_folder`; it reads the package, `minigrpo/` of this checkout, and nothing else of it."""
    return functools.partial(
        bubblewrap.sandboxed, scratch=folder, package=PACKAGE_ROOT / "minigrpo", hidden=notebook_folder
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


async def _judge(nb, checks: list[str], km, kernel_pid: int, deadline: float, jobs: int, folder: Path) -> list:
    """Run the judge on `checks` of a notebook whose kernel is still up, by `deadline` (time.monotonic()); its
    records, authenticated. The judge ends its last case JUDGE_MARGIN_S before the deadline, when it is killed."""
    key = secrets.token_bytes(32)
    connection = {k: v.decode() if isinstance(v, bytes) else v for k, v in km.get_connection_info().items()}
    # a new name: the kernel knows the notebook's folder (its TMPDIR is in it) and may have made any name there
    exchange = tempfile.mkdtemp(prefix="judge-", dir=folder)
    budget = judge_budget(checks, deadline - time.monotonic())
    request = {
        "key": key.hex(),
        "checks": checks,
        "calls": check_calls(nb),
        "cells": [cell.source if cell.cell_type == "code" else "" for cell in nb.cells],
        "connection": connection,
        "kernel_pid": kernel_pid,
        "interrupt_mode": km.kernel_spec.interrupt_mode,  # "message" in the sandbox, which passes no signal on
        "workdir": exchange,  # request and response files, exchanged with the kernel
        "deadline": time.time() + budget - JUDGE_MARGIN_S,  # wall clock: the judge's own start-up counts
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
    process.stdin.write(json.dumps(request).encode() + b"\n")
    await process.stdin.drain()
    process.stdin.close()
    out, err, on_time = await _read_until(process, budget)
    if not on_time:
        records = _last_records(out, key)
        done = {r.get("check") for r in records if isinstance(r, dict)}
        late = "not judged: the notebook's time limit was spent before this check was judged"
        return records + [{"check": name, "not_run": late} for name in checks if name not in done]
    if process.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise JudgeFailed(f"the judge stopped with exit code {process.returncode}: {last}")
    return read_answer(out, key)


def judge_budget(checks: Sequence[str], time_left: float) -> float:
    """Seconds the judge of `checks` gets: what is left of the notebook's limit, and never less than its checks'
    cases' own limits (`framework.time_needed`), its start-up and its margin: a notebook whose cells were slow
    still has every check judged, and a case that runs long costs its own points only."""
    return max(time_left, sum(time_needed(name) for name in checks) + JUDGE_START_S + JUDGE_MARGIN_S)


async def _read_until(process, budget: float) -> tuple[bytes, bytes, bool]:
    """The judge's stdout and stderr until it exits or `budget` seconds pass (then it is killed): (out, err, exited)."""
    out, err = bytearray(), bytearray()

    async def drain(stream, into: bytearray) -> None:
        while chunk := await stream.read(65536):
            into += chunk

    # tasks, not a gather: a gather that a signal cancels ends with an error no one reads, which asyncio prints
    waits = (drain(process.stdout, out), drain(process.stderr, err), process.wait())
    readers = [asyncio.ensure_future(wait) for wait in waits]
    try:
        finished, running = await asyncio.wait(readers, timeout=budget)
        for reader in finished:
            reader.result()  # an error of reading is raised here, not left for asyncio to print
        return bytes(out), bytes(err), not running
    finally:
        for reader in readers:
            reader.cancel()
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


def _last_records(out: bytes, key: bytes) -> list:
    try:
        return read_answer(out, key)
    except JudgeFailed:
        return []


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


def _cells_ran(nb, stuck: int | None) -> bool:
    """Did any code cell execute, other than one still stuck? (If none did, no check was called.)"""
    return any(
        cell.cell_type == "code" and cell.get("execution_count") and index != stuck
        for index, cell in enumerate(nb.cells)
    )


def default_time_limit(exercise: str | None, called: Sequence[str]) -> float:
    """A notebook's limit without --timeout: its exercise's; for a notebook of no exercise, the sum of the limits of
    the exercises whose checks it calls (the shortest limit when it calls none)."""
    if exercise is not None:
        return EXERCISES[exercise].time_limit
    owners = {owner(name) for name in called} - {None}
    return sum(e.time_limit for e in owners) or min(e.time_limit for e in EXERCISES.values())


def _limit_words(limit: float, exercise: str | None, explicit: bool) -> str:
    """'36 s (3x the 12 s its solution takes to grade; --timeout sets another)'."""
    if explicit:
        return f"{limit:g} s (--timeout)"
    if exercise is None:
        return f"{limit:g} s (its checks' exercises' limits; --timeout sets another)"
    solution = EXERCISES[exercise].solution_seconds
    return f"{limit:g} s ({TIME_LIMIT_FACTOR}x the {solution:g} s its solution takes to grade; --timeout sets another)"


def _read(path: Path, folder: Path | None = None):
    """(the notebook as the grader keeps it, None), or (None, why it cannot be read): the error's type or the first
    cell that is not a cell, never what the file holds."""
    import nbformat  # lazy, like the kernels module: an optional dependency

    try:
        text = read_notebook(path, folder)
    except NotebookRefused as refused:
        return None, f"cannot read {printable(str(path))}: {refused}"
    try:
        # not nbformat.reads: it only logs (quoting the file) what breaks Jupyter's schema, which kept() says
        parsed = nbformat.convert(nbformat.reader.reads(text), 4)
    except Exception as error:  # this notebook scores 0; the others are still graded
        # nbformat's messages quote the file's text: the type is enough to say what to fix
        reason = f"{type(error).__name__}: not a notebook in Jupyter's format (JSON, nbformat 4)"
        return None, f"cannot read {printable(str(path))}: {reason}"
    try:
        return kept(parsed), None
    except NotANotebook as problem:
        return None, f"cannot read {printable(str(path))}: {problem}"


class NotANotebook(ValueError):
    """A parsed notebook that the grader cannot read as one: the message names the first part that is wrong."""


_JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", list: "a list"}


def kept(nb):
    """What the grader keeps of a parsed notebook: its exercise's stamp, and each cell's type and source.

    Nothing else a learner saved is read: not the saved outputs (an error in a cell that never runs in the grader
    is not the notebook's error), not the execution counts, not the cells' metadata. Raises NotANotebook for the
    first cell that is not a cell (no cell_type, a source that is not text), or whose code is nested too deeply for
    the grader to read what it runs (`cells.TooDeep`).
    """
    import nbformat

    metadata = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    cells = nb.get("cells")
    if not isinstance(cells, list):
        raise NotANotebook("its cells are not a list: not a notebook in Jupyter's format (JSON, nbformat 4)")
    v4 = nbformat.v4
    new_cell = {"code": v4.new_code_cell, "markdown": v4.new_markdown_cell, "raw": v4.new_raw_cell}
    clean = []
    for index, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise NotANotebook(f"cell {index} is not a cell (a JSON object)")
        if "cell_type" not in cell:
            raise NotANotebook(f"cell {index} has no cell_type")
        kind = cell["cell_type"]
        if not isinstance(kind, str) or kind not in new_cell:
            raise NotANotebook(f"cell {index}'s cell_type is none of code, markdown and raw")
        if "source" not in cell:
            raise NotANotebook(f"cell {index} has no source")
        source = cell["source"]
        if not isinstance(source, str):
            raise NotANotebook(f"cell {index}'s source is not text ({_JSON_TYPES.get(type(source), 'null')})")
        try:
            if kind == "code":
                python_of(source)  # read here only to know that it can be
        except TooDeep as error:
            raise NotANotebook(
                f"cell {index} is nested too deeply for the grader to read ({error}): write its expressions in steps"
            ) from None
        clean.append(new_cell[kind](source))
    stamp = {METADATA_KEY: metadata[METADATA_KEY]} if METADATA_KEY in metadata else {}
    return v4.new_notebook(cells=clean, metadata=stamp)


def _identified_report(submission: Submission, nb, timeout: float | None) -> NotebookReport:
    """A report with the notebook's exercise, its time limit and the notes on how it was identified."""
    from minigrpo import __version__

    called = expected_checks(nb) if nb is not None else []
    identity = identify(nb.metadata if nb is not None else None, submission.path, called, __version__)
    report = NotebookReport(str(submission.path), student=submission.student, notes=list(identity.warnings))
    report.exercise = identity.exercise.id if identity.exercise else None
    report.identified_by = identity.by
    report.time_limit = timeout or default_time_limit(report.exercise, called)
    report.notes += ignored_checks(nb, report.exercise)
    if identity.refusal:
        report.status = "refused"
        report.errors.append(identity.refusal)
    return report


async def _grade_notebook(
    submission: Submission, timeout: float | None, jobs: int, workdir: Path, interrupts: Interrupts, sandboxed: bool
) -> NotebookReport:
    started = time.monotonic()
    nb, unreadable = _read(submission.path, submission.folder)
    report = _identified_report(submission, nb, timeout)
    checks = graded_checks(nb, report.exercise)
    if nb is None or report.status == "refused":
        if nb is None:
            report.status = "unreadable"
            report.errors.append(unreadable)
        reason = report.errors[-1] if report.status == "refused" else None
        collect(nb, {name: {"check": name, "not_run": reason} for name in checks} if reason else {}, report, checks)
        return report
    # every check of its exercise: the kernel says which ones ran, whatever name the notebook called them by
    to_judge = checks if has_code(nb) else []  # an empty notebook has nothing to run: no kernel starts
    records = []
    if to_judge:  # a notebook of no exercise that calls no check has nothing to run
        limit_words = _limit_words(report.time_limit, report.exercise, explicit=timeout is not None)
        records = await _run_and_judge(
            nb, submission.path, report, to_judge, jobs, workdir, interrupts, started, limit_words, sandboxed
        )
    report.seconds = time.monotonic() - started  # the notebook's run and the judging of its checks (which may train)
    accepted, problems = accept_records(records, to_judge)
    report.errors += problems
    collect(nb, accepted, report, checks)
    return report


def _unforeseen(submission: Submission, timeout: float | None, error: Exception) -> NotebookReport:
    """The report of a notebook whose grading raised an error no rule of the grader foresaw: unreadable, 0 of its
    exercise's maximum (the exercise its file name names), with the error's type (its message may quote the file)."""
    report = _identified_report(submission, None, timeout)
    report.status = "unreadable"
    report.errors.append(
        f"cannot grade {printable(str(submission.path))}: the grader failed on it ({type(error).__name__}), "
        "which is the grader's mistake: the notebook scores 0, the others are graded"
    )
    collect(None, {}, report)
    return report


async def _run_and_judge(
    nb, path: Path, report, checks, jobs, workdir, interrupts, started, limit_words, sandboxed: bool
) -> list:
    """Run the notebook's cells in a kernel (in the sandbox when `sandboxed`), then judge `checks` on it, all within
    report.time_limit; the records."""
    from nbclient.exceptions import DeadKernelError

    from minigrpo.grading.sandbox import kernels

    deadline = started + report.time_limit
    token = secrets.token_hex(16)
    folder = workdir / f"nb-{token[:12]}"  # its kernel's spec, connection file and TMPDIR; the judge's files
    (folder / "tmp").mkdir(parents=True)
    sandbox, cwd = None, path.parent.resolve()
    if sandboxed:  # the kernel sees its scratch folder, with a copy of the notebook, and never the class's folder
        sandbox, cwd = _sandbox(folder, cwd), folder
        import nbformat  # lazy: an optional dependency

        nbformat.write(nb, folder / path.name)
    client = kernels.grading_client(nb, folder, cwd, report.time_limit * CELL_SHARE, sandbox)
    kernel_pid, records, stuck = None, [], None
    try:
        env = _environment(jobs, folder / "tmp", **{GRADING_RUN_ENV: token})
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            attempt_started = time.monotonic()
            try:
                kernel_pid = await kernels.start_kernel(client, env)
                await client.async_start_new_kernel_client()
                break
            except Exception as error:
                if attempt == KERNEL_START_ATTEMPTS:  # no kernel: grading could not run
                    reason = f"could not start a kernel for {printable(str(path))}: {last_traceback_line(error)}"
                    raise GradingError(reason) from error
                kill_leftovers(kernel_pid, GRADING_RUN_ENV, token)
                await kernels.stop_kernel(client)
                client.km = kernels.kernel_manager(folder, sandbox)  # new ports
                deadline += time.monotonic() - attempt_started  # the notebook's time was not its to lose
        try:
            stuck = await _run_cells(client, nb, deadline, report, limit_words)
        except DeadKernelError as error:
            report.status = "kernel died"
            report.errors.append(f"the kernel died: {last_traceback_line(error)}")
        interrupts.check()  # a signal, which nbclient may have reported as a dead kernel
        client.kc.stop_channels()  # what the kernel prints while the judge calls it is read by no one
        kill_strays(kernel_pid, GRADING_RUN_ENV, token)  # no process of the cells' may run a reference for a function
        records = await _judge_in_time(nb, checks, client, kernel_pid, deadline, jobs, folder, stuck, report)
    finally:  # on every way out, an interrupt (cancellation) included: the kills first, they cannot be cut short
        kill_leftovers(kernel_pid, GRADING_RUN_ENV, token)
        shutil.rmtree(folder, ignore_errors=True)
        await kernels.stop_kernel(client)
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            interrupted = index in client.timed_out and output.get("ename") == "KeyboardInterrupt"  # said below
            if output.get("output_type") == "error" and output["ename"] != "NotImplementedError" and not interrupted:
                report.errors.append(f"{output['ename']}: {output['evalue']}")
    report.notes += [note for note in (client.budget.note(), client.lost_output_note()) if note]
    return records


async def _run_cells(client, nb, deadline: float, report: NotebookReport, limit_words: str) -> int | None:
    """Run the code cells, each for at most the client's timeout and all of them by `deadline`; a cell that runs
    out of time is interrupted and the next one runs. Returns the cell that did not stop when interrupted, if any."""
    from minigrpo.grading.sandbox import kernels

    code_cells = [index for index, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    cell_limit = client.timeout
    for count, index in enumerate(code_cells, start=1):
        remaining = deadline - time.monotonic()
        if remaining < 1 + client.iopub_timeout:
            _out_of_time(report, nb, code_cells[count - 1 :], limit_words)
            return None
        # nbclient waits up to iopub_timeout for a cell's last output after its reply, or after interrupting it
        client.timeout = max(1, int(min(cell_limit, remaining - client.iopub_timeout)))
        # execution_count from here, not from the kernel's output messages: they may be lost (limits.py)
        await client.async_execute_cell(nb.cells[index], index, execution_count=count)
        if index not in client.timed_out:
            continue
        cell = cell_label(nb.cells, index)  # as the learner finds it: a code cell's number from 1, its first line
        if not await kernels.responsive(client, min(KERNEL_ANSWER_S, max(1.0, deadline - time.monotonic()))):
            report.status = "timed out"
            report.errors.append(
                f"{cell} ran out of time (over {client.timeout} s) and did not stop when interrupted: "
                f"the notebook ran out of time; the cells after it did not run (limit {limit_words})"
            )
            return index
        if client.timeout < cell_limit:  # the notebook's limit, not the cell's, stopped it
            _out_of_time(report, nb, code_cells[count:], limit_words, interrupted=index)
            return None
        report.errors.append(
            f"{cell} ran out of time: it ran longer than {cell_limit} s (half the notebook's limit), "
            "was interrupted, and the cells after it still ran"
        )
    return None


def _out_of_time(report: NotebookReport, nb, not_run: list[int], limit_words: str, interrupted: int | None = None):
    """The notebook's limit is spent: `not_run` (indices in nb.cells) did not run; `interrupted` was cut short."""
    report.status = "timed out"
    stopped = f"{cell_label(nb.cells, interrupted)} was interrupted; " if interrupted is not None else ""
    left = f"{code_cell_numbers(nb.cells, not_run)} did not run" if not_run else "every cell ran"
    report.errors.append(f"the notebook ran out of time: its limit is {limit_words}; {stopped}{left}")


async def _judge_in_time(nb, checks, client, kernel_pid, deadline, jobs, folder, stuck, report) -> list:
    """The judge's records for `checks`, or a reason for each when it cannot run (a stuck kernel, no time left)."""
    if not alive(kernel_pid) or not _cells_ran(nb, stuck):
        return []
    reason = None
    if stuck is not None:
        reason = (
            f"not judged: the kernel was still running {cell_label(nb.cells, stuck)}, which did not stop when "
            "interrupted"
        )
    else:  # however little of the notebook's limit is left, the judge has its checks' own time (judge_budget)
        try:
            return await _judge(nb, checks, client.km, kernel_pid, deadline, jobs, folder)
        except JudgeFailed as failed:
            report.errors.append(f"grading failed: {failed}")
            reason = f"grading failed: {failed}"
    return [{"check": name, "not_run": reason} for name in checks]


def _finished_line(done: int, total: int, report: NotebookReport) -> str:
    """'12/41 graded: jane 04_group_relative_advantages.ipynb 4/6 in 8.1 s (timed out)'."""
    score = f"{format_points(report.points)}/{format_points(report.max_points)}"
    status = "" if report.status == "ok" else f" ({report.status})"
    return (
        f"{done}/{total} graded: {printable(report.student)} {printable(Path(report.path).name)} {score} "
        f"in {report.seconds:.1f} s{status}"
    )


def _running_line(done: int, total: int, running: dict) -> str:
    """'12/41 graded; running: jane 02_x.ipynb (45 s), bob 02_x.ipynb (12 s)'."""
    now = time.monotonic()
    names = [f"{printable(s.student)} {printable(s.path.name)} ({now - t:.0f} s)" for s, t in running.values()]
    return f"{done}/{total} graded; running: {', '.join(names) or 'none'}"


async def _grade_all(
    submissions, timeout, jobs: int, workdir: Path, interrupts, done, say, heartbeat_s, sandboxed: bool
) -> None:
    """Grade every submission, `jobs` at a time; done(index, report) as each one finishes; say(line) at least
    every `heartbeat_s` seconds while notebooks run."""
    gate, running, finished = asyncio.Semaphore(jobs), {}, []

    async def one(index: int, submission: Submission) -> None:
        async with gate:
            running[index] = (submission, time.monotonic())
            try:
                report = await _grade_notebook(submission, timeout, jobs, workdir, interrupts, sandboxed)
            except GradingError:  # no kernel starts: no notebook can be graded
                raise
            except Exception as error:  # a notebook no rule foresaw costs its own points, never the class's grading
                report = _unforeseen(submission, timeout, error)
            finally:
                running.pop(index, None)
            finished.append(index)
            done(index, report, len(finished))

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(heartbeat_s)
            say(_running_line(len(finished), len(submissions), running))

    beat = asyncio.create_task(heartbeat())
    try:
        await asyncio.gather(*(one(i, s) for i, s in enumerate(submissions)))
    finally:
        beat.cancel()


def grade_notebooks(
    paths: Sequence[str | Path | Submission],
    timeout: float | None = None,
    jobs: int | None = None,
    progress=None,
    heartbeat_s: float = HEARTBEAT_S,
    sandboxed: bool | None = None,
) -> list[NotebookReport]:
    """Execute each notebook in its own kernel (`jobs` at a time) and collect its exercise's checks.

    paths: notebooks (the student is the file's stem) or Submissions; timeout: seconds per notebook (None: its
    exercise's time_limit); progress(line): a line as each notebook finishes ("12/41 graded: ...") and at least
    every `heartbeat_s` seconds while notebooks run. SIGINT or SIGTERM (in the main thread) stops grading: raises
    GradingInterrupted with the reports finished before the signal; the notebooks being graded then are cleaned up
    and get no report. sandboxed: run each kernel in the operating-system sandbox (`sandbox.bubblewrap`); None,
    the default, where one can run.
    """
    if sandboxed is None:
        sandboxed = bubblewrap.unavailable_reason() is None
    submissions = [p if isinstance(p, Submission) else Submission(Path(p), Path(p).stem) for p in paths]
    if jobs is None:
        jobs = int(os.environ.get("MINIGRPO_GRADE_JOBS", "0")) or min(len(submissions), _cpu_count(), 4)
    jobs = max(1, jobs)
    say = progress or (lambda line: None)
    reports: dict[int, NotebookReport] = {}
    with Interrupts() as interrupts, without_working_folder():

        def done(index: int, report: NotebookReport, count: int) -> None:
            if interrupts.signal is None:  # a notebook that finishes after the signal is not graded
                reports[index] = report
                say(_finished_line(count, len(submissions), report))

        async def grade_all(workdir: Path) -> None:
            interrupts.watch(asyncio.current_task())
            await _grade_all(submissions, timeout, jobs, workdir, interrupts, done, say, heartbeat_s, sandboxed)

        with tempfile.TemporaryDirectory(prefix="minigrpo-grade-") as tmp:
            try:
                asyncio.run(grade_all(Path(tmp)))
            except asyncio.CancelledError:
                if interrupts.signal is None:
                    raise
    if interrupts.signal is not None:
        graded = [reports[i] for i in sorted(reports)]
        not_graded = [s.path for i, s in enumerate(submissions) if i not in reports]
        raise GradingInterrupted(interrupts.signal, graded, not_graded)
    return [reports[i] for i in range(len(submissions))]


def say(text: str, stream=None) -> None:
    """Print `text` so that any stream can write it: what its encoding lacks is written as a backslash escape."""
    stream = stream or sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream, flush=True)

"""The grader's process hygiene: kill everything a kernel started, start the judge isolated, stop on a signal.

jupyter_client starts a kernel through setsid, so the kernel's pid is the
SID (the id setsid hands out) of everything it starts, and the grader marks its
environment with $MINIGRPO_GRADING_RUN=<token>, which every child inherits.
After grading, `kill_leftovers` kills every process with that SID (the
kernel's process group and anything else under it) and every process whose
environment carries the token: a child that took a new SID with `setsid`, or
was double-forked to detach from its parent, is still found. A process that
both calls setsid and clears its environment is not (that is deliberate evasion
of a grader that shares the learner's user account: grade exams in a container).

Linux reads /proc; elsewhere only the kernel's process group is killed.

`judge_command` starts the judge with `python -I` (isolated mode: neither the
current folder nor a PYTHON* variable nor the user's site-packages goes on its
path) and the path the grader sets: the grader's own package folder first, then
the folders the grader imports from, less its working folder; the runner starts
it in the root folder, which a learner's account cannot write. A package named
`minigrpo` (or `json`, or `IPython`) that a learner writes into the folder the
grader was started from is therefore never imported by the judge, and
`without_working_folder` keeps the grader itself from importing it later. Only
the package's own folder and the Python installation are trusted: a learner who
can write into those changes the grader itself (grade untrusted notebooks in a
container).

`Interrupts` turns SIGINT and SIGTERM during grading into the cancellation of
the grading task: every notebook's cleanup runs (its kernel and every process
with its SID or token killed, its temporary folder removed), then the runner
reports which notebooks were not graded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, SID) of a process from /proc/<pid>/stat, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp sid ...
    return fields[0], int(fields[3])


def alive(pid: int) -> bool:
    """Is `pid` running (a zombie, dead but not yet reaped, is not)?"""
    if PROC.is_dir():
        stat = _stat(pid)
        return stat is not None and stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _carries(pid: int, marker: bytes) -> bool:
    try:
        return marker in (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def leftovers(sid: int | None, env_name: str, token: str) -> list[int]:
    """Live processes whose SID is `sid`, or whose environment has env_name=token (never this process)."""
    if not PROC.is_dir():
        return []
    marker = f"{env_name}={token}".encode()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        if (sid is not None and stat[1] == sid) or _carries(pid, marker):
            found.append(pid)
    return found


def kill_leftovers(sid: int | None, env_name: str, token: str) -> list[int]:
    """SIGKILL every process with SID `sid` and every process marked with the token; returns the pids killed."""
    if sid is not None and not PROC.is_dir():
        try:
            os.killpg(sid, signal.SIGKILL)
        except OSError:
            pass
    killed = []
    for _ in range(3):  # a process may fork while we kill: look again
        pids = leftovers(sid, env_name, token)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            if pid not in killed:  # a killed process can still be listed until it dies (a loaded machine)
                killed.append(pid)
    return killed


def kill_strays(kernel_pid: int, env_name: str, token: str) -> list[int]:
    """Before the judge calls the learner's functions, SIGKILL every process the notebook's cells left running (a
    process pool, a server, a daemon), all but the kernel (and, sandboxed, the sandbox's own): a graded function
    cannot then have a process run the package's reference for it, where no watch sees. (One it starts during
    its call is refused by `references.ReferenceWatch`.) Returns the pids killed."""
    core = _sandbox_core(kernel_pid)
    spare = {kernel_pid, *core}
    found = set(leftovers(kernel_pid, env_name, token)) | set(_namespace_members(core[0]) if core else ())
    killed = []
    for pid in sorted(found - spare):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        killed.append(pid)
    return killed


def _ns_pids(pid: int) -> list[int]:
    """A process's pid in each PID namespace, from this one's down (/proc/<pid>/status NSpid); [] when gone."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return []
    line = next((line for line in status.splitlines() if line.startswith("NSpid:")), "NSpid:")
    return [int(n) for n in line.split()[1:]]


def _children(pid: int) -> list[int]:
    try:
        return [int(n) for n in (PROC / str(pid) / "task" / str(pid) / "children").read_text().split()]
    except OSError:
        return []


def _sandbox_core(sandbox_pid: int) -> list[int]:
    """[init, kernel] of a bwrap sandbox started as `sandbox_pid`: its child that is pid 1 of a PID namespace one level
    below this one, and that child's child that is pid 2 there (the command bwrap ran); [] when it is no sandbox."""
    for init in _children(sandbox_pid):
        if _ns_pids(init)[1:] == [1]:
            return [init, *(child for child in _children(init) if _ns_pids(child)[1:] == [2])]
    return []


def _namespace_members(init: int) -> list[int]:
    """Every process in the PID namespace of `init` (whatever its process group, setsid or environment)."""
    try:
        namespace = os.readlink(PROC / str(init) / "ns" / "pid")
    except OSError:
        return []
    members = []
    for entry in PROC.iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "ns" / "pid") == namespace:
                members.append(int(entry.name))
        except OSError:
            continue
    return members


# --- the judge, isolated --------------------------------------------------------------------------
_JUDGE_BOOT = "import sys; sys.path[:] = sys.argv[1:]; from minigrpo.grading.judge import main; sys.exit(main())"


def judge_command(package_root: Path) -> list[str]:
    """The command that starts the judge: `python -I -c BOOT PATH...`, BOOT setting sys.path to PATH.

    PATH: `package_root`, then this process's sys.path less its working folder. Start it in a folder no learner
    writes: a relative entry left in PATH (an installer's path hook, say) is looked up there.
    """
    path = [p for p in sys.path if not _is_working_folder(p) and p != str(package_root)]
    return [sys.executable, "-I", "-c", _JUDGE_BOOT, str(package_root), *path]


def _is_working_folder(entry: str) -> bool:
    return entry == "" or Path(entry).resolve() == Path.cwd().resolve()


@contextlib.contextmanager
def without_working_folder():
    """Keep this process from importing from its working folder (where a learner may write) until the block ends."""
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if not _is_working_folder(p)]
    try:
        yield
    finally:
        sys.path[:] = saved


# --- signals ----------------------------------------------------------------------------------------
class Interrupts:
    """While in the block, SIGINT and SIGTERM cancel the task given to `watch`; `signal` is the first one received.

    Outside the main thread (where Python cannot set handlers) it changes nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signal: int | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._received) for number in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def watch(self, task: asyncio.Task) -> None:
        """Cancel `task` on a signal (at once if one came already)."""
        self._loop, self._task = asyncio.get_running_loop(), task
        if self.signal is not None:
            task.cancel()

    def check(self) -> None:
        """Raise CancelledError if a signal came (nbclient turns a cancelled cell into DeadKernelError)."""
        if self.signal is not None:
            raise asyncio.CancelledError

    def _received(self, number: int, frame) -> None:
        if self.signal is None:
            self.signal = number
        if self._task is not None and not self._task.done():  # a second signal cancels the cleanup's waits too
            self._loop.call_soon_threadsafe(self._task.cancel)

    @property
    def name(self) -> str | None:
        return None if self.signal is None else signal.Signals(self.signal).name

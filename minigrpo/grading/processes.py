"""The grader's process hygiene: find and kill everything a notebook's kernel started.

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
"""

from __future__ import annotations

import os
import signal
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

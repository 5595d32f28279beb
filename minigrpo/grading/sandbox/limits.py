"""How much of a learner's notebook the grader reads, and how it prints what it read.

A notebook is whatever a learner left in the graded folder, and everything its
kernel sends back is the learner's too. The grader therefore reads

- only regular files as notebooks, of at most MAX_NOTEBOOK_BYTES (a FIFO, a
  device or a socket named *.ipynb is reported, never opened for a blocking
  read), and inside the graded folder (a symbolic link out of it, to a file of
  the grader's user or to another class's notebook, is refused, never
  opened): `read_notebook`;
- of a file it cannot parse, nothing: the report gives the error's type and
  the path, never the file's bytes (a link could make them anyone's);
- at most MAX_CELL_OUTPUT_BYTES of output per cell and MAX_NOTEBOOK_OUTPUT_BYTES
  per notebook (printed text, displays, errors); beyond that the output is
  dropped and the report says which cells hit the cap: `OutputBudget`. The
  kernel already cuts what a cell prints at the cell's cap
  (`limit_kernel_output`), so that printing in a loop sends small messages; a
  kernel whose code removed that cut and sends a message over
  MAX_MESSAGE_BYTES loses its output connection (`capped_context`), which
  the connection refuses before the grader holds the message: the cells still
  run and are judged, their output is no longer read;
- learner-made text (a file name, an error message) as data: `printable`
  escapes whatever a terminal would act on or an encoder refuse, so a name
  with a newline cannot forge a line of the score table, and a byte that is
  not UTF-8 cannot crash the report under a strict UTF-8 stdout.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_NOTEBOOK_BYTES = 16 * 2**20
"""A bigger .ipynb is not read: an exercise is a few hundred kB, even with its plots."""
MAX_CELL_OUTPUT_BYTES = 1 * 2**20
"""Output kept per cell (the grader reads only errors from it; no exercise prints a megabyte)."""
MAX_NOTEBOOK_OUTPUT_BYTES = 8 * 2**20
"""Output kept per notebook."""
MAX_MESSAGE_BYTES = 64 * 2**20
"""The largest message the grader accepts from a kernel: a bigger one closes the connection it came on."""
_ERROR_TEXT = 2000
"""Characters kept of an error's name, message and each traceback line: enough to say what went wrong."""

LIMITS = {
    "notebook_bytes": MAX_NOTEBOOK_BYTES,
    "cell_output_bytes": MAX_CELL_OUTPUT_BYTES,
    "notebook_output_bytes": MAX_NOTEBOOK_OUTPUT_BYTES,
    "kernel_message_bytes": MAX_MESSAGE_BYTES,
}
"""The limits, as the JSON report states them."""


class NotebookRefused(Exception):
    """The path is not a notebook the grader reads (not a regular file, too large): the message says why."""


_NOT_REGULAR = "not a regular file (a FIFO, a device or a socket): only regular files are read as notebooks"


_OUTSIDE = "a link to a file outside the graded folder: the grader reads only the files inside it"


def read_notebook(path: Path, within: Path | None = None) -> str:
    """The text of a notebook file: a regular file of at most MAX_NOTEBOOK_BYTES, read without blocking.

    within: the graded folder; a path that leads out of it (a symbolic link, to a file or through a folder) is
    refused, never opened. Raises NotebookRefused with the reason, which names no path (the caller does).
    """
    if within is not None:
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(os.path.realpath(within)):
            raise NotebookRefused(_OUTSIDE)
        path = real  # opened below with O_NOFOLLOW: a link put in its place since cannot lead out
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # looked at before opening: opening a device can act on it
            raise NotebookRefused(_NOT_REGULAR)
        # O_NONBLOCK: if a FIFO replaced the file since the stat, opening it does not wait for a writer
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
        fd = os.open(path, flags | (getattr(os, "O_NOFOLLOW", 0) if within is not None else 0))
    except OSError as error:
        raise NotebookRefused(error.strerror or str(error)) from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise NotebookRefused(_NOT_REGULAR)
        data = file.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise NotebookRefused(
            f"larger than {_mib(MAX_NOTEBOOK_BYTES)}, the most the grader reads "
            "(clear the notebook's outputs, Edit > Clear All Outputs, and hand it in again)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotebookRefused(f"not UTF-8 text ({error.reason} at byte {error.start})") from None


class OutputBudget:
    """What a notebook's cells may print before the grader stops keeping it: per cell and for the whole notebook."""

    def __init__(self, per_cell: int = MAX_CELL_OUTPUT_BYTES, per_notebook: int = MAX_NOTEBOOK_OUTPUT_BYTES):
        self.per_cell, self.per_notebook = per_cell, per_notebook
        self.used: dict[int, int] = {}  # cell index -> bytes kept
        self.capped: list[int] = []  # cells some of whose output was dropped, in order

    def keep(self, cell_index: int, size: int) -> bool:
        """Count an output of `size` bytes of cell `cell_index`; False (and the cell noted) when over a cap."""
        used = self.used.get(cell_index, 0)
        if used + size > self.per_cell or sum(self.used.values()) + size > self.per_notebook:
            if cell_index not in self.capped:
                self.capped.append(cell_index)
            return False
        self.used[cell_index] = used + size
        return True

    def note(self) -> str | None:
        """One line for the report when output was dropped, with the caps; None when all of it was kept."""
        if not self.capped:
            return None
        cells = ", ".join(str(i) for i in self.capped)
        return (
            f"output beyond {_mib(self.per_cell)} per cell or {_mib(self.per_notebook)} per notebook was not kept "
            f"(cells {cells}, counted from 0); grading does not read it"
        )


def output_size(value, depth: int = 0) -> int:
    """About how many bytes an output (a kernel message's content: strings in dicts and lists) holds."""
    if isinstance(value, str):
        return len(value)
    if depth > 8:
        return 64
    if isinstance(value, dict):
        return 64 + sum(len(str(k)) + output_size(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 64 + sum(output_size(v, depth + 1) for v in value)
    return 64  # a number, None, a bool


def trim_error(content: dict) -> dict:
    """An error output's content cut to what a report needs: its name, message and the last traceback lines."""
    return {
        **content,
        "ename": str(content.get("ename", ""))[:_ERROR_TEXT],
        "evalue": str(content.get("evalue", ""))[:_ERROR_TEXT],
        "traceback": [str(line)[:_ERROR_TEXT] for line in list(content.get("traceback") or [])[-3:]],
    }


def printable(text: str) -> str:
    """`text` with every character that is not printable written as an escape: '\\n', '\\x1b', '\\u202e'.

    A byte of a file name that was not UTF-8 (os.fsdecode keeps it as a lone surrogate U+DC80..U+DCFF) is
    written as the byte: 'caf\\xe9.ipynb'.
    """
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable():
            out.append(char)
        elif 0xDC80 <= ord(char) <= 0xDCFF:
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            out.append(char.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def limit_kernel_output(per_cell: int = MAX_CELL_OUTPUT_BYTES) -> None:
    """In a kernel: send at most `per_cell` characters of sys.stdout and sys.stderr per cell (or judge's request).

    ipykernel sends what a cell printed in one message per flush (every 0.2 s): a loop printing a gigabyte
    would send messages of hundreds of MB. The grader starts its kernels with this (`kernels.grading_client`).
    """
    import sys

    sent: dict[str, int] = {}

    def cut(message: dict) -> dict | None:
        parent = message["parent_header"].get("msg_id", "")
        used, text = sent.get(parent, 0), message["content"].get("text", "")
        sent[parent] = used + len(text)
        if used >= per_cell:
            return None  # nothing of it is sent
        if used + len(text) > per_cell:
            cut_text = text[: per_cell - used] + f"\n[output over {_mib(per_cell)} per cell: not sent to the grader]\n"
            message["content"] = {**message["content"], "text": cut_text}
        return message

    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "register_hook"):  # ipykernel's OutStream: its hooks are the sending thread's own
            stream.pub_thread.schedule(lambda stream=stream: stream.register_hook(cut))


def capped_context(context_class=None):
    """A ZMQ context whose sockets drop any incoming message over MAX_MESSAGE_BYTES (zmq.Context by default)."""
    import zmq  # here: zmq comes with jupyter_client, which a learner's `import minigrpo.grading` must not need

    context = (context_class or zmq.Context)()
    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    return context


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"

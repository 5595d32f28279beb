"""The files grading writes, each one whole or not at all.

A gradebook cut short (Ctrl-C while it is written, a full disk) reads like a whole one with fewer students. Every
file the reports write (the gradebook and the per-check CSV, each feedback file, results.json) is therefore written
to a new file in the same folder, then renamed over its path (`os.replace`, atomic within a file system): the path
holds the file it held before, or the new one, never a part of one.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_text(path: str | Path, text: str, newline: str | None = None) -> None:
    """Write `text` to `path` in UTF-8, whole or not at all; its folder is made if missing. newline: as `open`'s
    ("" for a CSV text, whose line ends the csv module wrote)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")  # "x": never an existing file
    try:
        with open(partial, "x", encoding="utf-8", newline=newline) as file:
            file.write(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise

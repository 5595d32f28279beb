"""log_completions: what the model actually wrote, every logging step (TRL's field names).

When a reward curve looks wrong, the completions say why first (a format the reward cannot parse, answers cut off
at max_completion_length, every completion of a group the same). With ``log_completions=True`` each logged step
prints a table of the last generation's completions (the first ``num_completions_to_print`` of them, or all: None,
as in TRL; the first rows are whole groups, the G answers to one prompt side by side) with each reward function's
score and the advantage, and appends every completion of that generation to ``<output_dir>/completions.jsonl``,
one JSON object a line:

    {"step": 3, "prompt": ..., "completion": "...", "<reward function>": 1.0, ..., "advantage": 0.71, <log_extra>}

(TRL writes the same columns to ``<output_dir>/completions/completions_<step>.parquet``.) The table is rich's, as
TRL prints it, where rich is installed (transformers 5 brings it), and plain text otherwise.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

TEXT_WIDTH = 60
"""Plain-text table: the characters of a prompt or completion shown (a longer one ends in '...')."""


def completion_rows(step: int, samples: dict) -> list[dict]:
    """One dict per completion: step, prompt, completion, each reward function's score, advantage, log_extra columns.

    samples: "prompt" (N prompts, strings or message lists), "completion" (N str), "rewards" ({name: N floats},
    NaN where a function returned None), optionally "advantage" (N floats) and "extra" ({column: N values})."""
    n = len(samples["completion"])
    columns = {"prompt": samples["prompt"], "completion": samples["completion"], **samples["rewards"]}
    if samples.get("advantage") is not None:
        columns["advantage"] = samples["advantage"]
    columns.update({name: values for name, values in samples.get("extra", {}).items() if len(values) == n})
    for name, values in columns.items():
        assert len(values) == n, f"{name} has {len(values)} values for {n} completions"
    return [{"step": step, **{name: values[i] for name, values in columns.items()}} for i in range(n)]


def keep_steps_up_to(path: Path, step: int) -> None:
    """After a resume at `step`: drop the rows logged after it (the resumed run logs those steps again)."""
    if path.exists():
        lines = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in lines))


def as_text(value) -> str:
    """A prompt or completion as one line: message lists as 'role: content' joined by ' | '."""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        value = " | ".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in value)
    return " ".join(str(value).split())


def cell(value) -> str:
    """A table cell: scores with 2 decimals (as TRL's table), text as one line."""
    return f"{value:.2f}" if isinstance(value, float) else as_text(value)


def plain_table(rows: list[dict], step: int) -> str:
    """rows (without "step") as a fixed-width text table under a "Step <step>" title."""
    names = [name for name in rows[0] if name != "step"]
    cells = [[cell(row[name]) for name in names] for row in rows]
    cells = [[c if len(c) <= TEXT_WIDTH else c[: TEXT_WIDTH - 3] + "..." for c in line] for line in cells]
    widths = [max(len(name), *(len(line[j]) for line in cells)) for j, name in enumerate(names)]
    lines = [f"Step {step}", "  ".join(name.ljust(w) for name, w in zip(names, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(line.rstrip() for line in lines)


def print_table(rows: list[dict], step: int, num_to_print: int | None) -> None:
    """Print the first num_to_print rows (None: all) as a table: rich's where installed, else plain text."""
    rows = rows[:num_to_print] if num_to_print is not None else rows
    if not rows:
        return
    if importlib.util.find_spec("rich") is None:
        print(plain_table(rows, step))
        return
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table

    names = [name for name in rows[0] if name != "step"]
    table = Table(show_header=True, header_style="bold white", expand=True, show_lines=True)
    for name in names:
        text = name in ("prompt", "completion")
        table.add_column(name.capitalize() if text else name, justify="left" if text else "right", overflow="fold")
    for row in rows:
        table.add_row(*(cell(row[name]) for name in names))
    Console().print(Panel(table, expand=False, title=f"Step {step}", border_style="bold white"))

"""A notebook's code cells as the Python they run: IPython's magics turned into calls, cell magics' bodies included.

IPython turns `%%capture` (any cell magic) into `get_ipython().run_cell_magic('capture', '', BODY)`, the body a
string, so a reader of the cell's syntax tree sees none of the code the magic runs. `python_of(cell)` gives the cell's
Python and the Python of every cell magic's body that parses (nested magics too): what the grader reads for the checks
a cell calls and the package's functions it uses. A body that does not parse as Python (`%%bash`) is left out.

What the grader says of a cell names it as a learner finds it (`cell_label`): its number among the code cells, from 1,
and its first line.
"""

from __future__ import annotations

import ast
import functools

_MAX_NESTING = 4
"""Cell magics inside cell magics' bodies, followed this deep: enough for real notebooks, bounded for crafted ones."""


@functools.cache
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager  # %magics -> Python

    return TransformerManager()


class TooDeep(ValueError):
    """A cell nested deeper than Python's parser goes in this process; the message names the parser's error."""


def python_of(cell: str) -> list[tuple[str, ast.Module]]:
    """[(Python source, its syntax tree)] of a code cell and of each cell magic's body in it; [] when the cell does
    not parse (it runs nothing). Raises TooDeep for a cell nested too deeply to parse here."""
    return _python_of(cell, 0)


def _python_of(cell: str, depth: int) -> list[tuple[str, ast.Module]]:
    try:
        source = _transformer().transform_cell(cell)
        tree = ast.parse(source)
    except (SyntaxError, ValueError, TypeError):
        return []
    except (RecursionError, MemoryError) as error:  # the parser's own limits, not the cell's syntax
        raise TooDeep(f"{type(error).__name__} in Python's parser") from None
    found = [(source, tree)]
    if depth < _MAX_NESTING:
        for body in _cell_magic_bodies(tree):
            found += _python_of(body, depth + 1)
    return found


def _cell_magic_bodies(tree: ast.Module) -> list[str]:
    """The bodies of `run_cell_magic(name, line, body)` calls whose body is a string in the source."""
    bodies = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "run_cell_magic"
            and len(node.args) == 3
            and isinstance(node.args[2], ast.Constant)
            and isinstance(node.args[2].value, str)
        ):
            bodies.append(node.args[2].value)
    return bodies


FIRST_LINE_CHARS = 60
"""A cell's first line is quoted up to this many characters."""


def cell_label(cells, index: int) -> str:
    """'code cell 3 (`while True:`)': cell `index` of a notebook's `cells` as a learner finds it, counted among the
    code cells from 1 (markdown cells are not counted; Jupyter numbers no cell), with its first line that is not
    blank, cut at FIRST_LINE_CHARS."""
    number = sum(cell.cell_type == "code" for cell in cells[: index + 1])
    line = next((line.strip() for line in cells[index].source.splitlines() if line.strip()), "")
    if len(line) > FIRST_LINE_CHARS:
        line = line[: FIRST_LINE_CHARS - 3] + "..."
    return f"code cell {number}" + (f" (`{line}`)" if line else " (empty)")


def code_cell_numbers(cells, indices) -> str:
    """'code cell 4' or 'code cells 4, 5, 6': cells `indices` of `cells`, counted as `cell_label` counts them."""
    numbers = [sum(cell.cell_type == "code" for cell in cells[: index + 1]) for index in indices]
    return f"code cell{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"

"""Dead code: what nothing in the repository uses, found by vulture ([tool.vulture] in pyproject.toml).

    python scripts/dead_code.py    # .ci/run's lint step: exit 1 on dead code or on a stale whitelist entry

Checked for dead code: the paths of [tool.vulture] (the package, scripts/, bench/, examples/). Counted as users
beside them: tests/ and conftest.py, the code cells of every notebook (notebooks/, solutions/, exercises/) and the
Python code of the docs (fenced blocks and inline spans of README.md, CONTRIBUTING.md and docs/*.md). Vulture reads
.py files only, so on every run the notebooks' cells and the docs' code are written as .py files to a temporary
folder that vulture scans too; no list of what they use is kept by hand, and none can go stale.

What vulture cannot see used (a method TRL's callbacks call, an attribute the standard library reads) is listed in
scripts/dead_code_whitelist.py, with the reason. Vulture matches names, not definitions, so each entry silences
every finding of its name: an entry must therefore silence at least one finding, and one that silences none (the
name is used now, or gone) fails the check until it is removed.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: vulture's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
WHITELIST = ROOT / "scripts" / "dead_code_whitelist.py"
USERS = ["tests", "conftest.py"]  # scanned for what they use; their own unused names are not reported
NOTEBOOK_FOLDERS = ["notebooks", "solutions", "exercises"]
DOCS = ["README.md", "CONTRIBUTING.md", "docs/*.md"]
FENCED = re.compile(r"^ *```[^\n]*\n(.*?)^ *```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
FINDING = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+): (?P<message>.*?)(?: \((?P<confidence>\d+)% confidence\))?$")
NAMED = re.compile(r"unused \w+ '(?P<name>[^']+)'")


def notebook_code(path: Path) -> str:
    """The code cells of notebook `path` as one Python module; IPython's `!shell` and `%magic` lines become `pass`."""
    cells = []
    for number, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = [re.sub(r"^(\s*)[!%].*", r"\1pass", line) for line in source.split("\n")]
        code = "\n".join(lines)
        try:
            ast.parse(code)
        except SyntaxError as error:
            raise SystemExit(f"{path.relative_to(ROOT)}, code cell {number}: does not parse ({error})") from None
        cells.append(code)
    return "\n\n".join(cells) + "\n"


def doc_code(path: Path) -> str:
    """The Python of a markdown file: each fenced block and inline span that parses as Python, one after another."""
    text = path.read_text()
    snippets = [textwrap.dedent(block) for block in FENCED.findall(text)]
    snippets += INLINE.findall(FENCED.sub(" ", text))
    parsed = []
    for snippet in snippets:
        try:
            ast.parse(snippet)
        except SyntaxError:
            continue  # a shell command, an output, a fragment: no Python names to count
        parsed.append(snippet)
    return "\n\n".join(parsed) + "\n"


def write_users(folder: Path) -> None:
    """The notebooks' and the docs' code, as .py files under `folder`."""
    for name in NOTEBOOK_FOLDERS:
        (folder / name).mkdir()
        for path in sorted((ROOT / name).glob("*.ipynb")):
            (folder / name / f"{path.stem}.py").write_text(notebook_code(path))
    (folder / "docs").mkdir()
    for pattern in DOCS:
        for path in sorted(ROOT.glob(pattern)):
            (folder / "docs" / f"{path.stem}.py").write_text(doc_code(path))


def whitelisted() -> dict[str, int]:
    """{name: line} of the whitelist's entries (`_.name` or `name`, one a line)."""
    entries = {}
    for statement in ast.parse(WHITELIST.read_text()).body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, (ast.Name, ast.Attribute)):
            node = statement.value
            entries[node.id if isinstance(node, ast.Name) else node.attr] = statement.lineno
    return entries


def main() -> int:
    checked = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["vulture"]["paths"]
    with tempfile.TemporaryDirectory() as tmp:
        write_users(Path(tmp))
        # Paths given on the command line replace [tool.vulture]'s; its other settings still apply.
        command = [sys.executable, "-m", "vulture", *checked, *USERS, tmp]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode not in (0, 3):  # 3: dead code found; anything else: vulture could not read something
        print(result.stdout + result.stderr, file=sys.stderr)
        return 1
    allowed = whitelisted()
    dead, silenced = [], set()
    for line in result.stdout.splitlines():
        finding = FINDING.match(line)
        if not finding or not any(Path(finding["path"]).is_relative_to(path) for path in checked):
            continue  # tests/, the notebooks and the docs are read for what they use only
        named = NAMED.match(finding["message"])
        if named and named["name"] in allowed:
            silenced.add(named["name"])
        else:
            dead.append(line)
    stale = [
        f"{WHITELIST.relative_to(ROOT)}:{line}: {name!r}" for name, line in allowed.items() if name not in silenced
    ]
    if dead:
        print("Dead code, used nowhere in the package, scripts, benches, tests, notebooks or docs: remove it (or, when")
        print(f"code outside the repository uses it, list it in {WHITELIST.name} with the reason):")
        print("  " + "\n  ".join(dead))
    if stale:
        print("Whitelist entries that silence nothing (the name is used now, or gone): remove them")
        print("  " + "\n  ".join(stale))
    if not dead and not stale:
        print(f"No dead code ({', '.join(checked)}; {len(silenced)} names whitelisted).")
    return 1 if dead or stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's install and Jupyter commands, read as a learner runs them: the first install takes the CPU build of
torch on every platform (a GPU machine's line beside it), and the Jupyter command serves a root that holds every
target of every notebook's relative links (the lessons' links to the exercises and the docs)."""

import os
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def section(title: str) -> str:
    """The README's section under the heading `## title`, up to the next one."""
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_first_install_takes_torchs_cpu_build_and_names_the_gpu_line():
    start = section("Start here: two commands")
    first_block = re.search(r"```bash\n(.*?)```", start, re.S).group(1)
    torch_install = next(line for line in first_block.splitlines() if "pip install torch" in line)
    # PyPI's Linux torch is the CUDA build: the CPU build comes from PyTorch's own index, on every platform
    assert f"pip install torch==2.13.0 {CPU_INDEX} && pip install -e ." in torch_install
    after_block = start.split("```", 2)[2]
    assert "NVIDIA" in after_block and "`pip install torch==2.13.0`" in after_block  # the GPU machine's line


def jupyter_root(command: str) -> tuple[Path, Path]:
    """(root folder, file to open) of `jupyter lab ARGS`, as Jupyter's own server reads ARGS, run from the
    repository's folder."""
    serverapp = pytest.importorskip("jupyter_server.serverapp")  # the notebooks (and browser) extra
    args = command.split()[2:]
    app = serverapp.ServerApp()
    cwd = Path.cwd()
    try:
        os.chdir(ROOT)
        app.parse_command_line(args)
        return Path(app.root_dir).resolve(), Path(app.file_to_run).resolve()
    finally:
        os.chdir(cwd)


def relative_links(path: Path) -> list[str]:
    """The targets of the notebook's markdown links that are files of the repository (no URL, no anchor)."""
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


def test_the_jupyter_command_serves_every_target_of_every_notebooks_links():
    command = next(line for line in README.splitlines() if line.startswith("jupyter lab"))
    root, first = jupyter_root(command)
    assert root == ROOT and first == ROOT / "notebooks" / "00_tour_and_setup.ipynb"
    notebooks = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(ROOT.glob("exercises/*.ipynb"))
    checked = 0
    for path in notebooks:
        for target in relative_links(path):
            resolved = (path.parent / target).resolve()
            assert resolved.is_file(), f"{path.name}: its link to {target} finds no file"
            assert resolved.is_relative_to(root), f"{path.name}: {target} is outside the server's root {root}"
            checked += 1
    assert checked >= 20  # every lesson's Practice links, and more


def test_the_bare_file_argument_would_serve_only_its_folder():
    """What the README's command fixes: `jupyter lab notebooks/x.ipynb` alone serves notebooks/, outside which the
    lessons' links to ../exercises/ are not found."""
    root, _ = jupyter_root("jupyter lab notebooks/00_tour_and_setup.ipynb")
    assert root == ROOT / "notebooks"
    assert not (ROOT / "exercises" / "04_group_relative_advantages.ipynb").resolve().is_relative_to(root)

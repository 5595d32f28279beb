"""Prose figures under test: a number a lesson's text shows is one its checked cells print, or a cited figure.

A figure a lesson computes is never retyped by hand: the prose points at the checked cell that prints it, or a
checked cell prints it. So every number in a lesson's markdown with a decimal point or a percent sign must equal,
at the digits the prose shows, a number of one of its `# NBVAL_CHECK_OUTPUT` cells (their printed outputs, or the
inputs written in their code), or be declared in the notebook's metadata as a cited figure with its source:

    "cited_figures": [{"figures": ["0.562", "0.080"], "source": "full study: python bench/ppo_vs_grpo.py"}, ...]

A source is a paper (an arXiv id), a command that reproduces a full-mode run ("python ..."), or another lesson
("lesson 06"), whose checked outputs must then hold the figure. Skipped: fenced, indented and inline code (code, not
figures), the exercises (their numbers are inputs), numbers inside a name or version (Qwen2.5-0.5B, TRL 1.16,
torch 2.13, arXiv 2402.03300, section 5.2.2, compute capability 7.5) and the lesson's own section numbers (6.3).
Solutions keep no outputs, so they are out of scope. The README's figures and those of docs/ carry their source too
(the tests at the end).
"""

import math
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHECK = "NBVAL_CHECK_OUTPUT"

FENCED = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
FIGURE = re.compile(r"(?<![\w.\-/^])[-−]?\d+(?:,\d{3})*(?:\.\d+%?|%)")
PRINTED = re.compile(r"[-+−]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
NAMED_BEFORE = re.compile(
    r"(?:arXiv|TRL|torch|transformers|Python|python|version|v|sections?|Section|eq\.|Eq\.|equation|Table|Figure"
    r"|capability)"
    r"[ ,]*$"
)
HEADING_NUMBER = re.compile(r"^#+\s+(\d+(?:\.\d+)*)", re.M)


def figures_in(text: str) -> list[tuple[str, str]]:
    """(figure, context) for every decimal or percent figure of prose `text` that is not part of a name."""
    found = []
    for match in FIGURE.finditer(text):
        start, end = match.span()
        after = text[end : end + 2]
        if after[:1].isalpha() or after[:1] == "_" or (after[:1] == "." and after[1:2].isdigit()):
            continue  # 0.5B, Qwen2.5-0.5B-Instruct, 1.16.0: a name or a version
        if NAMED_BEFORE.search(text[max(0, start - 30) : start]) or text[max(0, start - 2) : start][-1:].isalpha():
            continue
        found.append((match.group(0), text[max(0, start - 50) : end + 20].replace("\n", " ")))
    return found


def without_code(markdown: str) -> str:
    """Markdown without its code: fenced blocks, indented blocks and inline spans."""
    text = FENCED.sub(" ", markdown)
    text = "\n".join(line for line in text.split("\n") if not line.startswith("    "))
    return INLINE_CODE.sub(" ", text)


# a lesson's own questions (not its graded Practice section)
EXERCISES = re.compile(r"^## Questions to try \(not graded\)\n.*?(?=^## |\Z)", re.M | re.S)


def prose(nb) -> str:
    """The lesson's markdown, without code, the Colab badge and the exercises (whose numbers are inputs to work
    with, not figures the lesson computed)."""
    cells = [c.source for c in nb.cells if c.cell_type == "markdown" and c.get("id") != "colab-badge"]
    return EXERCISES.sub(" ", "\n".join(without_code(source) for source in cells))


def checked_numbers(nb) -> list[float]:
    """Every number in the checked cells: what they print, and the inputs written in their code."""
    numbers = []
    for cell in nb.cells:
        if cell.cell_type != "code" or CHECK not in cell.source:
            continue
        texts = [cell.source] + [o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs]
        for text in texts:
            numbers += [float(m.replace("−", "-").replace(",", "")) for m in PRINTED.findall(text)]
    return numbers


def shown_equals(figure: str, numbers: list[float]) -> bool:
    """Whether `figure` (as the prose shows it) equals one of `numbers` rounded to the digits it shows; a
    percentage may also be a printed fraction (7% is 0.07)."""
    text = figure.replace("−", "-").replace(",", "")
    percent = text.endswith("%")
    text = text.rstrip("%")
    digits = len(text.split(".")[1]) if "." in text else 0
    value = float(text)
    for number in numbers:
        for candidate in (number, 100 * number) if percent else (number,):
            if math.isclose(round(candidate, digits), value, abs_tol=10 ** -(digits + 6)):
                return True
    return False


def lesson(number: str):
    (path,) = (ROOT / "notebooks").glob(f"{number}_*.ipynb")
    return nbformat.read(path, as_version=4)


def cited(nb) -> dict[str, str]:
    """The notebook's declared figures: {figure: source}."""
    declared = {}
    for entry in nb.metadata.get("cited_figures", []):
        for figure in entry["figures"]:
            declared[figure] = entry["source"]
    return declared


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem.split("_")[0])
def test_every_prose_figure_is_printed_or_cited(path):
    nb = nbformat.read(path, as_version=4)
    text = prose(nb)
    sections = set(HEADING_NUMBER.findall(text))
    numbers = checked_numbers(nb)
    declared = cited(nb)
    retyped = [
        f"{figure!r} in ...{context}..."
        for figure, context in figures_in(text)
        if figure not in sections and figure not in declared and not shown_equals(figure, numbers)
    ]
    assert not retyped, (
        f"{path.name}: figures in the prose that no checked cell prints and that are not declared as cited "
        "(point at the cell that prints them, print them in a checked cell, or cite their source in the "
        "notebook's metadata 'cited_figures'):\n" + "\n".join(retyped)
    )


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem.split("_")[0])
def test_cited_figures_have_a_source_and_are_used(path):
    nb = nbformat.read(path, as_version=4)
    shown = {figure for figure, _ in figures_in(prose(nb))}
    for figure, source in cited(nb).items():
        assert figure in shown, f"{path.name}: cited figure {figure!r} is no longer in the prose: remove it"
        other = re.search(r"\blesson (\d\d[a-z]?)\b", source)
        if other:
            assert shown_equals(figure, checked_numbers(lesson(other.group(1)))), (
                f"{path.name}: {figure!r} is cited from lesson {other.group(1)}, whose checked cells do not print it"
            )
        else:
            assert re.search(r"arXiv \d{4}\.\d{4,5}|python ", source), (
                f"{path.name}: cite {figure!r} with a paper (arXiv id and section) or the command of a full run, "
                f"not {source!r}"
            )
    assert len(cited(nb)) <= 40, f"{path.name}: a long cited list means the prose should point at cells instead"


WORDS_PER_MINUTE = 150  # CONTRIBUTING.md: a lesson's time line is its words, prose and code, at 150 a minute


def reading_minutes(nb) -> tuple[int, float]:
    """(words, minutes): every markdown and code cell but the Colab badge and setup cell, at WORDS_PER_MINUTE."""
    words = sum(len(c.source.split()) for c in nb.cells if c.get("id") not in ("colab-badge", "colab-install"))
    return words, words / WORDS_PER_MINUTE


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem.split("_")[0])
def test_the_time_line_states_the_reading_time(path):
    nb = nbformat.read(path, as_version=4)
    stated = re.search(r"\*\*Time:\*\* about (\d+) minutes to read", prose(nb))
    assert stated, f"{path.name}: the time line should say '**Time:** about N minutes to read; ...'"
    words, minutes = reading_minutes(nb)
    rounded = 5 * math.ceil(minutes / 5)
    assert abs(int(stated.group(1)) - rounded) <= 5, (
        f"{path.name} says about {stated.group(1)} minutes to read: its {words} words at {WORDS_PER_MINUTE} a minute "
        f"are {minutes:.0f} minutes; say about {rounded}"
    )


def test_the_scanner_by_hand():
    text = (
        "Qwen2.5-0.5B-Instruct with TRL 1.16 (arXiv 2402.03300, section 5.2.2) moves 0.375 of the way, "
        "7% of it, 1.0 nats, `lr=0.5` and −0.031 in 6.3"
    )
    assert [figure for figure, _ in figures_in(without_code(text))] == ["0.375", "7%", "1.0", "−0.031", "6.3"]
    assert shown_equals("0.43", [0.4299]) and not shown_equals("0.43", [0.4351])
    assert shown_equals("7%", [0.070]) and shown_equals("28%", [0.276]) and not shown_equals("7%", [0.078])
    assert shown_equals("−0.031", [-0.0312]) and shown_equals("9.9", [9.88])


# The README's figures, each with its source: a lesson whose checked cells print it, or the command of a full run.
# Inline code that is a requirement or an argument (`torch>=2.4,<2.15`, `--seed 1`) holds versions, not figures.
README_FIGURES = {
    "0.430": "lesson 06",  # the tiny Qwen's held-out accuracy before training
    "0.755": "python -m minigrpo train",  # after the default run (the summary's first line), with 1 or 2 threads
    "0.875": "lesson 03",  # the worked example's mean reward
    # the performance table: one run of the bench, its step medians and peak memory (docs/performance.md)
    **dict.fromkeys(
        ["0.653", "1.713", "0.381", "0.367", "0.284", "0.721", "0.938", "0.509", "0.303", "0.685"],
        "python bench/vs_trl.py",
    ),  # fmt: skip
    **dict.fromkeys(["0.32", "0.88", "0.46", "0.60", "0.43", "0.87"], "python bench/scaling.py"),  # its full run
    **dict.fromkeys(["0.70", "82.4", "63.2", "57.6", "183.3", "137.0", "0.456"], "python bench/time_to_accuracy.py"),
}
REQUIREMENT_OR_ARGUMENT = re.compile(r"`[^`\n]*[=<>-][^`\n]*`")


def readme_figures() -> list[tuple[str, str]]:
    text = REQUIREMENT_OR_ARGUMENT.sub(" ", FENCED.sub(" ", (ROOT / "README.md").read_text()))
    return figures_in(text)


def test_every_readme_figure_has_one_source():
    shown = readme_figures()
    undeclared = [f"{figure!r} in ...{context}..." for figure, context in shown if figure not in README_FIGURES]
    assert not undeclared, "README.md: figures without a source in README_FIGURES:\n" + "\n".join(undeclared)
    assert {figure for figure, _ in shown} == set(README_FIGURES), "README_FIGURES lists a figure the README dropped"
    for figure, source in README_FIGURES.items():
        other = re.fullmatch(r"lesson (\d\d[a-z]?)", source)
        if other:
            assert shown_equals(figure, checked_numbers(lesson(other.group(1)))), f"{figure} is not printed by {source}"
        else:
            assert source.startswith("python "), f"cite {figure} with the command that gives it"


# --- the docs --------------------------------------------------------------------------------------------------------
# A figure in docs/*.md carries its source in its own paragraph: the command that measured it (`python ...`), the
# lesson whose checked cells print it, or a paper (an arXiv id). A table belongs to the paragraph before it (its
# caption) and the paragraph after it (what it shows). A figure that is no measurement but a setting, a version or a
# definition is listed below with the file of the repository that holds it, and the test checks that it does.
DOCS = sorted((ROOT / "docs").glob("*.md"))
SOURCE = re.compile(r"python [\w./-]+|\blesson \d\d[a-z]?\b|arXiv \d{4}\.\d{4,5}")
DEFINED = {
    # TRL's defaults and the paper's values, beside the config's own table of them
    "trl.md": dict.fromkeys(["0.0", "0.04", "0.999"], "minigrpo/config.py"),
}


def sourced_blocks(markdown: str) -> list[str]:
    """The paragraphs of `markdown`, each table joined with the paragraphs before and after it."""
    text = FENCED.sub(lambda block: block.group(0).replace("\n\n", "\n"), markdown)
    blocks = [block for block in re.split(r"\n\s*\n", text) if block.strip()]
    grouped, after_table = [], False
    for block in blocks:
        table = all(line.lstrip().startswith("|") for line in block.strip().split("\n"))
        if grouped and (table or after_table):
            grouped[-1] += "\n\n" + block
        else:
            grouped.append(block)
        after_table = table
    return grouped


def unsourced_figures(path: Path) -> list[tuple[str, str]]:
    """(figure, context) of every figure of doc `path` whose paragraph names no source."""
    found = []
    for block in sourced_blocks(path.read_text()):
        if SOURCE.search(block):
            continue
        found += figures_in(REQUIREMENT_OR_ARGUMENT.sub(" ", without_code(block)))
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.stem)
def test_every_docs_figure_carries_its_source(path):
    defined = DEFINED.get(path.name, {})
    unsourced = [
        f"{figure!r} in ...{context}..." for figure, context in unsourced_figures(path) if figure not in defined
    ]
    assert not unsourced, (
        f"docs/{path.name}: figures whose paragraph names no source: name the command that measured them "
        "(`python ...`, with the date), the lesson that prints them or the paper, or list a setting or version in "
        "DEFINED with the file that holds it:\n" + "\n".join(unsourced)
    )
    shown = {figure for figure, _ in unsourced_figures(path)}
    for figure, source in defined.items():
        assert figure in shown, f"docs/{path.name}: DEFINED lists {figure!r}, which needs no entry now: remove it"
        assert figure in (ROOT / source).read_text(), f"docs/{path.name}: {figure!r} is not in {source}"


def test_a_table_shares_the_source_of_its_caption_and_its_reading():
    doc = "Measured (`python bench/x.py`):\n\n| a | b |\n| --- | --- |\n| 0.25 | 0.5 |\n\nso 0.50 in all.\n\nNot 0.75."
    blocks = sourced_blocks(doc)
    assert len(blocks) == 2 and "0.50 in all" in blocks[0] and SOURCE.search(blocks[0]) and blocks[1] == "Not 0.75."

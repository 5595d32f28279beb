"""The lessons' "your turn" cells: each check passes with its worked answer and says "not written yet" without it.

nbval runs every lesson as committed and compares each your-turn check's output ("... not written yet ...") with the
committed one. The tests here run each your-turn again with its worked answer in place of the learner's stub and
assert that the check prints PASS, so a worked answer that is wrong, or a check that no longer agrees with the
package, fails. They run only the cells a your-turn needs, in this process (the cells are plain Python): the
lesson's setup cell (its imports), the learner's cell, then the check cell; a your-turn that reads anything else
of its lesson fails here with a NameError. Then the checker itself (minigrpo.course.your_turn), on hand-made
functions: what it prints for each kind of mistake, and that it never raises for the learner's code.
"""

from __future__ import annotations

import contextlib
import io
import re
from functools import partial
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo import group_relative_advantages
from minigrpo.course.your_turn import NOT_WRITTEN, check_your_turn
from minigrpo.losses import reinforce_loss
from minigrpo.tokenization import build_tiny_tokenizer
from minigrpo.tool_calling import reads_tool_calls

ROOT = Path(__file__).resolve().parent.parent
CHECK = "NBVAL_CHECK_OUTPUT"
# lesson -> its your-turn's id; the cells are <id>-task, <id>, <id>-answer and <id>-check, in this order
YOUR_TURNS = {
    "01_policy_gradients_and_ppo": "your-turn-reinforce-loss",
    "02_group_sampling": "your-turn-zero-std",
    "02b_from_prompt_to_logprobs": "your-turn-gather",
    "02c_rewards_and_verifiers": "your-turn-graded-reward",
    "03_group_relative_advantages": "your-turn-advantages",
    "04_grpo_objective": "your-turn-clip",
    "04b_the_update_loop": "your-turn-micro-batches",
    "07_variants_and_failure_modes": "your-turn-rloo",
    "09_tools_and_multi_turn_episodes": "your-turn-tool-mask",
}
RUNS_THE_TOOL_LOOP = {"09_tools_and_multi_turn_episodes"}  # its check parses tool calls: transformers >= 5.13


def skip_where_tools_are_refused(lesson: str) -> None:
    if lesson in RUNS_THE_TOOL_LOOP and not reads_tool_calls(build_tiny_tokenizer()):
        pytest.skip("transformers < 5.13: tools= is refused there")


ANSWER = re.compile(r"\A<details>\n<summary>[^<]+</summary>\n\n```python\n(?P<code>.*?)\n```\n\n</details>\Z", re.S)


def lesson_cells(lesson: str) -> tuple[dict, list]:
    """The lesson's cells by id, and in order."""
    cells = nbformat.read(ROOT / "notebooks" / f"{lesson}.ipynb", as_version=4).cells
    return {cell.get("id"): cell for cell in cells}, cells


def setup_source(cells: list) -> str:
    """The lesson's setup cell: its first code cell after the Colab setup cell (the imports, course.describe())."""
    code = [cell for cell in cells if cell.cell_type == "code" and cell.get("id") != "colab-install"]
    return code[0].source


def run_cells(sources: list[str], where: str) -> list[str]:
    """Execute `sources` in order in one namespace, in this process; what each printed."""
    namespace, printed = {"__name__": "__main__"}, []
    with torch.random.fork_rng():  # a your-turn's cells seed torch; the rest of this process keeps its state
        for number, source in enumerate(sources):
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                exec(compile(source, f"<{where}, cell {number}>", "exec"), namespace)
            printed.append(buffer.getvalue())
    return printed


def committed_text(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.get("name") == "stdout")


@pytest.mark.parametrize("lesson", YOUR_TURNS)
def test_a_your_turn_is_four_cells_the_learner_can_skip(lesson):
    by_id, cells = lesson_cells(lesson)
    prefix = YOUR_TURNS[lesson]
    ids = [f"{prefix}-task", prefix, f"{prefix}-answer", f"{prefix}-check"]
    assert all(i in by_id for i in ids), f"{lesson}: the cells {ids} must all be there"
    start = cells.index(by_id[ids[0]])
    assert [cell.get("id") for cell in cells[start : start + 4]] == ids, f"{lesson}: cells {ids} in this order"
    task, stub, answer, check = (by_id[i] for i in ids)
    assert task.cell_type == "markdown" and task.source.startswith("**Your turn.**")
    assert stub.cell_type == "code" and not stub.outputs and "raise NotImplementedError" in stub.source
    (name,) = re.findall(r"^def (\w+)\(", stub.source, flags=re.M)
    assert answer.cell_type == "markdown", f"{lesson}: the worked answer is markdown, so that it never runs"
    folded = ANSWER.match(answer.source)
    assert folded, f"{lesson}: the worked answer is one fenced Python block in a closed <details> with a <summary>"
    assert re.findall(r"^def (\w+)\(", folded["code"], flags=re.M) == [name], f"{lesson}: the answer defines {name}"
    assert check.cell_type == "code" and CHECK in check.source
    assert re.search(rf"check_your_turn\(\s*{name},", check.source), (
        f"{lesson}: the check calls check_your_turn({name}, ..."
    )
    assert NOT_WRITTEN in committed_text(check), f"{lesson}: the committed check says {name} is {NOT_WRITTEN}"
    later = [cell.get("id") for cell in cells[start + 4 :] if re.search(rf"\b{name}\b", cell.source)]
    assert not later, f"{lesson}: nothing after the check may use {name} (a learner may skip it): {later}"


@pytest.mark.parametrize("lesson", YOUR_TURNS)
def test_as_committed_the_check_says_not_written_yet(lesson):
    skip_where_tools_are_refused(lesson)
    by_id, cells = lesson_cells(lesson)
    prefix = YOUR_TURNS[lesson]
    printed = run_cells([setup_source(cells), by_id[prefix].source, by_id[f"{prefix}-check"].source], lesson)
    assert printed[1] == "" and printed[2] == committed_text(by_id[f"{prefix}-check"])


@pytest.mark.parametrize("lesson", YOUR_TURNS)
def test_with_the_worked_answer_the_check_passes(lesson):
    skip_where_tools_are_refused(lesson)
    by_id, cells = lesson_cells(lesson)
    prefix = YOUR_TURNS[lesson]
    answer = ANSWER.match(by_id[f"{prefix}-answer"].source)["code"]
    printed = run_cells([setup_source(cells), answer, by_id[f"{prefix}-check"].source], lesson)
    assert printed[2].startswith("PASS: "), f"{lesson}: with the worked answer in place the check printed\n{printed[2]}"


# --- the checker itself -------------------------------------------------------------
def centred(rewards):  # (B, G): a learner's advantages without the std
    return rewards - rewards.mean(dim=1, keepdim=True)


REWARDS = {"two groups": (torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]),)}
NO_STD = partial(group_relative_advantages, scale_rewards="none")


def checked(learner, reference=NO_STD, cases=None, **options) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert check_your_turn(learner, reference, cases or REWARDS, **options) is None
    return buffer.getvalue()


def test_an_unwritten_function_is_not_written_yet_and_nothing_raises():
    def my_advantages(rewards):
        raise NotImplementedError

    printed = checked(my_advantages)
    assert printed.startswith(f"my_advantages is {NOT_WRITTEN}") and "worked answer" in printed
    assert printed.count("\n") == 1


def test_a_right_function_passes_and_the_cases_are_named():
    cases = {**REWARDS, "random": (torch.rand(3, 5, generator=torch.Generator().manual_seed(0)),)}
    assert checked(centred, cases=cases, against="the package") == (
        "PASS: centred matches the package on all 2 cases (two groups; random).\n"
    )


def test_a_wrong_value_says_where_and_names_the_slip_it_matches():
    printed = checked(centred, reference=group_relative_advantages, slips={"the advantages without the std": NO_STD})
    assert "centred differs from group_relative_advantages on 1 of 1 cases:" in printed
    assert (
        "- two groups: values differ at [0, 0]: yours +0.500000, expected +0.865875 (4 of 8 values differ)" in printed
    )
    assert printed.rstrip().endswith(
        "; that is the advantages without the std\nChange centred, run its cell, then this one again."
    )


def test_a_rewards_difference_names_the_completion():
    def pays_the_tag(prompts, completions, answer):
        return [float("<answer>" in text) for text in completions]

    cases = {"three": dict(prompts=None, completions=["<answer>7</answer>", "7", "<answer>six"], answer=["7"] * 3)}
    printed = checked(pays_the_tag, lambda prompts, completions, answer: [1.0, 0.0, 0.0], cases)
    assert "- three: values differ at [2] ('<answer>six'): yours +1.000000, expected +0.000000" in printed


def test_a_wrong_shape_and_a_missing_return_are_named():
    assert "its result is a tensor of shape (8,); the package's is a tensor of shape (2, 4)" in checked(
        lambda rewards: centred(rewards).flatten()
    )
    assert "it returned None: does it end with `return ...`?" in checked(lambda rewards: None)
    assert "it returned a str, where the package returns numbers" in checked(lambda rewards: "advantages")
    assert checked(lambda rewards: rewards.sum().reshape(1), lambda rewards: rewards.sum()).startswith("PASS: ")


def test_an_exception_is_one_line_with_the_line_that_raised_it_not_a_traceback():
    def my_advantages(rewards):
        mean = rewards.mean(dim=2)  # the wrong dimension
        return rewards - mean

    printed = checked(my_advantages)
    assert "- two groups: my_advantages raised IndexError: Dimension out of range" in printed
    assert re.search(r"\(line \d+ of its cell: mean = rewards\.mean\(dim=2\)  # the wrong dimension\)", printed)
    assert "Traceback" not in printed


def test_the_gradient_must_match_too_and_a_detached_result_is_named():
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], requires_grad=True)  # (N, T)
    cases = {"two completions": (logps, torch.tensor([1.0, 0.0]), torch.ones(2, 2))}
    reference = partial(reinforce_loss, baseline="mean")

    def as_a_number(per_token_logps, rewards, completion_mask):
        return torch.tensor(reference(per_token_logps, rewards, completion_mask).item())

    def doubled_gradient(per_token_logps, rewards, completion_mask):  # the same value, twice the gradient
        loss = reference(per_token_logps, rewards, completion_mask)
        return 2 * loss - loss.detach()

    assert "carries no gradient back to the inputs" in checked(as_a_number, reference, cases)
    printed = checked(doubled_gradient, reference, cases)
    assert "the values match, but not the gradient with respect to per_token_logps: it differs at [0, 0]" in printed
    assert checked(reference, reference, cases).startswith("PASS: ")

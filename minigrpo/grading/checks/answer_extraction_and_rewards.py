"""Exercise 03: answer extraction and the 2/1/0 reward, and rewards a policy cannot hack."""

from __future__ import annotations

import random
from collections.abc import Callable

from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import Case, CheckResult, Mismatch, case_seed, cases, check, expect_equal, run_check
from minigrpo.tasks import arithmetic

_EXTRACT_HINT = (
    "return the int inside the LAST <answer>...</answer> tag; without a tag, the last number in the text "
    "(a leading '-' belongs to it); None when there is no number. Use a regex, never eval()."
)


@cases("check_extract_answer", references=[arithmetic.extract_answer])
def _extract_cases() -> list[Case]:
    def hand(examples: dict):
        def run(learner):
            for text, want in examples.items():
                expect_equal(learner(text), want, what=f"extract_answer({text!r})", hint=_EXTRACT_HINT)

        return run

    def random_texts(learner):
        rng = random.Random(case_seed(0))
        pieces = ["<answer>", "</answer>", " ", "so", "=", "-", "+", "The answer is", "x", "\n"]
        for _ in range(300):
            parts = [rng.choice(pieces + [str(rng.randint(-99, 999))] * 4) for _ in range(rng.randint(0, 7))]
            text = "".join(parts)
            want = arithmetic.extract_answer(text)
            expect_equal(learner(text), want, what=f"extract_answer({text!r})", hint=_EXTRACT_HINT)

    tagged = {"<answer>19</answer>": 19, "<answer> -4 </answer>": -4, "12 + 7 = 19, so <answer>19</answer>": 19}
    fallback = {
        "<answer>1</answer> then <answer>2</answer>": 2,
        "12 + 7 = 19": 19,
        "The answer is <answer>19": 19,
        "<answer>nineteen</answer>": None,
        "<answer>__import__('os').getcwd()</answer>": None,
        "": None,
    }
    return [
        Case("tagged answers (hand-made)", 0.5, hand(tagged)),
        Case("last tag wins, else the last number, else None (hand-made)", 0.5, hand(fallback)),
        Case("300 random texts vs the reference (seed 0)", 2, random_texts),
    ]


_REWARD_HINT = "2 = well-formed and correct, 1 = well-formed but wrong, 0 = not well-formed (see the instructions)."


def _call_reward(learner, completions: list[str], answers: list[str]) -> list[float]:
    prompts = ["What is it?"] * len(completions)
    values = learner(prompts=prompts, completions=completions, completion_ids=None, answer=answers)
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise Mismatch(f"expected a list of floats, one per completion, got {values!r}") from None


def _random_completions(seed: int, n: int) -> tuple[list[str], list[str]]:
    rng = random.Random(case_seed(seed))
    completions, answers = [], []
    for _ in range(n):
        answer = rng.randint(0, 198)
        guess = rng.choice([answer, answer, answer + rng.randint(1, 9), -answer])
        template = rng.choice(
            [
                "<answer>{g}</answer>",
                "<answer> {g} </answer>\n",
                "{g}",
                "It is {g}. <answer>{g}</answer>",
                "<answer>{g}",
                "<answer>{g}</answer> done",
                "<answer>{g}</answer><answer>{a}</answer>",
                "<answer>x{g}</answer>",
                "<answer>{g}</answer>  ",
            ]
        )
        completions.append(template.format(g=guess, a=answer))
        answers.append(str(answer))
    return completions, answers


@cases("check_graded_reward", references=[arithmetic.graded_reward])
def _graded_reward_cases() -> list[Case]:
    def worked_example(learner):
        got = _call_reward(learner, arithmetic.WORKED_EXAMPLE_COMPLETIONS, [arithmetic.WORKED_EXAMPLE_ANSWER] * 8)
        want = arithmetic.WORKED_EXAMPLE_REWARDS
        for text, g, w in zip(arithmetic.WORKED_EXAMPLE_COMPLETIONS, got, want, strict=True):
            expect_equal(g, w, what=f"reward of {text!r} (answer 19)", hint=_REWARD_HINT)

    def random_cases(learner):
        completions, answers = _random_completions(1, 200)
        got = _call_reward(learner, completions, answers)
        want = arithmetic.graded_reward(None, completions, None, answer=answers)
        for text, answer, g, w in zip(completions, answers, got, want, strict=True):
            expect_equal(g, w, what=f"reward of {text!r} (answer {answer})", hint=_REWARD_HINT)

    return [
        Case("the worked example: 8 answers to 12 + 7, rewards 2/1/0", 1, worked_example),
        Case("200 random completions vs the reference (seed 1)", 2, random_cases),
    ]


HACKS = {
    "hedging": ["<answer>18</answer><answer>19</answer>", "<answer>19</answer> or <answer>20</answer>"],
    "spam": ["17 18 19 20 21", "<answer>19</answer> just kidding, it is 20", "<answer>19</answer>19191919"],
}


@cases("check_reward_hacking", references=[arithmetic.graded_reward])
def _reward_hacking_cases() -> list[Case]:
    def no_reward_for(kind: str):
        def run(learner):
            honest = _call_reward(learner, ["<answer>19</answer>"], ["19"])[0]
            expect_equal(honest, 2.0, what="reward of the honest '<answer>19</answer>'", hint=_REWARD_HINT)
            for text in HACKS[kind]:
                got = _call_reward(learner, [text], ["19"])[0]
                expect_equal(
                    got,
                    0.0,
                    what=f"reward of the hack {text!r}",
                    hint="a completion with more than one <answer> tag, or anything after the tag, is not "
                    "well-formed: it must score 0, or the policy learns to hedge.",
                )

        return run

    return [
        Case("hedging with several tags earns nothing", 1, no_reward_for("hedging")),
        Case("number spam and text after the tag earn nothing", 1, no_reward_for("spam")),
    ]


@check
def check_extract_answer(extract_answer: Callable[[str], int | None]) -> CheckResult:
    """Exercise 03: extract_answer(text) -> int | None, against minigrpo.tasks.arithmetic.extract_answer."""
    return run_check("check_extract_answer", extract_answer)


@check
def check_graded_reward(graded_reward: Callable) -> CheckResult:
    """Exercise 03: the 2/1/0 reward with TRL's signature, against minigrpo.tasks.arithmetic.graded_reward."""
    return run_check("check_graded_reward", graded_reward)


@check
def check_reward_hacking(graded_reward: Callable) -> CheckResult:
    """Exercise 03: hedging (several tags) and spam must not be rewarded; the honest answer still gets 2."""
    return run_check("check_reward_hacking", graded_reward)


EXERCISE = exercise(
    "03_answer_extraction_and_rewards",
    [
        check_extract_answer,
        check_graded_reward,
        check_reward_hacking,
    ],
    solution_seconds=70,
    formerly="01_answer_extraction_and_rewards",
)

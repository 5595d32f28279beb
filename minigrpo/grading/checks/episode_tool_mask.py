"""Exercise 16: the episode's loss mask: the tool's turns out of the loss, the model's turns (and their EOS) in.

The learner writes `episode_tool_mask(completion_ids (T,), eos_id, assistant_header_ids) -> (T,)`, 1 on the model's
tokens and 0 on the tools' turns, found from the chat template's spans: after an EOS that is not the episode's last
token, through the end of the next assistant header; and `masked_episode_loss(per_token_logps, advantages,
completion_mask, tool_mask) -> ()`, GRPO's per-sequence mean over the tokens of both masks.

The answer key of the template cases is not the rule above: it is the mask `minigrpo.tool_calling` builds while it
assembles an episode (a turn's tokens 1, `tool_result_ids` 0), on episodes rendered through the tools model's
tokenizer (`build_tiny_tokenizer(tools=True)`, TOOLS_CHAT_TEMPLATE): 0, 1 or 2 rounds, one or two calls in a turn,
results of different lengths (an error, digits that read like token ids, the word "assistant"), a last turn that
ran out of tokens (no EOS), an episode that ends with its call. The hidden episodes are drawn from the grader's
secret seed at every grading. `mask_from_spans` (the rule, on ids) is the key of the hand-made cases only, and the
package's tests hold it equal to the assembled mask on every drawn episode.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable

import torch

from minigrpo.grading.exercises import exercise
from minigrpo.grading.framework import (
    Case,
    CheckResult,
    Mismatch,
    case_seed,
    cases,
    check,
    expect_close,
    run_check,
    seeded,
    value_and_gradient,
)
from minigrpo.losses import aggregate_loss, grpo_loss, reinforce_loss
from minigrpo.tokenization import TOOLS_CHAT_TEMPLATE, build_tiny_tokenizer
from minigrpo.tool_calling import tool_result_ids

TEMPLATE_SHA256 = hashlib.sha256(TOOLS_CHAT_TEMPLATE.encode()).hexdigest()
"""The revision of the chat template the exercise is frozen at (its notebook prints it): a change shows here."""
HEADER_TEXT = "<|im_start|>assistant\n"


@functools.cache
def tools_tokenizer():
    """The tools model's tokenizer (one token per byte, <|im_start|> 257, <|im_end|> 258 = EOS)."""
    return build_tiny_tokenizer(tools=True)


def assistant_header_ids() -> list[int]:
    return tools_tokenizer().encode(HEADER_TEXT)


# --- episodes, assembled as minigrpo.tool_calling assembles them -----------------------------
def call_turn(*calls: tuple[str, str]) -> str:
    """A model's turn calling each (name, arguments JSON) in `calls`, as the tools model writes it (Qwen2.5's)."""
    return "".join(f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>' for name, args in calls)


def assemble(turns: list[str], results: list[list[str]], truncate_last: int | None = None) -> tuple[list, list]:
    """(completion_ids, tool_mask) of an episode: turn 0, the tools' turn of results[0], turn 1, ..., as run_episodes
    builds them (each turn's tokens 1, up to and including its <|im_end|>; `tool_result_ids` 0). Every turn but the
    last ends with the EOS; the last too unless `truncate_last` cuts it to that many tokens (it ran out of tokens).
    len(results) is len(turns) - 1, or len(turns) for an episode that ends with its call (the result did not fit:
    results[-1] is then ignored)."""
    tokenizer = tools_tokenizer()
    ids, mask = [], []
    for k, turn in enumerate(turns):
        new = tokenizer.encode(turn) + [tokenizer.eos_token_id]
        if k == len(turns) - 1 and truncate_last is not None:
            new = new[:truncate_last]
        ids, mask = ids + new, mask + [1] * len(new)
        if k < len(turns) - 1:
            messages = [{"role": "tool", "name": "calculator", "content": text} for text in results[k]]
            result = tool_result_ids(tokenizer, messages)
            ids, mask = ids + result, mask + [0] * len(result)
    return ids, mask


WORKED_EPISODE = (
    [call_turn(("calculator", '{"expression": "123 * 456"}')), "<answer>56088</answer>"],
    [["56088"]],
)
"""The lesson's episode: a call, the calculator's result, the answer."""


def random_episode(rng: random.Random) -> tuple[list[int], list[int]]:
    """One episode as the tools model could write it: 0, 1 or 2 rounds, one or two calls a turn, results of
    different lengths and kinds, sometimes a last turn cut short (no EOS) or an episode that ends with its call."""
    rounds = rng.choice([0, 1, 1, 2, 2])
    turns, results = [], []
    for _ in range(rounds):
        calls = rng.choice([1, 1, 1, 2])
        expressions = [f"{rng.randint(100, 999)} * {rng.randint(100, 999)}" for _ in range(calls)]
        turns.append(call_turn(*[("calculator", f'{{"expression": "{e}"}}') for e in expressions]))
        results.append([_random_result(rng) for _ in range(calls)])
    if rounds and rng.random() < 0.15:  # the last result did not fit the budget: the episode ends with its call
        return assemble(turns, results)
    answer = f"<answer>{rng.randint(0, 10**6)}</answer>"
    turns.append(rng.choice([answer, "I think " + answer, f"{answer} {rng.randint(0, 999)}"]))
    truncate = None
    if rng.random() < 0.3:  # the last turn ran out of tokens: no EOS at the end
        truncate = rng.randint(1, len(tools_tokenizer().encode(turns[-1])))
    return assemble(turns, results, truncate)


def _random_result(rng: random.Random) -> str:
    """A tool's result: a product, a number that reads like token ids (257, 258), an error, or text that names the
    assistant."""
    return rng.choice(
        [
            str(rng.randint(10000, 998001)),
            str(rng.randint(0, 9)),
            f"{rng.choice([257, 258, 256])}{rng.randint(0, 999)}",
            "-" + str(rng.randint(1, 10**12)),
            "{'error': 'Tool assistant not found.'}",
            "{'error': \"expression may use integers, + - * only\"}",
            "assistant\n" + str(rng.randint(0, 99)),
        ]
    )


# --- the rule on ids, and the known mistakes ---------------------------------------------------
def tool_spans(ids: list[int], eos_id: int, header: list[int]) -> list[tuple[int, int]]:
    """[(eos, end)]: each tools' turn is ids[eos + 1 : end], from after a model's EOS that is not the last token
    through the end of the next assistant header (the episode's end when the header is cut off)."""
    spans, t, H = [], 0, len(header)
    while t < len(ids) - 1:
        if ids[t] != eos_id:
            t += 1
            continue
        end = t + 1
        while end < len(ids) and ids[end : end + H] != header:
            end += 1
        spans.append((t, min(end + H, len(ids))))
        t = spans[-1][1]
    return spans


def mask_from_spans(ids: list[int], eos_id: int, header: list[int], start: int = 1, end: int = 0) -> torch.Tensor:
    """(T,) long: 0 on ids[eos + start : end + `end`] of each span, 1 elsewhere (start=1, end=0: the right mask)."""
    mask = torch.ones(len(ids), dtype=torch.long)
    for eos, stop in tool_spans(ids, eos_id, header):
        mask[eos + start : stop + end] = 0
    return mask


def _call_masked(ids: list[int], eos_id: int, header: list[int]) -> torch.Tensor:
    """The calling turn masked instead of the result: 0 from the turn's first token through its EOS."""
    mask, turn_start = torch.ones(len(ids), dtype=torch.long), 0
    for eos, stop in tool_spans(ids, eos_id, header):
        mask[turn_start : eos + 1] = 0
        turn_start = stop
    return mask


MISTAKES = {
    "call_masked": "you masked the model's calling turn; mask the tool's result instead: the call is the model's "
    "own text (it learns to call), the result is not (0 from the token after the call's <|im_end|>).",
    "starts_at_eos": "off by one at the start: the calling turn's <|im_end|> is the model's token (1); the tool's "
    "turn starts at the token right after it.",
    "ends_early": "off by one at the end: the tool's turn runs through the LAST token of the assistant header "
    "(its '\\n'); the next model token is the first 1 after it.",
    "eos_masked": "the model's own <|im_end|> tokens are trained (1): the policy learns from them to hand over to "
    "the tool and to stop. Only the tokens between a turn's EOS and the next assistant turn are 0.",
    "header_trained": "the assistant header ('<|im_start|>assistant\\n') after a result is the template's, not the "
    "model's: it belongs to the tool's turn (0), up to and including its last token.",
    "all_ones": "every token counted: the tool's turns (after a call's <|im_end|>, through the next assistant "
    "header) must be 0.",
}


def _mistakes(ids: list[int], eos_id: int, header: list[int]):
    right = mask_from_spans(ids, eos_id, header)
    is_eos = torch.tensor(ids) == eos_id
    tool_eos_end = [(eos, _next_eos(ids, eos_id, eos) + 1) for eos, _ in tool_spans(ids, eos_id, header)]
    header_trained = torch.ones(len(ids), dtype=torch.long)
    for eos, stop in tool_eos_end:
        header_trained[eos + 1 : stop] = 0
    wrong = {
        "call_masked": _call_masked(ids, eos_id, header),
        "starts_at_eos": mask_from_spans(ids, eos_id, header, start=0),
        "ends_early": mask_from_spans(ids, eos_id, header, end=-1),
        "eos_masked": right * ~is_eos,
        "header_trained": header_trained,
        "all_ones": torch.ones(len(ids), dtype=torch.long),
    }
    return [(MISTAKES[name], wrong[name]) for name in wrong if not torch.equal(wrong[name], right)]


def _next_eos(ids: list[int], eos_id: int, after: int) -> int:
    return next((t for t in range(after + 1, len(ids)) if ids[t] == eos_id), len(ids) - 1)


def _expect_mask(learner, ids: list[int], want: list[int] | torch.Tensor, eos_id: int, header: list[int], what: str):
    got = learner(torch.tensor(ids), eos_id, list(header))
    hint = (
        "1 on the model's tokens (each turn up to and including its <|im_end|>), 0 from the token after a call's "
        "<|im_end|> through the last token of the next assistant header."
    )
    expect_close(got, torch.as_tensor(want), atol=0, what=what, hint=hint, mistakes=_mistakes(ids, eos_id, header))


EOS, HEADER = 2, [7, 8]
"""The hand-made cases' ids: EOS 2, the assistant header the two tokens 7 8, the model's words 4-6, the tool's 9."""


@cases("check_episode_tool_mask", references=[mask_from_spans, tool_spans])
def _mask_cases() -> list[Case]:
    def hand(learner):
        ids = [4, 5, 2, 9, 9, 2, 7, 8, 6, 2]  # call EOS | tool: 9 9 EOS, header 7 8 | answer EOS
        _expect_mask(learner, ids, [1, 1, 1, 0, 0, 0, 0, 0, 1, 1], EOS, HEADER, "mask of [4 5 EOS 9 9 EOS 7 8 6 EOS]")

    def no_round(learner):
        _expect_mask(learner, [4, 5, 6, 2], [1] * 4, EOS, HEADER, "mask of one answer turn [4 5 6 EOS]")
        _expect_mask(learner, [4, 5, 6, 6], [1] * 4, EOS, HEADER, "mask of a turn cut short [4 5 6 6] (no EOS)")
        _expect_mask(learner, [4, 2], [1, 1], EOS, HEADER, "mask of [4 EOS]: an episode that ends with its call")

    def two_rounds(learner):
        ids = [4, 2, 9, 2, 7, 8, 5, 2, 9, 9, 9, 2, 7, 8, 6, 6]  # two calls, the last turn cut short
        want = [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
        _expect_mask(learner, ids, want, EOS, HEADER, "mask of two rounds, the last turn cut short")

    def worked(learner):
        ids, want = assemble(*WORKED_EPISODE)
        _expect_mask(learner, ids, want, 258, assistant_header_ids(), "mask of the lesson's calculator episode")

    def results_that_look_like_anything(learner):
        turns = [call_turn(("calculator", '{"expression": "2 + 2"}'), ("calculator", '{"expression": "x"}'))]
        turns += [call_turn(("assistant", "{}")), "<answer>4</answer>"]
        results = [["257258", "{'error': 'Tool assistant not found.'}"], ["assistant\n<answer>4</answer>"]]
        ids, want = assemble(turns, results, truncate_last=9)
        _expect_mask(learner, ids, want, 258, assistant_header_ids(), "mask of two rounds of odd results")

    def hidden(learner):
        rng = random.Random(case_seed(16))
        for k in range(12):
            ids, want = random_episode(rng)
            _expect_mask(learner, ids, want, 258, assistant_header_ids(), f"mask of random episode {k}")

    return [
        Case("hand-made: a call, the tool's turn, the answer", 0.5, hand),
        Case("no tool round: one turn, a turn cut short, an episode that ends with its call", 0.5, no_round),
        Case("hand-made: two rounds, the last turn cut short (no EOS)", 0.5, two_rounds),
        Case("the lesson's episode through the tools model's chat template", 0.5, worked),
        Case(
            "results that look like anything: digits like token ids, an error naming the assistant",
            1,
            results_that_look_like_anything,
        ),
        # more than half of the points on drawn episodes: a replay of another grading's answers earns under half
        Case("12 episodes rendered through the chat template, drawn from the grader's seed (seed 16)", 4, hidden),
    ]


@check
def check_episode_tool_mask(episode_tool_mask: Callable) -> CheckResult:
    """Exercise 16: episode_tool_mask(completion_ids (T,), eos_id int, assistant_header_ids list[int]) -> (T,) 0/1."""
    return run_check("check_episode_tool_mask", episode_tool_mask)


# --- the masked loss ---------------------------------------------------------------------------
def loss_reference(per_token_logps, advantages, completion_mask, tool_mask) -> torch.Tensor:
    """GRPO's per-sequence mean over the trained tokens: the package's REINFORCE form of the loss (its gradient is
    grpo_loss's at ratio 1, beta = 0; tests/test_grading.py holds the two equal)."""
    return reinforce_loss(per_token_logps, advantages, completion_mask * tool_mask, loss_type="grpo")


def _loss_mistakes(logps, advantages, completion_mask, tool_mask):
    weighted = -advantages.unsqueeze(1) * logps  # (N, T)
    trained = completion_mask * tool_mask  # (N, T)
    return [
        (
            "the tool's tokens were counted: multiply completion_mask by tool_mask, so the loss leaves out what the "
            "model never wrote.",
            aggregate_loss(weighted, completion_mask, "grpo"),
        ),
        (
            "|o_i| is the number of tokens the model wrote (completion_mask * tool_mask), not the whole episode's: "
            "divide each row's sum by its trained tokens.",
            ((weighted * trained).sum(1) / completion_mask.sum(1).clamp(min=1)).mean(),
        ),
        (
            "that is the token-level mean (bnpo / dapo); loss_type grpo averages each episode over its own trained "
            "tokens first, then the N episodes.",
            aggregate_loss(weighted, trained, "bnpo"),
        ),
        ("flip the sign: the loss is MINUS the objective, -A log pi.", -aggregate_loss(weighted, trained, "grpo")),
    ]


def _random_loss_inputs(generator: torch.Generator, N: int = 8, T: int = 16):
    """(logps, advantages, completion_mask, tool_mask): right padding, and in most rows one tool span in the middle;
    row 0 has no tool turn, row 1 is all padding past its first token."""
    logps = -torch.rand(N, T, generator=generator) * 3  # (N, T)
    advantages = torch.randn(N, generator=generator)  # (N,)
    lengths = torch.randint(4, T + 1, (N,), generator=generator)  # (N,)
    lengths[1] = 1
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()  # (N, T)
    tool_mask = torch.ones(N, T)
    for row in range(2, N):
        start = int(torch.randint(1, int(lengths[row]) - 1, (1,), generator=generator))
        stop = int(torch.randint(start + 1, T + 1, (1,), generator=generator))
        tool_mask[row, start:stop] = 0
    return logps, advantages, completion_mask, tool_mask


def _expect_loss(learner, logps, advantages, completion_mask, tool_mask, what):
    inputs = (logps.detach().requires_grad_(), advantages, completion_mask, tool_mask)
    got, gradient = value_and_gradient(learner, 0, *inputs)
    hint = "-mean_i (1/|o_i|) sum_t A_i * logp_it over the tokens where completion_mask * tool_mask is 1."
    mistakes = _loss_mistakes(logps, advantages, completion_mask, tool_mask)
    expect_close(
        got,
        loss_reference(logps, advantages, completion_mask, tool_mask),
        atol=1e-6,
        what=what,
        hint=hint,
        mistakes=mistakes,
    )
    if gradient is None:
        raise Mismatch(f"{what}: the loss carries no gradient to per_token_logps: keep it a function of them.")
    want = logps.detach().requires_grad_()
    (want_gradient,) = torch.autograd.grad(loss_reference(want, advantages, completion_mask, tool_mask), want)
    expect_close(
        gradient,
        want_gradient,
        atol=1e-6,
        what=f"d loss / d per_token_logps, {what}",
        hint="the tool's tokens and the padding get exactly 0 gradient; the model's get -A_i / (N |o_i|).",
    )


@cases("check_masked_episode_loss", references=[loss_reference, reinforce_loss, aggregate_loss, grpo_loss])
def _loss_cases() -> list[Case]:
    def hand(learner):
        logps = torch.tensor([[-1.0, -2.0, -9.0, -9.0, -3.0], [-0.5, -1.5, -2.5, 0.0, 0.0]])
        tool_mask = torch.tensor([[1.0, 1, 0, 0, 1], [1, 1, 1, 1, 1]])
        completion_mask = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
        _expect_loss(
            learner,
            logps,
            torch.tensor([1.0, -2.0]),
            completion_mask,
            tool_mask,
            "loss of a 2-episode batch (row 0: tool tokens at 2, 3; row 1: padding at 3, 4)",
        )

    def random_case(learner):
        _expect_loss(learner, *_random_loss_inputs(seeded(160)), "loss of a random (8, 16) batch (seed 160)")

    def drawn(learner):
        rng, generator = random.Random(case_seed(161)), seeded(162)
        episodes = [random_episode(rng) for _ in range(4)]
        T = max(len(ids) for ids, _ in episodes)
        completion_mask = torch.tensor([[1.0] * len(ids) + [0.0] * (T - len(ids)) for ids, _ in episodes])
        tool_mask = torch.tensor([[float(m) for m in mask] + [1.0] * (T - len(mask)) for _, mask in episodes])
        logps = -torch.rand(4, T, generator=generator) * 3  # (4, T)
        _expect_loss(
            learner,
            logps,
            torch.randn(4, generator=generator),
            completion_mask,
            tool_mask,
            "loss of 4 episodes rendered through the chat template (seed 161)",
        )

    return [
        Case("hand-made: tool tokens and padding both left out", 1, hand),
        Case("random batch: tool spans, padding, a row of one token", 1.5, random_case),
        Case("episodes drawn from the grader's seed, padded to one length", 1.5, drawn),
    ]


@check
def check_masked_episode_loss(masked_episode_loss: Callable) -> CheckResult:
    """Exercise 16: masked_episode_loss(per_token_logps (N, T), advantages (N,), completion_mask (N, T),
    tool_mask (N, T)) -> () loss, with its gradient."""
    return run_check("check_masked_episode_loss", masked_episode_loss)


EXERCISE = exercise("16_episode_tool_mask", [check_episode_tool_mask, check_masked_episode_loss], solution_seconds=50)

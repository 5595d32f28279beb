"""Stage 1 with tools: each completion is an episode, the model's turns with the tools' results between them.

    prompt | the model's call ... <|im_end|> | the tool's result (the template's tokens) | the answer ... <|im_end|>
    tool mask:  1   1   1   ...   1          |  0   0   0   ...   0                      |  1   1   ...   1

The model writes a turn; transformers parses it back into a message (``tokenizer.parse_response`` with the
tokenizer's ``response_template``); each tool call in it is run, its result rendered by the chat template as the
tool's turn, and the model writes the next turn after it, until a turn calls no tool, the episode runs out of its
``max_completion_length`` tokens, or it has made ``max_tool_calling_iterations`` rounds of calls. The episode is one
completion: one reward, one advantage, one row of the rollout. Its tokens are attended to like any others, but the
tool's are not the model's: the tool mask is 0 on them, so the loss, the KL, the entropy and every token count leave
them out. Training on them would push the policy toward text it never wrote (lesson 09).

The rules are TRL 1.16's (``GRPOTrainer._tool_call_loop``), so the same tools and prompts give the same episodes,
tool mask and loss in both (tests/test_tools_trl.py):

- a tool that raises, an unknown tool or a call that is not a function call gives ``{"error": "..."}`` as its
  result, and counts as a failure; a tool's result is rendered as ``str(result)``;
- a turn that does not parse (malformed JSON) is plain text: it calls nothing;
- the tool's turn is the tokens the chat template adds between the end of the calling turn (its EOS) and the next
  assistant turn's start (``tool_result_ids``); the template must therefore render earlier messages the same
  whatever follows them (prefix-preserving);
- a tool result that would take the episode past ``max_completion_length``, or the prompt and episode past the
  model's context, is dropped: the episode ends with the call, as it stands;
- the turn after a tool result is cut to what is left of ``max_completion_length``.

One addition: a tool has ``tool_timeout`` seconds (GRPOConfig), after which its result is an error, so a tool that
hangs cannot hang the run. This module is pure Python on token-id lists: ``rollout.py`` generates the turns.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minigrpo.time_limits import time_limit
from minigrpo.tokenization import TOOLS_RESPONSE_TEMPLATE


@dataclass
class Episodes:
    """The N episodes of a rollout, as token-id lists (rows as in the rollout: group-major).

    Symbol           | Shape       | Description
    -----------------|-------------|------------------------------------------------------------------
    completion_ids   | N lists     | each episode's tokens after its prompt: turns and tool results
    tool_mask        | N lists     | 1 on the model's tokens, 0 on the tools' (same lengths)
    conversations    | N lists     | each episode as messages (TRL's completions): assistant, tool, ...
    tool_calls       | N ints      | the calls each episode made (unknown tools and errors count)
    tool_failures    | N ints      | those whose result is an error
    """

    completion_ids: list[list[int]]
    tool_mask: list[list[int]]
    conversations: list[list[dict]]
    tool_calls: list[int]
    tool_failures: list[int]


# --- the tools -----------------------------------------------------------------------
def tools_by_name(tools: Sequence[Callable]) -> dict[str, Callable]:
    """{name: function} for `tools`, checked: plain (not async) callables with distinct names."""
    functions = {}
    for tool in tools:
        if not callable(tool):
            raise TypeError(f"tools: {tool!r} is not a function. Give Python functions with type hints and docstrings.")
        if inspect.iscoroutinefunction(tool):
            raise TypeError(
                f"tools: {tool.__name__} is async; minigrpo runs tools one call at a time. Wrap it in a plain "
                f"function (def {tool.__name__}(...): return asyncio.run(...)), or train with TRL, which runs async "
                "tools on an event loop."
            )
        name = getattr(tool, "__name__", None)
        if name in functions:
            raise ValueError(f"tools: two tools are named {name!r}; the model calls a tool by its name.")
        functions[name] = tool
    return functions


def call_tool(call: dict, functions: dict[str, Callable], timeout: float | None) -> tuple[str, object, bool]:
    """Run one parsed tool call -> (the tool's name, its result, whether it failed). Never raises: an error, an
    unknown tool, a call that is not a function call, or a tool past `timeout` seconds gives {"error": ...}."""
    if call.get("type") != "function":
        return call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"}, True
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    try:
        if name not in functions:
            raise ValueError(f"Tool {name} not found.")
        with time_limit(timeout or 0, functools.partial(_tool_too_slow, name, timeout)):
            return name, functions[name](**arguments), False
    except Exception as error:  # the model wrote the call: any mistake in it is the episode's, not the run's
        return name, {"error": str(error)}, True


def run_calls(calls: list[dict], functions: dict[str, Callable], timeout: float | None) -> tuple[list[dict], int]:
    """One turn's calls, run in order -> (the tool messages, {"role": "tool", "name": ..., "content": str(result)},
    one per call; how many failed)."""
    results = [call_tool(call, functions, timeout) for call in calls]
    messages = [{"role": "tool", "name": name, "content": str(result)} for name, result, _ in results]
    return messages, sum(failed for _, _, failed in results)


def _tool_too_slow(name: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"{name} took more than {timeout:g} s")


# --- the turns -----------------------------------------------------------------------
def parse_turn(tokenizer, ids: list[int], prefix_ids: list[int], tools: Sequence[Callable]) -> dict:
    """One turn's token ids -> its message, {"role": "assistant", "content": ..., "tool_calls": [...]?}.

    tokenizer.parse_response reads the turn with the tokenizer's response_template (prefix_ids: the tokens before
    the turn, ending with the assistant header). As in TRL, a turn that does not parse, or whose calls lack a name,
    is plain text (the decoded ids): it calls no tool."""
    try:
        parsed = _parse_response(tokenizer, ids, prefix_ids, tools)
        if parsed is None:
            raise ValueError("nothing parsed")
        if isinstance(parsed.get("content"), str):
            parsed["content"] = parsed["content"].removesuffix(tokenizer.eos_token)
        parsed["content"] = parsed.get("content") or ""
        for call in parsed.get("tool_calls") or []:
            _check_call(call)
    except (ValueError, TypeError):
        parsed = {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}
    return parsed


def _parse_response(tokenizer, ids, prefix_ids, tools):
    if "tools" in inspect.signature(tokenizer.parse_response).parameters:  # transformers >= 5.15 types the arguments
        return tokenizer.parse_response(ids, prefix=prefix_ids, tools=list(tools))
    return tokenizer.parse_response(ids, prefix=prefix_ids)


def _check_call(call) -> None:
    """A parsed call must name its function; missing arguments mean none (TRL's _validate_tool_calls)."""
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("a tool call without a function name")
    if function.get("arguments") is None:
        function["arguments"] = {}


def tool_result_ids(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The tokens of the tools' turn: what the chat template adds after a calling turn's EOS, up to and including
    the next assistant header. Rendered from a stand-in conversation (a user turn and a call to the same tool), so
    it does not depend on the episode's text, exactly as TRL's _get_tool_suffix_ids."""
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    before = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = _chat_ids(tokenizer, before, add_generation_prompt=False)
    full = _chat_ids(tokenizer, before + tool_messages, add_generation_prompt=True)
    eos_positions = [i for i, token in enumerate(prefix) if token == tokenizer.eos_token_id]
    if eos_positions:  # the calling turn ends at its EOS; what the template writes after it belongs to the tool
        prefix = prefix[: eos_positions[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError(
            "the chat template renders the calling turn differently once a tool's result follows it: it is not "
            "prefix-preserving, so the tool's tokens cannot be cut out of the episode. Use a template that renders "
            "each message the same whatever comes after it (TRL's get_training_chat_template makes one)."
        )
    return full[len(prefix) :]


def _chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
    )


# --- the episodes -----------------------------------------------------------------------
GenerateTurns = Callable[[list[list[int]], list[int], int], list[list[int]]]
"""generate_turns(contexts, rows, turn) -> one new turn per context: its ids up to and including its EOS (or all
of them, when it ran out of tokens). rows: each context's row in the rollout; turn: 1, 2, ... (the first turn, 0,
is sampled with the prompts)."""


def run_episodes(
    prompt_ids: list[list[int]],
    first_turns: list[list[int]],
    generate_turns: GenerateTurns,
    tokenizer,
    tools: Sequence[Callable],
    config,
    context_length: int | None,
) -> Episodes:
    """From each prompt's first turn to the end of its episode: run the calls, append their results, generate the
    next turns, as the module docstring says. prompt_ids: N prompts without padding; first_turns: N turns (ids up
    to and including EOS). config: max_completion_length, max_tool_calling_iterations, tool_timeout.
    context_length: the model's max_position_embeddings (None: no limit)."""
    functions = tools_by_name(tools)
    budget = config.max_completion_length
    completion_ids = [list(turn) for turn in first_turns]
    tool_mask = [[1] * len(turn) for turn in first_turns]
    pairs = zip(prompt_ids, first_turns, strict=True)
    conversations = [[parse_turn(tokenizer, turn, prompt, tools)] for prompt, turn in pairs]
    episodes = Episodes(completion_ids, tool_mask, conversations, [0] * len(prompt_ids), [0] * len(prompt_ids))
    calling = [row for row, conversation in enumerate(conversations) if conversation[-1].get("tool_calls")]
    rounds = config.max_tool_calling_iterations
    turn = 1
    while calling and (rounds is None or turn <= rounds):
        contexts, continuing = [], []
        for row in calling:
            messages, failures = run_calls(conversations[row][-1]["tool_calls"], functions, config.tool_timeout)
            episodes.tool_calls[row] += len(messages)
            episodes.tool_failures[row] += failures
            context = prompt_ids[row] + completion_ids[row] + tool_result_ids(tokenizer, messages)
            too_long = len(context) - len(prompt_ids[row]) > budget
            if too_long or (context_length is not None and len(context) >= context_length):
                continue  # the result would not fit: the episode ends with the call, as TRL ends it
            conversations[row] += messages
            contexts.append(context)
            continuing.append(row)
        new_turns = generate_turns(contexts, continuing, turn) if continuing else []
        calling = []
        for row, context, new in zip(continuing, contexts, new_turns, strict=True):
            new = new[: budget - (len(context) - len(prompt_ids[row]))]  # what is left of the episode's budget
            tool_mask[row] += [0] * (len(context) - len(prompt_ids[row]) - len(completion_ids[row])) + [1] * len(new)
            completion_ids[row] = context[len(prompt_ids[row]) :] + new
            if new:
                conversations[row].append(parse_turn(tokenizer, new, context, tools))
                if conversations[row][-1].get("tool_calls"):
                    calling.append(row)
        turn += 1
    return episodes


def reads_tool_calls(tokenizer) -> bool:
    """Can this tokenizer parse a model's reply into a message with its tool calls? Its parse_response takes the
    prompt before the reply (prefix=) from transformers 5.13, the first version whose response_template parser the
    tool loop relies on."""
    parse_response = getattr(tokenizer, "parse_response", None)
    return parse_response is not None and "prefix" in inspect.signature(parse_response).parameters


PROBE_CALL = {"type": "function", "function": {"name": "tool_name_x", "arguments": {"arg_key_x": "arg_value_x"}}}
PROBE = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]},
    {"role": "tool", "name": "tool_name_x", "content": "tool_result_x"},
]
"""A tool-calling conversation with a word to find in each part (TRL's supports_tool_calling probe)."""
QWEN_CALL = '<|im_start|>assistant\n<tool_call>\n{"name": "tool_name_x", "arguments": {"arg_key_x": "arg_value_x"}}'


def check_tool_support(tokenizer, tools: Sequence[Callable]) -> None:
    """Refuse, before training, a tokenizer that cannot run tool-calling episodes, saying what to change: it needs a
    response_template (transformers >= 5.13) to read the calls, and a chat template that renders a call and its
    result (TRL's supports_tool_calling) and renders each message the same whatever follows (tool_result_ids).

    A tokenizer without a response_template whose chat template writes calls as Qwen2.5's does (<tool_call> JSON)
    gets tokenization.TOOLS_RESPONSE_TEMPLATE, as TRL's add_response_schema gives Qwen2.5 its own."""
    if not reads_tool_calls(tokenizer):
        raise ImportError(
            "tools= needs transformers >= 5.13, whose tokenizer.parse_response reads a model's tool calls: "
            "pip install -U 'transformers>=5.13'."
        )
    tools_by_name(tools)
    rendered = tokenizer.apply_chat_template(PROBE, tokenize=False)
    if getattr(tokenizer, "response_template", None) is None and QWEN_CALL in rendered:
        tokenizer.response_template = TOOLS_RESPONSE_TEMPLATE
    if getattr(tokenizer, "response_template", None) is None:
        raise ValueError(
            "tools=: the tokenizer has no response_template, so the model's tool calls cannot be parsed. Set "
            "tokenizer.response_template to one for its chat template (transformers' response parsing; "
            "trl.chat_template_utils.add_response_schema knows several), or use a Qwen model ('tiny-tools', Qwen2.5)."
        )
    missing = [word for word in ("tool_name_x", "arg_key_x", "arg_value_x", "tool_result_x") if word not in rendered]
    if missing:
        raise ValueError(
            f"tools=: the chat template drops {', '.join(missing)} from a tool-calling conversation, so the model "
            "would never see its calls or their results. Use a template that renders tool_calls and tool messages "
            "(the bundled 'tiny-tools' model's, or Qwen2.5's)."
        )
    tool_result_ids(tokenizer, PROBE[2:])  # raises when the template is not prefix-preserving

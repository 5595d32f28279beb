"""Make the bundled tiny Qwen: a short supervised fine-tune on arithmetic.

    python -m minigrpo pretrain-tiny

A randomly initialised model knows nothing, and RL cannot learn from a group
whose rewards are all 0. Instruct models arrive partly competent; this script
gives the tiny model the same starting point: it learns the answer format and
gets some sums right (it stops at the first check at or above 30% held-out accuracy), leaving room
for GRPO to improve it. Seeded and deterministic on the CPU: the same command
reproduces the checkpoint shipped in minigrpo/assets/tiny-qwen.

`build_sft_batch` is the general piece (any prompts and completions, any
tokenizer): the supervised fine-tuning batch with its masks, shifted by one.

    python -m minigrpo pretrain-tiny --tools

makes the second bundled model, minigrpo/assets/tiny-qwen-tools, for the
calculator task (minigrpo.tasks.calculator): a share of its training rows call
the calculator and copy its result into the answer, the others guess; the loss
covers the model's own turns only (`build_segments_batch`), never the tool's.
It starts calling the tool on about a quarter of the problems and is right
almost only when it calls: the room GRPO needs to raise the call rate.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from minigrpo.config import GRPOConfig
from minigrpo.models import (
    TINY_MODEL_DIR,
    TINY_TOOLS_MODEL_DIR,
    build_tiny_model,
    build_tiny_tokenizer,
    count_parameters,
)
from minigrpo.rollout import render_prompts, sample_completions
from minigrpo.run.evaluation import evaluate_model
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset
from minigrpo.tasks.calculator import calculator, make_calculator_dataset
from minigrpo.tokenization import save_tokenizer


def build_sft_batch(
    prompts: list[str], completions: list[str], tokenizer, extra_pad_columns: int = 0
) -> dict[str, torch.Tensor]:
    """A next-token batch for supervised fine-tuning: learn the completion, given the prompt.

    Each prompt and its completion are tokenized *separately* and concatenated, so
    the boundary is exactly where a rollout puts it (tokenizing the joined text could
    merge the last prompt characters with the first completion characters into one
    token). The rows are right-padded with the pad token to the longest row (plus
    `extra_pad_columns`), L tokens wide, then shifted by one: position t reads token
    t and is trained to predict token t + 1.

    Symbol          | Shape      | Description
    ----------------|------------|----------------------------------------------------------
    prompts         | n strings  | the prompt texts, already rendered (chat template applied)
    completions     | n strings  | the target texts; end them with the EOS token to teach stopping
    input_ids       | (n, L - 1) | long: every row but its last token (what the model reads)
    labels          | (n, L - 1) | long: every row but its first token (what it should predict)
    response_mask   | (n, L - 1) | bool: True where labels holds a completion token (its EOS
                    |            | included), False on prompt tokens and padding
    attention_mask  | (n, L - 1) | long: 1 on the real tokens of input_ids, 0 on padding

    The loss is the cross-entropy of labels where response_mask is True; the
    prompt is context, not a target. The attention mask comes from the lengths,
    never from `input_ids != pad`: many tokenizers use the EOS as their pad token.
    `extra_pad_columns` > 0 pads every row further (pretrain-tiny uses 1: see there).
    """
    if isinstance(prompts, str) or isinstance(completions, str):
        raise TypeError("prompts and completions must be lists of strings (one per row), not a single string.")
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions: give one completion per prompt.")
    if extra_pad_columns < 0:
        raise ValueError(f"extra_pad_columns={extra_pad_columns}: give 0 (the default) or more.")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token: set tokenizer.pad_token (Qwen's is <|endoftext|>).")
    for i, prompt in enumerate(prompts):
        if not tokenizer(prompt, add_special_tokens=False)["input_ids"]:
            raise ValueError(
                f"prompt {i} is empty: the first completion token would have no token to be predicted from."
            )
    rows = [[(prompt, False), (completion, True)] for prompt, completion in zip(prompts, completions, strict=True)]
    return build_segments_batch(rows, tokenizer, extra_pad_columns)


def build_segments_batch(
    rows: list[list[tuple[str, bool]]], tokenizer, extra_pad_columns: int = 0
) -> dict[str, torch.Tensor]:
    """`build_sft_batch` for rows of several pieces: each row is [(text, trained), ...], each text tokenized
    *separately* and the pieces concatenated; response_mask is True on the tokens of the trained pieces.

    A tool-calling episode is [(prompt, False), (call, True), (tool result, False), (answer, True)]: the model
    learns its own two turns, never the prompt nor what the tool wrote. Same returns as `build_sft_batch`.
    """
    token_rows, trained_flags = [], []
    for pieces in rows:
        ids, flags = [], []
        for text, trained in pieces:
            piece_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece_ids
            flags += [trained] * len(piece_ids)
        token_rows.append(ids)
        trained_flags.append(flags)
    width = max(map(len, token_rows)) + extra_pad_columns  # L
    lengths = torch.tensor([len(row) for row in token_rows])  # (n,)
    token_ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in token_rows])  # (n, L)
    is_completion = torch.tensor([flags + [False] * (width - len(flags)) for flags in trained_flags])  # (n, L)
    is_real = torch.arange(width) < lengths.unsqueeze(1)  # (n, L)
    return {
        "input_ids": token_ids[:, :-1],  # (n, L - 1)
        "labels": token_ids[:, 1:],  # (n, L - 1)
        "response_mask": is_completion[:, 1:],  # (n, L - 1)
        "attention_mask": is_real[:, :-1].long(),  # (n, L - 1)
    }


def sft_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the completion tokens: -mean log pi(label | tokens before it), over response_mask."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (n, L - 1, V)
    targets = batch["labels"].masked_fill(~batch["response_mask"], -100)  # (n, L - 1); -100 is ignored
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def arithmetic_sft_batch(tokenizer, prompts: list, answers: list[str]) -> dict[str, torch.Tensor]:
    """The warm-up's rows: the chat-rendered problem, then '<answer>N</answer><|im_end|>'.

    One extra pad column makes input_ids the whole rows, (n, longest row): the model
    reads the same ids, and the loss covers the same positions, as with transformers'
    `labels=` loss (which pads its labels by one and shifts them), the way the bundled
    checkpoint was trained. Without it the predictions would be the same but summed
    over one column fewer, in a different order, and the weights would differ in
    their last bits: this script would no longer reproduce the checkpoint exactly.
    """
    completions = [f"<answer>{answer}</answer>{tokenizer.eos_token}" for answer in answers]
    return build_sft_batch(render_prompts(tokenizer, prompts), completions, tokenizer, extra_pad_columns=1)


def pretrain_tiny(
    output_dir: str | Path = TINY_MODEL_DIR,
    max_steps: int = 1500,
    target_accuracy: float = 0.3,
    eval_every: int = 25,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    warmup_steps: int = 100,
    seed: int = 0,
) -> dict:
    """Build the tiny Qwen, fine-tune it on sums until held-out accuracy first reaches
    `target_accuracy` (checked every `eval_every` steps), save it, return its metrics.

    Stopping early is the point: GRPO needs a model that is right sometimes, not always.
    """
    torch.manual_seed(seed)
    random.seed(seed)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed)
    train = make_arithmetic_dataset(n=max_steps * batch_size, split="train", seed=seed + 1000)
    test = make_arithmetic_dataset(n=200, split="test", seed=seed)
    eval_config = GRPOConfig.tiny_cpu()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))
    print(
        f"tiny Qwen: {count_parameters(model):,} parameters; SFT on batches of {batch_size} sums "
        f"until held-out accuracy >= {target_accuracy}"
    )
    started = time.perf_counter()
    metrics = {"eval_accuracy": 0.0}
    for step in range(max_steps):
        model.train()
        rows = train[step * batch_size : (step + 1) * batch_size]
        loss = sft_loss(model, arithmetic_sft_batch(tokenizer, rows["prompt"], rows["answer"]))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % eval_every == 0:
            model.eval()
            metrics = evaluate_model(model, tokenizer, test, [correctness_reward], eval_config)
            print(
                f"step {step + 1:4d}  loss {loss.item():.3f}  held-out accuracy {metrics['eval_accuracy']:.3f}"
                f"  ({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
            if metrics["eval_accuracy"] >= target_accuracy:
                break
    model.eval()
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    save_tokenizer(tokenizer, output_dir)  # readable by transformers 4 and 5 alike
    print(f"held-out accuracy {metrics['eval_accuracy']:.3f} after {step + 1} steps; saved to {output_dir}")
    return metrics


# --- the tools model: calls the calculator on some problems, guesses on the others ------------------
TOOL_ROW_RATE = 0.3  # the share of SFT rows that call the tool: the knob that sets the start's call rate
TINY_TOOLS_MODEL_SIZE = {"hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 256}


def calculator_call(expression: str) -> dict:
    """The assistant message that calls the calculator on `expression` (the chat template renders its JSON)."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def render_tools_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """`messages` through the tools chat template, with the calculator as the one tool."""
    return tokenizer.apply_chat_template(
        messages, tools=[calculator], tokenize=False, add_generation_prompt=add_generation_prompt
    )


def tool_suffix(tokenizer, result: str) -> str:
    """What the template writes between the call turn's <|im_end|> and the next assistant turn's first token:
    '\\n<|im_start|>user\\n<tool_response>\\nRESULT\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n'."""
    messages = [{"role": "user", "content": "?"}, calculator_call("1 * 1")]
    called = render_tools_chat(tokenizer, messages)
    called = called[: called.rindex(tokenizer.eos_token) + len(tokenizer.eos_token)]  # up to the call's <|im_end|>
    answered = render_tools_chat(tokenizer, [*messages, {"role": "tool", "content": result}], True)
    assert answered.startswith(called), "the tools chat template must be prefix-preserving"
    return answered[len(called) :]


def tools_sft_pieces(tokenizer, prompt: list[dict], question: str, answer: str, call_tool: bool) -> list:
    """One SFT row as [(text, trained), ...] for `build_segments_batch`.

    call_tool: prompt | <tool_call>{... "expression": question}</tool_call><|im_end|> | tool suffix | answer;
    else: prompt | <answer>N</answer><|im_end|> (a guess: the model cannot multiply, it learns the format).
    The answer turn is '<answer>N</answer><|im_end|>' either way; the trained pieces are the model's own turns.
    """
    prompt_text = render_tools_chat(tokenizer, prompt, add_generation_prompt=True)
    answer_text = f"<answer>{answer}</answer>{tokenizer.eos_token}"
    if not call_tool:
        return [(prompt_text, False), (answer_text, True)]
    called = render_tools_chat(tokenizer, [*prompt, calculator_call(question)])
    call_text = called[len(prompt_text) : called.rindex(tokenizer.eos_token) + len(tokenizer.eos_token)]
    return [(prompt_text, False), (call_text, True), (tool_suffix(tokenizer, answer), False), (answer_text, True)]


def tools_sft_batch(tokenizer, rows: dict, call_tool: list[bool]) -> dict[str, torch.Tensor]:
    """The tools warm-up's batch: a `make_calculator_dataset` slice, each row calling the tool or guessing."""
    columns = zip(rows["prompt"], rows["question"], rows["answer"], call_tool, strict=True)
    pieces = [tools_sft_pieces(tokenizer, *row) for row in columns]
    return build_segments_batch(pieces, tokenizer)


def tool_use_stats(model, tokenizer, dataset, samples: int = 200, batch_size: int = 50, seed: int = 0) -> dict:
    """How the tools model starts: one episode for each of the first `samples` problems, sampled at temperature 1
    by the package's own tool loop (rollout.sample_completions with tools=[calculator], at GRPOConfig.
    tiny_tools_cpu()'s lengths), each from its own seed. Returns call_rate (the share of episodes with a call),
    accuracy (correctness_reward of the final answer), accuracy_given_call and accuracy_given_no_call (None where
    there is no such episode)."""
    config = GRPOConfig.tiny_tools_cpu()
    right, called = [], []
    for start in range(0, samples, batch_size):
        rows = dataset[start : min(start + batch_size, samples)]
        seeds = [seed * 1_000_003 + start + i for i in range(len(rows["prompt"]))]  # one per problem
        rollout = sample_completions(model, tokenizer, rows["prompt"], config, 1, seeds, [calculator])
        right += correctness_reward(None, rollout.conversations, answer=rows["answer"])
        called += (rollout.tool_calls > 0).tolist()
    given_call = [r for r, c in zip(right, called, strict=True) if c]
    given_no_call = [r for r, c in zip(right, called, strict=True) if not c]
    return {
        "samples": samples,
        "call_rate": sum(called) / samples,
        "accuracy": sum(right) / samples,
        "accuracy_given_call": sum(given_call) / len(given_call) if given_call else None,
        "accuracy_given_no_call": sum(given_no_call) / len(given_no_call) if given_no_call else None,
    }


def pretrain_tiny_tools(
    output_dir: str | Path = TINY_TOOLS_MODEL_DIR,
    max_steps: int = 1800,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    warmup_steps: int = 100,
    tool_row_rate: float = TOOL_ROW_RATE,
    eval_samples: int = 1000,
    seed: int = 0,
) -> dict:
    """Build the tools model (TINY_TOOLS_MODEL_SIZE), fine-tune it for `max_steps` on calculator problems, a
    share `tool_row_rate` of them calling the tool and the others guessing, save it, return `tool_use_stats`.

    The start GRPO needs: it calls the tool sometimes (about tool_row_rate of the time), and when it calls, the
    call and the copied result are right; when it guesses, it is wrong. The learning rate decays linearly to 0.
    """
    torch.manual_seed(seed)
    random.seed(seed)
    tokenizer = build_tiny_tokenizer(tools=True)
    model = build_tiny_model(tokenizer, seed=seed, **TINY_TOOLS_MODEL_SIZE)
    train = make_calculator_dataset(n=max_steps * batch_size, split="train", seed=seed + 1000)
    test = make_calculator_dataset(n=eval_samples, split="test", seed=seed)
    rng = random.Random(seed)
    call_tool = [rng.random() < tool_row_rate for _ in range(len(train))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup_steps, (max_steps - step) / max(1, max_steps - warmup_steps))
    )
    print(
        f"tiny tools Qwen: {count_parameters(model):,} parameters; {max_steps} steps of SFT on batches of "
        f"{batch_size} multiplications, {tool_row_rate:.0%} of them calling the calculator"
    )
    started = time.perf_counter()
    for step in range(max_steps):
        model.train()
        window = range(step * batch_size, (step + 1) * batch_size)
        summed, tokens, by_kind = 0.0, 0, {}
        for kind in (True, False):  # call rows and guess rows in two batches: a guess row needs no padding to 250
            rows = [i for i in window if call_tool[i] == kind]
            if rows:
                batch = tools_sft_batch(tokenizer, train[rows], [kind] * len(rows))
                mean, count = sft_loss(model, batch), batch["response_mask"].sum()
                summed, tokens, by_kind["call" if kind else "guess"] = summed + mean * count, tokens + count, mean
        loss = summed / tokens  # the mean over both batches' trained tokens, as in one batch
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % 50 == 0:
            kinds = ", ".join(f"{kind} rows {mean.item():.3f}" for kind, mean in by_kind.items())
            print(
                f"step {step + 1:4d}  loss {loss.item():.3f} ({kinds})  ({time.perf_counter() - started:.0f}s)",
                flush=True,
            )
    model.eval()
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    save_tokenizer(tokenizer, output_dir)
    stats = tool_use_stats(model, tokenizer, test, samples=eval_samples, seed=seed)
    print(
        f"saved to {output_dir} after {time.perf_counter() - started:.0f}s. On {eval_samples} held-out problems, "
        f"sampled at temperature 1: calls the tool {stats['call_rate']:.1%} of the time, accuracy "
        f"{stats['accuracy']:.1%}; given a call "
        f"{_percent(stats['accuracy_given_call'])}, given no call {_percent(stats['accuracy_given_no_call'])}"
    )
    return stats


def _percent(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.1%}"

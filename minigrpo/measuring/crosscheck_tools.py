"""minigrpo's tool-calling episodes against TRL's GRPOTrainer(tools=...), on the same scripted turns.

Sampling cannot be shared between two libraries, so generation is replaced in both by one script: a function that
writes a turn from the tokens before it (`scripted_turn`). Everything else is each library's own code: TRL parses
the turns (parse_response), runs the tools, appends their results, builds the tool mask, scores the conversations
and computes the advantages and the loss (`_generate_and_score_completions`, `_compute_loss`); minigrpo does the
same through GRPOTrainer (`generate_and_score`, `loss_mask`, `grpo_loss`). The script covers every branch of the
loop, one row each (EPISODE_SCRIPTS): a call then an answer, a direct answer, an unknown tool, malformed JSON, a
tool that raises and a second round, a wrong answer, an answer cut off by the token budget, and a tool result too
long for the budget. Needs the `bench` extra (trl); fp32 on the CPU.
"""

from __future__ import annotations

import re
import tempfile

import torch

from minigrpo.advantages import completion_advantages
from minigrpo.config import GRPOConfig
from minigrpo.losses import grpo_loss
from minigrpo.measuring.crosscheck import load_fp32, perturb_both, relative_grad_diff, trl_config
from minigrpo.models import TINY_MODEL_DIR, make_reference_model
from minigrpo.rollout import repeat_for_group
from minigrpo.tasks.arithmetic import correctness_reward
from minigrpo.tokenization import TOOLS_CHAT_TEMPLATE, TOOLS_RESPONSE_TEMPLATE


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def repeat(text: str, times: int) -> str:
    """Repeat a text.

    Args:
        text: what to repeat.
        times: how many times.
    """
    return text * times


TOOLS = [multiply, repeat]


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


# Each row's first turn (G = 4 rows per prompt, 2 prompts); what comes after a tool's result is in scripted_turn.
EPISODE_SCRIPTS = [
    _call("multiply", '{"a": 12, "b": 7}'),  # a call, then the answer copied from the result
    "<answer>84</answer><|im_end|>",  # a direct answer: one turn, no call
    _call("abacus", '{"a": 12}'),  # an unknown tool: the result is an error, then an answer
    '<tool_call>\n{"name": multiply}\n</tool_call><|im_end|>',  # malformed JSON: plain text, no call
    _call("multiply", '{"a": 12, "c": 7}'),  # the tool raises (no parameter c): error, then a second round
    _call("multiply", '{"a": 7, "b": 12}'),  # a call, then a wrong answer
    _call("multiply", '{"a": 12, "b": 70}'),  # a call, then an answer that runs out of tokens (truncated)
    _call("repeat", '{"text": "ab", "times": 99}'),  # a result too long for the budget: the episode ends here
]
LONG_TEXT = "the answer is " * 24  # longer than the budget: a turn that never ends


def scripted_turn(tokenizer, context: list[int], row: int) -> list[int]:
    """The turn the script writes after `context` (ids): when the context holds no tool result yet, the first turn
    of row `row` (its place in the batch), else a turn that reads the last tool result."""
    history = tokenizer.decode(context)
    if "<tool_response>" not in history:
        text = EPISODE_SCRIPTS[row % len(EPISODE_SCRIPTS)]
    else:
        result = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", history, re.DOTALL)[-1]
        if "error" in result and history.count("<tool_response>") == 1 and '"c": 7' in history:
            text = _call("multiply", '{"a": 12, "b": 7}')  # try again, right this time
        elif '"b": 70' in history:
            text = LONG_TEXT
        elif '"a": 7, "b": 12' in history:
            text = "<answer>83</answer><|im_end|>"
        else:
            text = f"<answer>{result if result.isdigit() else 0}</answer><|im_end|>"
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def scripted_generate_completions(tokenizer, max_completion_length: int):
    """A stand-in for rollout.generate_completions that writes the script's turns, padded as `generate` pads them
    (a row ends at its EOS, then padding; a row without one runs to max_new_tokens)."""

    def generate(model, _tokenizer, prompt_ids, prompt_mask, config, greedy=False, num_generations=1,
                 group_seeds=None, max_new_tokens=None):  # fmt: skip
        limit = max_new_tokens or max_completion_length
        rows = [
            scripted_turn(tokenizer, ids[mask.bool()].tolist(), i)[:limit]
            for i, (ids, mask) in enumerate(zip(prompt_ids, prompt_mask, strict=True))
        ]
        width = max(len(row) for row in rows)
        return torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])

    return generate


def crosscheck_tools(path: str = "tiny", max_completion_length: int = 320, beta: float = 0.04, seed: int = 0,
                     verbose: bool = True) -> dict:  # fmt: skip
    """minigrpo's episodes, tool mask, conversations, rewards, advantages, losses and gradients against TRL's, on
    the scripted turns (2 prompts x G = 4). Returns what differs: {"completion_ids", "tool_mask",
    "completion_mask", "conversations" (0 or 1 each), "rewards", "advantages", "<loss_type>" (|loss diff|),
    "grad/<loss_type>" (max |grad diff| / max |grad|)}, and "kl"."""
    import trl

    import minigrpo.rollout
    from minigrpo.trainer import GRPOTrainer

    path = str(TINY_MODEL_DIR) if path == "tiny" else path
    torch.manual_seed(seed)
    ours, tokenizer = load_fp32(path)
    theirs, _ = load_fp32(path)
    if getattr(tokenizer, "response_template", None) is None:  # the plain tiny model: give it the tools templates
        tokenizer.chat_template, tokenizer.response_template = TOOLS_CHAT_TEMPLATE, TOOLS_RESPONSE_TEMPLATE
    dataset = scripted_dataset()
    config = GRPOConfig.tiny_cpu(
        prompts_per_step=2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=max_completion_length,
        max_prompt_length=None,
        beta=beta,
        shuffle_dataset=False,
        output_dir=tempfile.mkdtemp(),
    )
    received = []  # what the reward function was given: by minigrpo first, then by TRL

    def reward(prompts, completions, completion_ids, **columns):
        received.append(completions)
        return correctness_reward(prompts, completions, completion_ids, **columns)

    reward.__name__ = "correctness_reward"
    reference = make_reference_model(ours)
    ours_trainer = GRPOTrainer(ours, [reward], config, dataset, processing_class=tokenizer, tools=TOOLS,
                               ref_model=reference)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        their_trainer = trl.GRPOTrainer(
            model=theirs,
            reward_funcs=[reward],
            args=trl_config(config, "cpu", tmp),
            train_dataset=dataset,
            processing_class=tokenizer,
            tools=TOOLS,
        )
    their_trainer._generate_single_turn = _trl_scripted_turns(tokenizer)
    perturb_both(ours, theirs, torch.Generator().manual_seed(seed), noise=0.05)

    # minigrpo: its trainer's own rollout, rewards and loss mask
    stand_in = scripted_generate_completions(tokenizer, max_completion_length)
    real, minigrpo.rollout.generate_completions = minigrpo.rollout.generate_completions, stand_in
    try:
        rollout, _, rewards, _ = ours_trainer.generate_and_score(2)
    finally:
        minigrpo.rollout.generate_completions = real
    advantages = completion_advantages(rewards, config)
    mask = ours_trainer.loss_mask(rollout)

    # TRL: its own loop, rewards, advantages, reference log-probs
    theirs.train()
    their_trainer.current_gradient_accumulation_steps = 1
    rows = [dict(zip(dataset.column_names, values, strict=True)) for values in zip(*dataset[:].values(), strict=True)]
    inputs = their_trainer._generate_and_score_completions(repeat_for_group(rows, 4))

    diffs = {
        "completion_ids": int(not torch.equal(rollout.completion_ids, inputs["completion_ids"])),
        "completion_mask": int(not torch.equal(rollout.completion_mask, inputs["completion_mask"])),
        "tool_mask": int(not torch.equal(mask, inputs["completion_mask"] * inputs["tool_mask"])),
        "conversations": int(received[0] != received[1]),
        "advantages": (advantages - inputs["advantages"]).abs().max().item(),
    }
    ours.train()
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        ours.zero_grad(set_to_none=True)
        logps = ours_trainer.policy_logps(rollout, slice(None))[0]
        loss, metrics = grpo_loss(
            logps, None, rollout.ref_per_token_logps, advantages, mask, config.replace(loss_type=loss_type), mask.sum()
        )
        loss.backward()
        their_trainer.loss_type = loss_type
        theirs.zero_grad(set_to_none=True)
        their_loss = their_trainer._compute_loss(theirs, dict(inputs))
        their_loss.backward()
        diffs[loss_type] = abs(loss.item() - their_loss.item())
        diffs[f"grad/{loss_type}"] = relative_grad_diff(ours, theirs)
    diffs["kl"] = metrics["kl"]
    if verbose:
        _report(rollout, mask, rewards, diffs)
    return diffs


def scripted_dataset(n: int = 2):
    """n prompts for the script (which does not read them): "What is 12 * 7?" asked n ways, answer 84."""
    from datasets import Dataset

    questions = [f"What is 12 * 7?{' Use a tool.' * i}" for i in range(n)]
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in questions], "answer": ["84"] * n})


def _trl_scripted_turns(tokenizer):
    """TRL's _generate_single_turn written by the script: the prompts' first turns, then each later turn."""

    def generate(prompt_ids, *_, **__):  # (prompt_ids, images, multimodal_fields, num_generations, ...)
        return [scripted_turn(tokenizer, ids, i) for i, ids in enumerate(prompt_ids)], None

    return generate


def _report(rollout, mask, rewards, diffs: dict) -> None:
    print("tool-calling cross-check: 2 prompts x G=4, scripted turns, policy perturbed")
    print(f"  episode tokens    {rollout.completion_mask.sum(1).tolist()}")
    print(f"  model's tokens    {mask.sum(1).tolist()}")
    print(f"  tool calls        {rollout.tool_calls.tolist()} (failed {rollout.tool_failures.tolist()})")
    print(f"  rewards           {rewards.tolist()}")
    same = [k for k in ("completion_ids", "completion_mask", "tool_mask", "conversations") if diffs[k] == 0]
    print(f"  equal to TRL's:   {', '.join(same)}; advantages max |diff| {diffs['advantages']:.2e}")
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        print(f"  {loss_type:<8} loss |diff| {diffs[loss_type]:.2e}   gradient diff {diffs['grad/' + loss_type]:.2e}")

"""Does GRPO teach the tiny tools model to use its calculator? (bench/calculator_tools.py, lesson 09)

Two arms from the same bundled model ("tiny-tools"), the same prompts, seeds and config (GRPOConfig.tiny_tools_cpu):

- calculator: GRPO with the working calculator;
- control: the same GRPO with the calculator switched off (same name and prompt; every call's result is an error),
  so whatever it gains does not come from the tool.

Each run is scored before and after on the same held-out problems, `samples` sampled episodes each at the training
temperature: accuracy, the tool-call rate (the share of episodes with at least one call) and the accuracy of the
episodes that call; and greedily (one episode each), as `trainer.evaluate()` scores it. Each arm is scored in its own
world: the control with its calculator off.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from minigrpo.config import GRPOConfig
from minigrpo.models import load_model_and_tokenizer
from minigrpo.rollout import repeat_for_group, sample_completions
from minigrpo.run.distributed import group_seeds
from minigrpo.run.evaluation import evaluate_model
from minigrpo.tasks.arithmetic import correctness_reward
from minigrpo.tasks.calculator import calculator, make_calculator_dataset
from minigrpo.trainer import GRPOTrainer


def switched_off(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: The expression to evaluate, with integers, +, -, * and parentheses, e.g. "123 * 456".

    Returns:
        The exact integer result, as a string.
    """
    raise RuntimeError("the calculator is switched off")


switched_off.__name__ = "calculator"  # the same tool for the model: the same name, parameters and prompt
ARMS = {"calculator": calculator, "control": switched_off}


def episode_stats(model, tokenizer, dataset, tools, config: GRPOConfig, samples: int, seed: int = 0) -> dict:
    """`samples` sampled episodes per problem of `dataset` (each problem's from its own seed): accuracy, the share
    of episodes that call a tool, and the accuracy of those that do and of those that do not."""
    per_call = max(1, config.eval_batch_size // samples)
    right, calls = [], []
    for start in range(0, len(dataset), per_call):
        batch = dataset[start : start + per_call]
        seeds = group_seeds(seed, 0, (f"episodes/{i}" for i in range(start, start + len(batch["prompt"]))))
        rollout = sample_completions(model, tokenizer, batch["prompt"], config, samples, seeds, tools)
        answers = repeat_for_group(batch["answer"], samples)
        right += correctness_reward(None, rollout.conversations, answer=answers)
        calls += (rollout.tool_calls > 0).tolist()
    called = [r for r, c in zip(right, calls, strict=True) if c]
    guessed = [r for r, c in zip(right, calls, strict=True) if not c]
    return {
        "accuracy": statistics.fmean(right),
        "tool_call_rate": statistics.fmean(calls),
        "accuracy_when_calling": statistics.fmean(called) if called else float("nan"),
        "accuracy_when_not_calling": statistics.fmean(guessed) if guessed else float("nan"),
    }


def scores(model, tokenizer, test, tools, config: GRPOConfig, samples: int) -> dict:
    """episode_stats, and greedy accuracy and calls per episode as trainer.evaluate() reports them."""
    greedy = evaluate_model(model, tokenizer, test, [correctness_reward], config, tools)
    return episode_stats(model, tokenizer, test, tools, config, samples) | {
        "greedy_accuracy": greedy["eval_accuracy"],
        "greedy_tool_calls": greedy["eval_tools/call_frequency"],
    }


def run_arm(arm: str, seed: int, config: GRPOConfig, test, samples: int, train_size: int) -> dict:
    """Train the tools model with GRPO in `arm`'s world for config.max_steps steps from training seed `seed`; its
    scores after (scores before do not depend on the seed: before_scores)."""
    torch.manual_seed(seed)
    model, tokenizer = load_model_and_tokenizer("tiny-tools", device="cpu")
    tools = [ARMS[arm]]
    train = make_calculator_dataset(train_size, "train", seed=seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        run = config.replace(seed=seed, output_dir=out)
        trainer = GRPOTrainer(model, [correctness_reward], run, train, processing_class=tokenizer, tools=tools)
        trainer.train()
    seconds = time.perf_counter() - started
    return {"arm": arm, "seed": seed, "train_seconds": seconds} | scores(model, tokenizer, test, tools, config, samples)


def before_scores(arm: str, config: GRPOConfig, test, samples: int) -> dict:
    model, tokenizer = load_model_and_tokenizer("tiny-tools", device="cpu")
    return scores(model, tokenizer, test, [ARMS[arm]], config, samples)


def compare(seeds: list[int], config: GRPOConfig, problems: int, samples: int, train_size: int = 2000) -> dict:
    """Both arms, every seed: {"before": {arm: scores}, "runs": [...], "summary": {arm: mean before/after}}."""
    test = make_calculator_dataset(problems, "test", seed=0)
    before = {arm: before_scores(arm, config, test, samples) for arm in ARMS}
    runs = [run_arm(arm, seed, config, test, samples, train_size) for arm in ARMS for seed in seeds]
    summary = {}
    for arm in ARMS:
        after = [run for run in runs if run["arm"] == arm]
        summary[arm] = {
            "before_accuracy": before[arm]["accuracy"],
            "after_accuracy": statistics.fmean(r["accuracy"] for r in after),
            "before_tool_call_rate": before[arm]["tool_call_rate"],
            "after_tool_call_rate": statistics.fmean(r["tool_call_rate"] for r in after),
            "before_greedy_accuracy": before[arm]["greedy_accuracy"],
            "after_greedy_accuracy": statistics.fmean(r["greedy_accuracy"] for r in after),
            "after_accuracy_per_seed": [r["accuracy"] for r in after],
            "train_seconds": statistics.fmean(r["train_seconds"] for r in after),
        }
        summary[arm]["gain"] = summary[arm]["after_accuracy"] - summary[arm]["before_accuracy"]
    summary["gain_over_control"] = summary["calculator"]["gain"] - summary["control"]["gain"]
    return {"before": before, "runs": runs, "summary": summary}


def format_table(summary: dict) -> str:
    """The arms side by side: sampled accuracy and tool-call rate before -> after (mean over seeds), greedy accuracy."""
    lines = [f"{'arm':<12}{'accuracy':>20}{'tool-call rate':>20}{'greedy accuracy':>20}{'train s':>10}"]
    for arm in ARMS:
        s = summary[arm]
        lines.append(
            f"{arm:<12}{s['before_accuracy']:>9.1%} -> {s['after_accuracy']:<6.1%}"
            f"{s['before_tool_call_rate']:>11.1%} -> {s['after_tool_call_rate']:<6.1%}"
            f"{s['before_greedy_accuracy']:>11.1%} -> {s['after_greedy_accuracy']:<6.1%}{s['train_seconds']:>8.0f}"
        )
    lines.append(f"accuracy gained with the calculator, beyond the control's: {summary['gain_over_control']:+.1%}")
    return "\n".join(lines)

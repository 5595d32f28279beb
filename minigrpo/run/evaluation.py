"""Greedy held-out evaluation: the number a course reports before and after training (eval_accuracy)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from minigrpo.config import GRPOConfig
from minigrpo.rewards import as_trl_completions, compute_rewards, reward_func_name
from minigrpo.rollout import completion_mask_from_eos, eos_token_ids, generate_completions, tokenize_prompts
from minigrpo.run import distributed


# --- evaluation ---------------------------------------------------------------------
def greedy_completion_ids(model, tokenizer, prompts: list, config: GRPOConfig) -> list[list[int]]:
    """The token ids of the greedy (temperature 0) completions of `prompts`, up to and including EOS,
    config.eval_batch_size prompts at a time."""
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    ids = []
    for start in range(0, len(prompts), config.eval_batch_size):
        batch = prompts[start : start + config.eval_batch_size]
        prompt_ids, prompt_mask = tokenize_prompts(tokenizer, batch, config.max_prompt_length, device)
        completion_ids = generate_completions(model, tokenizer, prompt_ids, prompt_mask, config, greedy=True)
        completion_mask, _ = completion_mask_from_eos(completion_ids, eos_ids)
        lengths = completion_mask.sum(1).tolist()
        ids += [row[: int(n)] for row, n in zip(completion_ids.tolist(), lengths, strict=True)]
    return ids


def greedy_completions(model, tokenizer, prompts: list, config: GRPOConfig) -> list[str]:
    """Greedy (temperature 0) completions of `prompts`, as text."""
    return tokenizer.batch_decode(greedy_completion_ids(model, tokenizer, prompts, config), skip_special_tokens=True)


def evaluate_model(model, tokenizer, dataset, reward_funcs: Sequence[Callable], config: GRPOConfig) -> dict:
    """Greedy held-out evaluation, under TRL's names: eval_reward (the weighted sum's mean) and
    eval_rewards/<name>/mean for each reward function, and minigrpo's eval_accuracy (the first reward
    function's mean: the correctness reward in the course). Under torchrun every rank must call it: the
    prompts are shared out and the completions gathered."""
    prompts = list(dataset["prompt"])
    # Under torchrun each rank completes a slice of the prompts; every rank gets all completions back, in order.
    completion_ids = distributed.map_shards(lambda part: greedy_completion_ids(model, tokenizer, part, config), prompts)
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    columns = {name: list(dataset[name]) for name in dataset.column_names if name != "prompt"}
    rewards_per_func, rewards = compute_rewards(
        reward_funcs,
        prompts,
        as_trl_completions(prompts, completions),  # chat prompts: [{"role": "assistant", "content": ...}] each
        completion_ids,  # the real ids: a length-based reward reads the same lengths as in training
        columns,
        config.reward_weights,
        config.reward_timeout,
    )
    metrics = {"eval_accuracy": rewards_per_func[:, 0].nanmean().item(), "eval_reward": rewards.mean().item()}
    for f, func in enumerate(reward_funcs):
        metrics[f"eval_rewards/{reward_func_name(func)}/mean"] = rewards_per_func[:, f].nanmean().item()
    return metrics

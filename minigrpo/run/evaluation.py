"""Held-out evaluation: greedy accuracy (eval_accuracy, the number a course reports before and after training), and
what sampling k answers per problem gives: pass@k (is any of them right?) and maj@k (is their majority vote right?).

pass@k and maj@k measure different things. pass@k counts a problem solved when the model *can* produce its answer
in k tries: capability. maj@k counts it solved when the right answer is the one it produces *most often*: how
sharply its distribution sits on the right answer. DeepSeekMath (arXiv 2402.03300, section 5.2.2) found that RL
with GRPO raised Maj@K but not Pass@K.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from minigrpo.config import GRPOConfig
from minigrpo.rewards import accuracy_reward_index, as_trl_completions, compute_rewards, reward_func_name
from minigrpo.rollout import (
    completion_mask_from_eos,
    eos_token_ids,
    generate_completions,
    sample_completions,
    tokenize_prompts,
)
from minigrpo.run import distributed
from minigrpo.run.metrics import tool_call_metrics
from minigrpo.tasks.arithmetic import extract_answer


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


def greedy_episodes(model, tokenizer, prompts: list, config: GRPOConfig, tools: Sequence[Callable]) -> list[tuple]:
    """The greedy episodes of `prompts` with `tools` (rollout.sample_completions), config.eval_batch_size prompts
    at a time: (ids, conversation, tool calls, failed calls) for each prompt."""
    episodes = []
    for start in range(0, len(prompts), config.eval_batch_size):
        batch = prompts[start : start + config.eval_batch_size]
        rollout = sample_completions(model, tokenizer, batch, config, tools=tools, greedy=True)
        calls, failures = rollout.tool_calls.tolist(), rollout.tool_failures.tolist()
        episodes += zip(rollout.completion_id_lists(), rollout.conversations, calls, failures, strict=True)
    return episodes


def evaluate_model(
    model, tokenizer, dataset, reward_funcs: Sequence[Callable], config: GRPOConfig, tools: Sequence[Callable] = ()
) -> dict:
    """Greedy held-out evaluation, under TRL's names: eval_reward (the weighted sum's mean) and
    eval_rewards/<name>/mean for each reward function, and minigrpo's eval_accuracy: the accuracy reward's mean
    whatever the order of reward_funcs (rewards.accuracy_reward_index: the function marked is_accuracy_reward,
    else the one named correctness_reward or accuracy_reward, else the first). Under torchrun every rank must
    call it: the prompts are shared out and the completions gathered.

    With tools, each answer is a greedy episode and the tools' metrics are TRL's: eval_tools/call_frequency
    (calls per episode) and eval_tools/failure_frequency (the share of calls that failed)."""
    prompts = list(dataset["prompt"])
    tool_metrics = {}
    # Under torchrun each rank completes a slice of the prompts; every rank gets all completions back, in order.
    if tools:
        episodes = distributed.map_shards(lambda part: greedy_episodes(model, tokenizer, part, config, tools), prompts)
        completion_ids, completions, calls, failures = (list(column) for column in zip(*episodes, strict=True))
        tool_metrics = tool_call_metrics(sum(calls), sum(failures), len(prompts), prefix="eval_")
    else:
        completion_ids = distributed.map_shards(
            lambda part: greedy_completion_ids(model, tokenizer, part, config), prompts
        )
        # chat prompts: [{"role": "assistant", "content": ...}] each
        completions = as_trl_completions(prompts, tokenizer.batch_decode(completion_ids, skip_special_tokens=True))
    columns = {name: list(dataset[name]) for name in dataset.column_names if name != "prompt"}
    rewards_per_func, rewards = compute_rewards(
        reward_funcs,
        prompts,
        completions,
        completion_ids,  # the real ids: a length-based reward reads the same lengths as in training
        columns,
        config.reward_weights,
        config.reward_timeout,
    )
    accuracy = rewards_per_func[:, accuracy_reward_index(reward_funcs)]  # (N,)
    metrics = {"eval_accuracy": accuracy.nanmean().item(), "eval_reward": rewards.mean().item()}
    for f, func in enumerate(reward_funcs):
        metrics[f"eval_rewards/{reward_func_name(func)}/mean"] = rewards_per_func[:, f].nanmean().item()
    return metrics | tool_metrics


# --- k samples per problem: pass@k and maj@k --------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of one problem, c of them correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", arXiv 2107.03374, eq. 1):

        pass@k = 1 - C(n - c, k) / C(n, k)

    the chance that a size-k subset of the n samples, drawn without replacement, holds a correct one. It is
    computed as their numerically stable product, 1 - prod_{i = n - c + 1}^{n} (1 - k / i), which never forms the
    binomials (C(200, 100) alone overflows a float32). Sampling only k answers and checking them is unbiased too,
    but far noisier: n >= k samples give every k at once, each averaged over all subsets.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): need 0 <= c <= n and 1 <= k <= n (k at most the samples).")
    if n - c < k:  # every size-k subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def maj_at_k(answers: Sequence[Hashable | None], truth: Hashable, k: int) -> float:
    """Majority voting over k of one problem's n sampled answers (self-consistency), averaged *exactly* over all
    C(n, k) subsets of size k, not estimated from random subsets.

    answers: the n final answers (any hashable; None = no answer, which casts no vote). A subset scores 1 when
    `truth` has more votes than every other answer; when it ties with m others for the most votes it scores
    1 / (m + 1), the chance that a uniform tie-break picks it; with no votes at all it scores 0. maj@1 is the
    share of correct samples, and pass_at_k(n, c, 1) the same number.
    """
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj_at_k: k={k} with {len(answers)} answers; need 1 <= k <= n.")
    return float(maj_at_k_curve(answers, truth)[k - 1])


def maj_at_k_curve(answers: Sequence[Hashable | None], truth: Hashable) -> np.ndarray:
    """maj_at_k(answers, truth, k) for every k = 1..n, exactly. -> (n,) float64.

    Count the subsets in which `truth` gets v votes and each other answer at most v, with a generating function
    in the number of samples taken (rows j) and the number of answers tied with `truth` (columns m): for each
    other answer with c_a samples, the ways to take x of them are C(c_a, x) for x < v, and C(c_a, v) as a tie;
    the samples without an answer may be taken freely. Then maj@k = sum_v C(c_truth, v) sum_m dp[k - v, m] /
    (m + 1) / C(n, k). O(c_truth * answers * n^2 / v) small array operations: milliseconds for n = 64.
    """
    n = len(answers)
    votes = Counter(a for a in answers if a is not None)
    right, silent = votes.pop(truth, 0), sum(a is None for a in answers)
    others = list(votes.values())
    comb = np.array([[math.comb(a, b) for b in range(n + 1)] for a in range(n + 1)], dtype=np.float64)  # C(a, b)
    wins = np.zeros(n + 1)  # wins[k]: subsets of size k that vote for truth, ties weighted
    for v in range(1, right + 1):
        ties = n // v + 1  # at most n / v answers can each hold v votes
        dp = np.zeros((n + 1, ties + 1))  # dp[j, m]: ways to take j samples of the others with m ties at v
        dp[0, 0] = 1.0
        for count in others:
            new = np.zeros_like(dp)
            for x in range(min(count, v - 1) + 1):  # fewer votes than truth
                new[x:] += comb[count, x] * dp[: n + 1 - x]
            if count >= v:  # as many votes as truth: a tie
                new[v:, 1:] += comb[count, v] * dp[: n + 1 - v, :-1]
            dp = new
        free = np.array([comb[silent, x] for x in range(n + 1)])  # samples without an answer: any number
        dp = np.stack([np.convolve(dp[:, m], free)[: n + 1] for m in range(ties + 1)], axis=1)
        weighted = dp @ (1.0 / np.arange(1, ties + 2))  # (n + 1,): subsets of the others, ties weighted
        wins[v:] += comb[right, v] * weighted[: n + 1 - v]
    return wins[1:] / comb[n, 1:]


def sample_answers(model, tokenizer, prompts: list, n: int, config: GRPOConfig, seed: int = 0) -> list[list]:
    """n sampled completions of each prompt, as their final answers (tasks.arithmetic.extract_answer: an int, or
    None). (B prompts) -> B lists of n answers.

    Sampled as in training (config.temperature and the other sampling options, each prompt's n completions from
    one generator seeded by (seed, the prompt's index), so a prompt's samples do not depend on its neighbours),
    up to max(1, config.eval_batch_size // n) prompts per generate call. Under torchrun every rank must call it.
    """
    device = next(model.parameters()).device
    per_call = max(1, config.eval_batch_size // n)

    def answers_of(indexed: list) -> list[list]:
        result = []
        for start in range(0, len(indexed), per_call):
            batch = indexed[start : start + per_call]
            rows = [prompt for _, prompt in batch for _ in range(n)]  # group-major: n rows per prompt
            prompt_ids, prompt_mask = tokenize_prompts(tokenizer, rows, config.max_prompt_length, device)
            seeds = [seed * 1_000_003 + index for index, _ in batch]  # one generator per prompt
            completion_ids = generate_completions(
                model, tokenizer, prompt_ids, prompt_mask, config, num_generations=n, group_seeds=seeds
            )
            mask, _ = completion_mask_from_eos(completion_ids, eos_token_ids(model, tokenizer))
            texts = tokenizer.batch_decode(
                [row[: int(m)] for row, m in zip(completion_ids.tolist(), mask.sum(1).tolist(), strict=True)],
                skip_special_tokens=True,
            )
            result += [[extract_answer(t) for t in texts[b * n : (b + 1) * n]] for b in range(len(batch))]
        return result

    return distributed.map_shards(answers_of, list(enumerate(prompts)))


def pass_and_maj_at_k(answers: Sequence[Sequence], truths: Sequence, ks: Sequence[int]) -> dict[str, list[float]]:
    """pass@k and maj@k for each k in `ks`, averaged over problems. answers: B lists of n answers (None = none);
    truths: B answers; an answer is correct when it equals its truth (compare like with like: ints with ints).
    -> {"pass@k": [...], "maj@k": [...]}, one value per k."""
    if len(answers) != len(truths) or not answers:
        raise ValueError(f"{len(answers)} answer lists for {len(truths)} truths: give one list per problem.")
    passes, majorities = np.zeros(len(ks)), np.zeros(len(ks))
    for sampled, truth in zip(answers, truths, strict=True):
        curve = maj_at_k_curve(sampled, truth)  # (n,)
        correct = sum(a == truth for a in sampled)
        passes += [pass_at_k(len(sampled), correct, k) for k in ks]
        majorities += [curve[k - 1] for k in ks]
    return {"pass@k": (passes / len(answers)).tolist(), "maj@k": (majorities / len(answers)).tolist()}

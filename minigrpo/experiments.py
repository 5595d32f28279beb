"""Small helpers behind lessons 06 and 07: short runs, the variants, and the failure modes.

Nothing here is part of GRPO itself; these are the lab bench the last two
lessons stand on:

- ``VARIANTS`` and ``train_short_run``: Dr. GRPO, DAPO, GSPO and RLOO as a few
  GRPOConfig fields each, and a function that trains one of them from a fresh
  tiny Qwen.
- ``dynamic_sampling_mask`` / ``select_completions`` /
  ``DynamicSamplingGRPOTrainer``: DAPO's dynamic sampling, reduced to its
  filter (groups whose rewards are all equal are dropped from the update).
- ``per_token_gradient_weights``: the weight each ``loss_type`` gives one
  token, read off autograd through ``losses.aggregate_loss``.
- ``number_anywhere_reward``, ``at_least_reward``, ``make_length_bonus``: rewards
  that can be gamed (reward hacking, length growth).
- ``simulate_disconnect``: a reward function that raises KeyboardInterrupt on
  a chosen call, to interrupt a run for real and resume it.
- ``summarize_run`` / ``completion_table`` / ``plot_variant_comparison``:
  tables and a figure for comparing runs.

Notation: B prompts, G completions per prompt, N = B * G, T completion tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from minigrpo.advantages import group_rewards, zero_std_groups
from minigrpo.config import GRPOConfig
from minigrpo.losses import aggregate_loss
from minigrpo.rollout import Rollout
from minigrpo.trainer import GRPOTrainer


# --- the variants, as config fields ------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """A GRPO variant: the GRPOConfig fields it changes, and whether it filters zero-std groups."""

    overrides: dict = field(default_factory=dict)
    dynamic_sampling: bool = False
    paper: str = ""


VARIANTS: dict[str, Variant] = {
    "GRPO": Variant({}, paper="DeepSeekMath, arXiv 2402.03300"),
    "Dr. GRPO": Variant(
        dict(scale_rewards="none", loss_type="dr_grpo"), paper="Understanding R1-Zero-Like Training, arXiv 2503.20783"
    ),
    "DAPO": Variant(
        dict(loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True, beta=0.0),
        dynamic_sampling=True,
        paper="DAPO, arXiv 2503.14476",
    ),
    "GSPO": Variant(
        dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4, beta=0.0),
        paper="GSPO, arXiv 2507.18071",
    ),
    "RLOO": Variant(dict(baseline="rloo", scale_rewards="none"), paper="Back to Basics, arXiv 2402.14740"),
}


def variant_config(name: str, base: GRPOConfig) -> GRPOConfig:
    """`base` with the fields of VARIANTS[name] changed."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)}.")
    return base.replace(**VARIANTS[name].overrides)


def config_diff(config: GRPOConfig, base: GRPOConfig | None = None) -> dict:
    """The fields of `config` that differ from `base` (default: GRPOConfig()), as {name: value}."""
    base = base if base is not None else GRPOConfig()
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(GRPOConfig)
        if getattr(config, f.name) != getattr(base, f.name)
    }


# --- DAPO's dynamic sampling, as a filter ------------------------------------------
def dynamic_sampling_mask(grouped_rewards: torch.Tensor) -> torch.Tensor:
    """(B, G) rewards -> (B,) bool: True for the groups DAPO keeps (rewards not all equal).

    A group whose G rewards are equal has advantages exactly 0, so its
    completions add nothing to the policy gradient; they only add to the
    loss's normaliser (completions for "grpo", tokens for "dapo"), which
    shrinks the gradient of the groups that do carry signal. DAPO
    (arXiv 2503.14476, section 3.2) drops them and samples more prompts until
    the batch is full again; here we only drop them.
    """
    assert grouped_rewards.dim() == 2, f"grouped_rewards must be (B, G), got {tuple(grouped_rewards.shape)}"
    return ~zero_std_groups(grouped_rewards)


def select_completions(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """The rollout restricted to the completions where `rows` (N,) bool is True (n of them)."""
    assert rows.dtype == torch.bool and rows.shape == rollout.is_truncated.shape, "rows must be (N,) bool"
    index = rows.nonzero().squeeze(1)  # (n,)

    def pick(tensor):
        return None if tensor is None else tensor[index]

    return Rollout(
        prompt_ids=rollout.prompt_ids[index],  # (n, P)
        prompt_mask=rollout.prompt_mask[index],  # (n, P)
        completion_ids=rollout.completion_ids[index],  # (n, T)
        completion_mask=rollout.completion_mask[index],  # (n, T)
        is_truncated=rollout.is_truncated[index],  # (n,)
        completions=[rollout.completions[i] for i in index.tolist()],
        old_per_token_logps=pick(rollout.old_per_token_logps),
        ref_per_token_logps=pick(rollout.ref_per_token_logps),
    )


class DynamicSamplingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that drops zero-std groups before the update (DAPO's filter, without the refill).

    Logs ``dynamic_sampling/kept_fraction``; when every group is dropped the
    step takes no optimizer step (there is no signal to follow).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.config
        if config.per_device_train_batch_size != config.num_completions:
            raise ValueError(
                f"dynamic sampling leaves a varying number of completions per step, so the update must be one "
                f"micro-batch: set per_device_train_batch_size = N = {config.num_completions} "
                f"(it is {config.per_device_train_batch_size})."
            )

    def optimize(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        G = self.config.num_generations
        keep = dynamic_sampling_mask(group_rewards(rewards, G))  # (B,)
        metrics = {"dynamic_sampling/kept_fraction": keep.float().mean().item()}
        if not keep.any():
            return {**metrics, "loss": 0.0, "grad_norm": 0.0}
        rows = keep.repeat_interleave(G)  # (N,)
        metrics.update(super().optimize(select_completions(rollout, rows), rewards[rows]))
        return metrics


# --- short runs ---------------------------------------------------------------------
def train_short_run(
    config: GRPOConfig,
    reward_funcs: Callable | Sequence[Callable] | None = None,
    model_name: str = "tiny",
    train_dataset=None,
    eval_dataset=None,
    dynamic_sampling: bool = False,
    eval_size: int = 200,
) -> GRPOTrainer:
    """Train a fresh copy of `model_name` with `config`; returns the trainer (its .history holds the metrics).

    Defaults: 2000 training sums, `eval_size` held-out sums (0: no evaluation),
    rewards [correctness, format] (weight them with config.reward_weights).
    Every call starts from the same weights, so runs differ only by their config.
    """
    from minigrpo.models import load_model_and_tokenizer
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset

    model, tokenizer = load_model_and_tokenizer(model_name)
    reward_funcs = [correctness_reward, format_reward] if reward_funcs is None else reward_funcs
    train_dataset = train_dataset if train_dataset is not None else make_arithmetic_dataset(2000, "train")
    if eval_dataset is None and eval_size > 0:
        eval_dataset = make_arithmetic_dataset(eval_size, "test")
    trainer_cls = DynamicSamplingGRPOTrainer if dynamic_sampling else GRPOTrainer
    trainer = trainer_cls(model, tokenizer, reward_funcs, train_dataset, config, eval_dataset=eval_dataset)
    trainer.train()
    return trainer


def summarize_run(history: Sequence[dict], last: int = 5) -> dict:
    """Mean of each metric over the last `last` steps that logged it (eval/* : the last value)."""
    if not history:
        raise ValueError("the history is empty: train for at least one step.")
    keys = {key for metrics in history for key in metrics if key != "step"}
    summary = {}
    for key in sorted(keys):
        values = [m[key] for m in history if key in m]
        window = values[-1:] if key.startswith("eval/") else values[-last:]
        summary[key] = sum(window) / len(window)
    return summary


# --- loss normalisers, read off autograd --------------------------------------------
def per_token_gradient_weights(
    completion_mask: torch.Tensor, loss_type: str, max_completion_length: int | None = None
) -> torch.Tensor:
    """d loss / d (per-token loss) for each token: how much each token counts under `loss_type`. (N, T) -> (N, T).

    Computed by autograd through losses.aggregate_loss (so it is the package's
    own definition, not a copy): "grpo" gives 1 / (N |o_i|), "bnpo" and "dapo"
    1 / (total tokens), "dr_grpo" 1 / (N T_max). Padding gets 0.
    """
    per_token_loss = torch.zeros(completion_mask.shape, requires_grad=True)  # (N, T)
    loss = aggregate_loss(per_token_loss, completion_mask, loss_type, max_completion_length)
    (weights,) = torch.autograd.grad(loss, per_token_loss)
    return weights  # (N, T)


# --- a reward that can be gamed -----------------------------------------------------
_ANY_NUMBER = re.compile(r"-?\d{1,30}")


def number_anywhere_reward(prompts, completions, completion_ids=None, *, answer, **columns) -> list[float]:
    """A naive reward: 1.0 when the right number appears *anywhere* in the completion.

    It looks reasonable and it is wrong: "<answer>18 19 20</answer>" scores 1,
    so a policy that lists several guesses is paid for hedging. Use it to see
    reward hacking; the honest reward is tasks.arithmetic.correctness_reward.
    """
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else str(completion[-1]["content"])
        scores.append(float(str(expected).strip() in _ANY_NUMBER.findall(text)))
    return scores


def at_least_reward(prompts, completions, completion_ids=None, *, answer, **columns) -> list[float]:
    """A verifier with a one-character bug: 1.0 when the answer is >= the right one (`>=` where `==` was meant).

    Every wrong answer that is too big is paid as if it were right, and the
    policy finds that quickly: it only has to make its numbers bigger.
    """
    from minigrpo.tasks.arithmetic import completion_text, extract_answer

    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        predicted = extract_answer(completion_text(completion))
        scores.append(float(predicted is not None and predicted >= int(expected)))
    return scores


def make_length_bonus(max_completion_length: int) -> Callable:
    """A reward for "thoroughness": |o_i| / max_completion_length, from 0 (empty) to 1 (hit the limit).

    Added to the correctness reward it looks harmless, but a completion that
    never stops earns the full bonus, and a policy can learn not to stop much
    more easily than it can learn to add.
    """
    if max_completion_length < 1:
        raise ValueError(f"max_completion_length={max_completion_length}: it must be >= 1.")

    def length_bonus(prompts, completions, completion_ids, **columns) -> list[float]:
        return [min(len(ids), max_completion_length) / max_completion_length for ids in completion_ids]

    return length_bonus


# --- an interruption you can reproduce ---------------------------------------------
def simulate_disconnect(reward_func: Callable, on_call: int) -> Callable:
    """`reward_func`, except that its `on_call`-th call raises KeyboardInterrupt (a "Colab disconnect").

    The trainer calls the reward functions once per training step (and once per
    evaluation), so with no eval_dataset the interruption lands in step `on_call`.
    """
    if on_call < 1:
        raise ValueError(f"on_call={on_call}: count calls from 1.")
    calls = 0

    @functools.wraps(reward_func)
    def wrapped(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == on_call:
            raise KeyboardInterrupt(f"simulated disconnect in call {on_call} of {reward_func.__name__}")
        return reward_func(*args, **kwargs)

    return wrapped


# --- tables and a figure ------------------------------------------------------------
def completion_table(questions: Sequence[str], answers: Sequence, before: Sequence[str], after: Sequence[str]):
    """A pandas DataFrame: question, answer, completion before / after training, and whether each is right."""
    import pandas as pd

    from minigrpo.tasks.arithmetic import correctness_reward

    right_before = correctness_reward(None, list(before), answer=list(answers))
    right_after = correctness_reward(None, list(after), answer=list(answers))
    return pd.DataFrame(
        {
            "question": list(questions),
            "answer": list(answers),
            "before": list(before),
            "ok before": [bool(r) for r in right_before],
            "after": list(after),
            "ok after": [bool(r) for r in right_after],
        }
    )


def plot_variant_comparison(histories: dict[str, Sequence[dict]], keys: Sequence[str], title: str | None = None):
    """One panel per metric in `keys`, one line per run in `histories` ({name: history}). Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for name, history in histories.items():
            points = [(m["step"], m[key]) for m in history if key in m]
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o" if len(points) < 8 else None, ms=3, label=name)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

"""Labs: short runs of the bundled tiny Qwen that the checks and the exercises train.

- the tiny model, a small GRPO config and the package's own GRPO step, which the
  checks of exercises 10 and 08 compare a learner's step and predicted loss with;
- exercise 14's failure modes: `PlantedBugTrainer`, a GRPOTrainer with one planted
  silent bug (in the spirit of Spinning Up's problem set 2), the mystery runs it
  trains (each with one bug or none, more candidates than runs, so that no answer
  follows from the others) and the diagnostics a learner reads to tell them apart.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from collections.abc import Sequence

import torch

from minigrpo.advantages import group_relative_advantages, group_rewards, zero_std_groups
from minigrpo.config import GRPOConfig
from minigrpo.logprobs import completion_position_ids, masked_mean
from minigrpo.losses import aggregate_loss, clipped_surrogate, importance_ratio, kl_penalty
from minigrpo.models import load_model_and_tokenizer, make_reference_model
from minigrpo.rewards import compute_rewards
from minigrpo.rollout import Rollout, repeat_for_group, sample_group_rollout
from minigrpo.tasks.arithmetic import REWARD_WEIGHTS, correctness_reward, format_reward, make_arithmetic_dataset
from minigrpo.trainer import GRPOTrainer


# --- the tiny Qwen, one thread, one small step ------------------------------------------
@contextlib.contextmanager
def single_thread():
    """torch on one thread for the tiny model: its ops are too small to gain from threads, and threads spin
    badly when the CPUs are shared (a notebook, a test suite and a grader at once)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


_TINY_CACHE: dict = {}


def tiny_model_and_tokenizer():
    """A fresh copy of the bundled tiny Qwen (loaded once per process, then deep-copied)."""
    if "model" not in _TINY_CACHE:
        _TINY_CACHE["model"], _TINY_CACHE["tokenizer"] = load_model_and_tokenizer("tiny", device="cpu")
    return copy.deepcopy(_TINY_CACHE["model"]), _TINY_CACHE["tokenizer"]


def small_grpo_config(output_dir: str, **overrides) -> GRPOConfig:
    """4 prompts x G=4 on the tiny Qwen, one micro-batch: a GRPO step in a fraction of a second. At a constant
    learning rate: the reference takes several steps of a max_steps=1 config, as a learner's optimizer does at
    config.learning_rate; tiny_cpu()'s linear decay would give every step after the first the rate 0."""
    preset = dict(
        prompts_per_step=4,
        num_generations=4,
        per_device_train_batch_size=16,
        lr_scheduler_type="constant",
        max_steps=1,
        eval_steps=0,
        save_steps=0,
        reward_weights=list(REWARD_WEIGHTS),
        output_dir=output_dir,
    )
    return GRPOConfig.tiny_cpu(**{**preset, **overrides})


class ReferenceSteps:
    """The package's GRPO update (GRPOTrainer.update) on `model`, one batch at a time, with one optimizer."""

    def __init__(self, model, tokenizer, config) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.ref_model = make_reference_model(model) if config.beta != 0 else None
        self.trainer = GRPOTrainer(
            model,
            [correctness_reward, format_reward],
            args=config,
            train_dataset=make_arithmetic_dataset(16, "train", seed=0),
            processing_class=tokenizer,
            ref_model=self.ref_model,
        )

    def step(self, batch: dict, seed: int) -> dict:
        """Sample after torch.manual_seed(seed), score, update -> {"loss", "reward", "grad_norm"}; the model keeps
        the step's gradients."""
        rollout, rewards = seeded_rollout(self.model, self.tokenizer, batch, self.config, self.ref_model, seed)
        metrics = self.trainer.update(rollout, rewards)
        return {"loss": metrics["loss"], "reward": rewards.mean().item(), "grad_norm": metrics["grad_norm"]}

    def informative_seed(self, batch: dict, seed: int) -> int:
        """The first seed from `seed` on whose rollout from the current weights has signal (informative_rollout)."""
        return informative_rollout(self.model, self.tokenizer, batch, self.config, self.ref_model, seed)[2]


def reference_grpo_steps(model, tokenizer, batches: list[dict], config, seeds: list[int]) -> tuple[list[dict], object]:
    """The package's GRPO update (GRPOTrainer.update) on each batch in turn; returns its metrics and the trainer."""
    reference = ReferenceSteps(model, tokenizer, config)
    return [reference.step(batch, seed) for batch, seed in zip(batches, seeds, strict=True)], reference.trainer


def informative_rollout(
    model, tokenizer, batch: dict, config, ref_model, seed: int, tries: int = 20
) -> tuple[Rollout, torch.Tensor, int]:
    """seeded_rollout with the first of seed, seed + 1, ... whose samples give some group unequal rewards
    -> (rollout, rewards (N,), the seed); after `tries` seeds, the first one's.

    When every group's G rewards are equal, every advantage is 0 and so is the gradient at ratio 1 (the KL's too
    before the first step): what is left is rounding noise, which Adam turns into steps of lr * sign(noise). A case
    built on it tells a right update from a wrong one by chance, and with 4 prompts of the tiny Qwen some seeds do.
    """
    G = config.num_generations
    for candidate in range(seed, seed + tries):
        rollout, rewards = seeded_rollout(model, tokenizer, batch, config, ref_model, candidate)
        if not zero_std_groups(rewards.view(-1, G)).all():  # (B, G): some group's rewards differ
            return rollout, rewards, candidate
    return (*seeded_rollout(model, tokenizer, batch, config, ref_model, seed), seed)


def seeded_rollout(model, tokenizer, batch: dict, config, ref_model, seed: int) -> tuple[Rollout, torch.Tensor]:
    """Sample G completions per prompt of `batch` after torch.manual_seed(seed) and score them -> (Rollout, (N,))."""
    torch.manual_seed(seed)
    rollout = sample_group_rollout(model, tokenizer, batch["prompt"], config, ref_model)
    G = config.num_generations
    columns = {k: repeat_for_group(v, G) for k, v in batch.items() if k != "prompt"}
    _, rewards = compute_rewards(
        [correctness_reward, format_reward],
        repeat_for_group(batch["prompt"], G),
        rollout.completions,
        rollout.completion_id_lists(),
        columns,
        config.reward_weights,
    )
    return rollout, rewards


# --- exercise 14: a training run with a planted silent bug --------------------------------
BUGS = {
    "shifted_logps": "log-probs shifted by one: completion token t is scored by the logits at position t, not t - 1",
    "prompt_in_mask": "prompt tokens inside the loss mask: the loss also trains on the prompt",
    "padding_in_mask": "padding inside the loss mask: the mask is not cut at EOS, so the pad tokens after it count",
    "batch_std": "advantages scaled by the std of the whole batch instead of each group's std",
    "wrong_detach": "the wrong tensor detached: the current log-probs, so the ratio carries no gradient",
}
NO_BUG = "none"
"""Exercise 14's answer for a mystery run that has no bug (a healthy run)."""
MYSTERY_RUNS = dict(
    zip("ABCDE", ("wrong_detach", "padding_in_mask", NO_BUG, "batch_std", "shifted_logps"), strict=True)
)
"""The answer key of exercise 14: mystery run -> its planted bug, or NO_BUG. Six answers (five bugs and NO_BUG) for
five runs, prompt_in_mask in none of them: no answer follows from the others, each comes from the run's diagnostics."""
RUN_SEEDS = {"healthy": 0, **{run: seed for seed, run in enumerate(MYSTERY_RUNS, start=1)}}
"""Each run samples from its own seed: a healthy mystery run does not repeat the healthy run's numbers."""


class PlantedBugTrainer(GRPOTrainer):
    """GRPOTrainer with one planted bug (or none, bug=None), logging diagnostics/* metrics.

    It overrides `update` (the GRPO step, one micro-batch per step) so that each
    bug sits where it would in real code, and computes its log-probs with
    `token_logps`, written out in full so the shifted slice and the prompt in the
    mask are visible. With bug=None its loss and gradient are GRPOTrainer's.
    """

    def __init__(self, *args, bug: str | None = None, **kwargs):
        if bug is not None and bug not in BUGS:
            raise ValueError(f"bug={bug!r}: use None (a healthy run) or one of {sorted(BUGS)}.")
        super().__init__(*args, **kwargs)
        self.bug = bug

    def token_logps(self, model, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, T') log-probs and entropies of the tokens the loss sees, and their mask (T' = T, or P + T - 1)."""
        input_ids, attention_mask = rollout.input_ids, rollout.attention_mask  # (N, L)
        L, T = input_ids.shape[1], rollout.completion_ids.shape[1]
        logits = (
            model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=completion_position_ids(attention_mask),
                use_cache=False,
            ).logits.float()
            / self.config.temperature
        )  # (N, L, V)
        if self.bug == "prompt_in_mask":
            scores, labels, mask = logits[:, :-1], input_ids[:, 1:], attention_mask[:, 1:]  # every real token
        elif self.bug == "shifted_logps":
            scores, labels, mask = logits[:, L - T :], input_ids[:, L - T :], rollout.completion_mask  # off by one
        elif self.bug == "padding_in_mask":  # every position of the (N, T) block, the pad tokens after EOS too
            scores, labels = logits[:, L - T - 1 : -1], input_ids[:, L - T :]
            mask = torch.ones_like(rollout.completion_mask)  # (N, T)
        else:
            scores, labels, mask = logits[:, L - T - 1 : -1], input_ids[:, L - T :], rollout.completion_mask
        log_probs = torch.log_softmax(scores, dim=-1)  # (N, T', V)
        logps = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (N, T')
        entropy = -(log_probs.exp() * log_probs).sum(-1)  # (N, T')
        return logps, entropy, mask

    def update(self, rollout: Rollout, rewards: torch.Tensor) -> dict:
        config = self.config
        grouped = group_rewards(rewards, config.num_generations)  # (B, G)
        scale = "batch" if self.bug == "batch_std" else config.scale_rewards
        grouped_advantages = group_relative_advantages(
            grouped, scale, config.baseline, config.std_ddof, config.advantage_epsilon
        )  # (B, G)
        advantages = grouped_advantages.flatten()  # (N,)
        self.optimizer.zero_grad(set_to_none=True)
        logps, entropy, mask = self.token_logps(self.model, rollout)
        with torch.no_grad():
            ref_logps = self.token_logps(self.ref_model, rollout)[0] if config.beta else None
        current = logps.detach() if self.bug == "wrong_detach" else logps
        ratio = importance_ratio(current, logps.detach(), mask)  # (N, T')
        per_token_loss = -clipped_surrogate(ratio, advantages, config.epsilon_low, config.clip_epsilon_high)
        metrics = {}
        if config.beta:
            kl = kl_penalty(logps, ref_logps, config.kl_estimator)  # (N, T')
            per_token_loss = per_token_loss + config.beta * kl
            metrics["kl"] = masked_mean(kl.detach(), mask).item()
        loss = aggregate_loss(per_token_loss, mask, config.loss_type, config.max_completion_length)
        if loss.requires_grad:  # wrong_detach: nothing to differentiate when beta is 0
            loss.backward()
        metrics.update(loss=loss.item(), entropy=masked_mean(entropy.detach(), mask).item())
        metrics["grad_norm"] = self.clip_gradients(self.trainable_parameters(), config.max_grad_norm)
        self.set_learning_rate(self.step)
        self.optimizer.step()
        metrics.update(diagnostics(logps.detach(), entropy.detach(), mask, grouped, grouped_advantages))
        return metrics


def diagnostics(
    logps: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, grouped: torch.Tensor, grouped_advantages
) -> dict:
    """The diagnostics/* metrics that tell the planted bugs apart.

    logps, entropy, mask: (N, T') of the tokens the loss sees; grouped rewards and
    grouped_advantages: (B, G). On-policy, -log p of the sampled tokens matches the
    entropy on average (nll_minus_entropy about 0); each group scaled by its own std
    has advantages of std about 1.
    """
    varied = grouped.std(1) > 0  # (B,) groups that carry a signal
    return {
        "diagnostics/nll_minus_entropy": (masked_mean(-logps, mask) - masked_mean(entropy, mask)).item(),
        "diagnostics/loss_tokens_per_completion": mask.sum().item() / mask.shape[0],
        "diagnostics/advantage_std_in_group": grouped_advantages[varied].std(1).mean().item()
        if varied.any()
        else float("nan"),
    }


DIAGNOSTICS = [
    ("reward", "reward"),
    ("loss", "loss"),
    ("grad_norm", "grad_norm"),
    ("kl", "kl"),
    ("nll-H", "diagnostics/nll_minus_entropy"),
    ("loss tok/compl", "diagnostics/loss_tokens_per_completion"),
    ("compl length", "completions/mean_length"),
    ("longest compl", "completions/max_length"),
    ("adv std in grp", "diagnostics/advantage_std_in_group"),
]


def planted_bug_run(run: str, max_steps: int, seed: int | None = None) -> list[dict]:
    """Train the tiny Qwen for `max_steps` steps: run "healthy" (no bug) or a mystery run "A".."E".

    Returns the metric history (one dict per step) with the diagnostics/* metrics
    the exercise reads: nll_minus_entropy (mean -log p of the sampled tokens
    minus the mean entropy: about 0 on-policy), loss_tokens_per_completion and
    advantage_std_in_group (about 1 when each group is scaled by its own std).
    seed: None = the run's own seed (RUN_SEEDS).
    """
    if run != "healthy" and run not in MYSTERY_RUNS:
        raise ValueError(f"run={run!r}: use 'healthy' or one of {sorted(MYSTERY_RUNS)}.")
    bug = None if run == "healthy" else MYSTERY_RUNS[run]
    return run_with_bug(None if bug == NO_BUG else bug, max_steps, RUN_SEEDS[run] if seed is None else seed)


def run_with_bug(bug: str | None, max_steps: int, seed: int = 0) -> list[dict]:
    """Train the tiny Qwen for `max_steps` steps with PlantedBugTrainer(bug=bug) (None: no bug); the history."""
    model, tokenizer = tiny_model_and_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        config = small_grpo_config(
            tmp,
            prompts_per_step=4,
            num_generations=8,
            per_device_train_batch_size=32,
            max_steps=max_steps,
            seed=seed,
            save_steps=10**9,
        )
        trainer = PlantedBugTrainer(
            model,
            [correctness_reward, format_reward],
            args=config,
            train_dataset=make_arithmetic_dataset(500, "train", seed=seed),
            processing_class=tokenizer,
            ref_model=make_reference_model(model),
            bug=bug,
        )
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull), single_thread():
            trainer.train()  # no progress bar in the notebook
        return trainer.state.log_history


def diagnostics_table(histories: dict[str, list[dict]], steps: Sequence[int] | None = None) -> str:
    """A text table of the diagnostics of several runs, at the given steps (default: first and last)."""
    header = f"{'run':>8} {'step':>4} " + " ".join(f"{label:>14}" for label, _ in DIAGNOSTICS)
    lines = [header, "-" * len(header)]
    for name, history in histories.items():
        chosen = sorted({0, len(history) - 1}) if steps is None else [s - 1 for s in steps if s <= len(history)]
        for index in chosen:
            metrics = history[index]
            cells = " ".join(f"{metrics.get(key, float('nan')):>14.4f}" for _, key in DIAGNOSTICS)
            lines.append(f"{name:>8} {metrics['step']:>4} {cells}")
    return "\n".join(lines)


# --- the capstone: the package's GRPO update, step by step, and the learning run ------------------
class RecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that records, at each optimizer step, its loss, its gradient before clipping and the weights
    after the step: what the capstone compares a learner's from-scratch update with, pass by pass."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses, self.gradients, self.weights = [], [], []

    def clip_gradients(self, params: list[torch.nn.Parameter], max_norm: float, advantages=None) -> float:
        self.gradients.append({n: p.grad.detach().clone() for n, p in self.model.named_parameters()})
        return super().clip_gradients(params, max_norm, advantages)

    def grpo_step(self, *args, **kwargs) -> dict:
        totals = super().grpo_step(*args, **kwargs)
        self.losses.append(totals["loss"])
        self.weights.append({n: p.detach().clone() for n, p in self.model.named_parameters()})
        return totals


def capstone_config(output_dir: str, **overrides) -> GRPOConfig:
    """The capstone's exactness cases: 4 prompts x G=4 in 4 micro-batches of 4 completions, the DeepSeekMath loss
    (k3 KL, beta 0.04, "grpo" aggregation), each completion's log-probs from its own forward pass."""
    preset = dict(per_device_train_batch_size=4, share_prompt_prefix=False)
    return small_grpo_config(output_dir, **{**preset, **overrides})


def reference_capstone_update(
    model, tokenizer, rollout: Rollout, rewards: torch.Tensor, config
) -> RecordingGRPOTrainer:
    """The package's update (GRPOTrainer.update: num_iterations optimizer steps) on `rollout`, recorded."""
    trainer = RecordingGRPOTrainer(
        model,
        [correctness_reward, format_reward],
        args=config,
        train_dataset=make_arithmetic_dataset(16, "train", seed=0),
        processing_class=tokenizer,
        ref_model=make_reference_model(model),
    )
    trainer.update(rollout, rewards)
    return trainer


def position_sensitive_qwen(model, longest: int):
    """A copy of `model` (a Qwen2) whose rotary embedding switches frequencies past `longest` positions (LongRoPE,
    as long-context checkpoints configure it): short factors (the model's own frequencies) while the largest
    position id is below `longest`, long factors (4x slower) beyond.

    With plain RoPE only positions' differences count, so a forward pass without `position_ids` on left-padded rows
    (every row numbered from its first padding column) gives the same log-probs within ~1e-5. Here the largest
    position decides the frequencies: rows padded on the left by more columns than `longest` leaves room for, scored
    without position ids numbered from each row's first real token, get the long factors and other log-probs."""
    import transformers
    from transformers import Qwen2ForCausalLM

    config = copy.deepcopy(model.config)
    half = config.hidden_size // config.num_attention_heads // 2
    rope = {"rope_type": "longrope", "short_factor": [1.0] * half, "long_factor": [4.0] * half}
    rope["original_max_position_embeddings"] = longest
    config.max_position_embeddings = 4 * longest
    # by the version, not by hasattr: transformers 4 keeps a saved config's unknown `rope_parameters` as a plain
    # attribute (the bundled model was saved by transformers 5) and never reads it
    if int(transformers.__version__.split(".")[0]) >= 5:
        config.rope_parameters = {**rope, "rope_theta": config.rope_parameters.get("rope_theta", 10000.0)}
    else:  # transformers 4 (its longrope reads the switch from the config itself)
        config.rope_scaling, config.original_max_position_embeddings = rope, longest
    sensitive = Qwen2ForCausalLM(config).to(next(model.parameters()).dtype).eval()
    sensitive.load_state_dict(model.state_dict())
    return sensitive


CAPSTONE_LEARNING = dict(
    max_steps=80,
    prompts_per_step=16,
    learning_rate=3e-4,
    train_problems=1000,
    eval_split="test",
    eval_problems=200,
    grading_seed=0,
    bar=0.06,
    reference_rises=(0.190, 0.285, 0.290, 0.185, 0.155),
    probe_tolerance=0.05,
    timeout=900,
)
"""The capstone's learning check: the learner's loop trains the tiny Qwen for max_steps steps of prompts_per_step
prompts x G=8 at a constant learning_rate on train_problems training problems, and its greedy accuracy on
eval_problems held-out problems (the test split, never trained on) must rise by at least `bar`. The same check in
the suite, the grader and the notebook (MINIGRPO_QUICK does not shorten it).

Where the run comes from: one seed, `case_seed(grading_seed)`, draws the torch seed, the training problems and the
held-out problems (`capstone_learning_data`). In a notebook it is grading_seed itself (the same run every time);
when graded it is drawn from the judge's secret, so no notebook knows which problems it will be asked.

Before the run, the loop's update must follow the rewards (`probe_tolerance`, `update_follows_rewards`): one step on
a batch the judge draws, with the rewards and with every reward negated, must move the weights in opposite
directions, as GRPO's first step does. A loop that fine-tunes on answers, or loads weights trained elsewhere, moves
them the same way whatever the rewards say, and earns no learning points however much its accuracy rises.

The bar sits below the worst rise of the package's own GRPOTrainer, at half of it: a learner's own sampler draws other
tokens than the package's, so a correct loop follows another path. `reference_rises` are the rises of seeds 0-4
measured by `python scripts/capstone_bar.py`, each seed drawing its problems as the grader's does; docs/grading.md
("Where the grader's constants come from") gives the other seeds measured and why 80 steps."""


def capstone_learning_config(output_dir: str, settings: dict, seed: int = 0) -> GRPOConfig:
    """The learning run's config: the DeepSeekMath loss at the tiny model's sizes, 2 micro-batches per step."""
    B, G = settings["prompts_per_step"], 8
    return small_grpo_config(
        output_dir,
        prompts_per_step=B,
        num_generations=G,
        per_device_train_batch_size=B * G // 2,
        max_steps=settings["max_steps"],
        learning_rate=settings["learning_rate"],
        share_prompt_prefix=False,
        save_steps=10**9,
        seed=seed,
    )


def held_out_accuracy(model, tokenizer, num_problems: int = 200, split: str = "test", seed: int = 0) -> float:
    """Greedy accuracy of `model` on `num_problems` problems of `split` (test: held out from training) drawn from
    `seed`: the capstone's given evaluation."""
    from minigrpo.run.evaluation import evaluate_model

    with tempfile.TemporaryDirectory() as tmp:
        config = small_grpo_config(tmp)
    problems = make_arithmetic_dataset(num_problems, split, seed=seed)
    return evaluate_model(model, tokenizer, problems, [correctness_reward, format_reward], config)["eval_accuracy"]


def capstone_learning_data(settings: dict, seed: int = 0) -> tuple:
    """(training problems, the accuracy before-and-after function) of the capstone's learning run, both drawn from
    `seed`: the training problems from the train split, the held-out problems from the test split."""
    train = make_arithmetic_dataset(settings["train_problems"], "train", seed=seed)
    return train, lambda model, tokenizer: held_out_accuracy(
        model, tokenizer, settings["eval_problems"], settings["eval_split"], seed
    )


class NegatedReward:
    """A reward function that gives minus what `reward_func` gives: the learning check's probe of a loop's update.

    A class of the package, not a closure: the judge sends it to the learner's kernel by pickle."""

    def __init__(self, reward_func):
        self.reward_func = reward_func
        self.__name__ = reward_func.__name__  # what a loop logs the reward under

    def __call__(self, prompts, completions, *args, **columns) -> list[float]:
        return [-reward for reward in self.reward_func(prompts, completions, *args, **columns)]


def update_follows_rewards(before: dict, with_rewards: dict, with_negated_rewards: dict) -> tuple[float, float]:
    """How one step moved the weights with the rewards (d+) and with every reward negated (d-), from the same
    weights and random state: (|d+ + d-| / |d+ - d-|, |d+ - d-|), norms over every parameter.

    GRPO's first step negates exactly: the advantages change sign, the ratio is 1 and the k3 KL's gradient is 0 (the
    policy is the reference), so the gradient and an AdamW, SGD or clipped step change sign too: about 0. An update
    that ignores the rewards (fine-tuning on answers, weights loaded from a file) moves both ways alike: infinity
    (d+ = d-). before, with_rewards, with_negated_rewards: {parameter name: tensor}."""
    plus = [with_rewards[n].double() - before[n].double() for n in before]
    minus = [with_negated_rewards[n].double() - before[n].double() for n in before]
    spread = torch.sqrt(sum(((p - m) ** 2).sum() for p, m in zip(plus, minus, strict=True))).item()
    agree = torch.sqrt(sum(((p + m) ** 2).sum() for p, m in zip(plus, minus, strict=True))).item()
    return (agree / spread if spread > 0 else float("inf")), spread


def reference_learning_run(settings: dict, seed: int) -> tuple[float, float]:
    """The package's GRPOTrainer on the capstone's learning run drawn from `seed` (`capstone_learning_data`, the
    grader's draw from its secret): held-out accuracy (before, after)."""
    model, tokenizer = tiny_model_and_tokenizer()
    with tempfile.TemporaryDirectory() as tmp, single_thread():
        config = capstone_learning_config(tmp, settings, seed)
        train, accuracy = capstone_learning_data(settings, seed)
        before = accuracy(model, tokenizer)
        trainer = GRPOTrainer(
            model,
            [correctness_reward, format_reward],
            args=config,
            train_dataset=train,
            processing_class=tokenizer,
            ref_model=make_reference_model(model),
        )
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            trainer.train()
        return before, accuracy(model, tokenizer)

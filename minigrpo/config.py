"""GRPOConfig: every knob of a GRPO run in one flat dataclass.

Field names follow TRL's ``GRPOConfig`` wherever TRL has one, so that a learner
who moves to TRL recognises them. Defaults follow the DeepSeekMath paper
(arXiv 2402.03300), *not* TRL's moving defaults:

| field            | minigrpo (paper) | TRL 1.x default | what differs                              |
| ---------------- | ---------------- | --------------- | ----------------------------------------- |
| beta             | 0.04             | 0.0             | TRL drops the KL term (and the ref model) |
| loss_type        | "grpo"           | "dapo"          | per-sequence mean vs token-level mean     |
| scale_rewards    | "group"          | "group"         | (was a bool before TRL 0.20)              |
| epsilon          | 0.2              | 0.2             |                                           |
| num_generations  | 8                | 8               |                                           |
| num_iterations   | 1                | 1               |                                           |
| use_bias_correction_kl | (no)       | True            | TRL 1.16 multiplies the KL by the ratio   |

Notation (used everywhere in the package): B prompts per step, G =
num_generations completions per prompt, N = B * G completions, T completion
tokens, P prompt tokens, V vocabulary size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
LR_SCHEDULERS = ("constant", "linear")
SCALE_REWARDS = ("group", "batch", "none")
BASELINES = ("mean", "rloo")
KL_ESTIMATORS = ("k1", "k2", "k3")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass
class GRPOConfig:
    """Hyper-parameters of a GRPO run (TRL names, paper defaults)."""

    # --- the group -------------------------------------------------------------
    num_generations: int = 8
    """G, completions sampled per prompt. At least 2 (a group of one has no baseline). Typical 4-16."""
    prompts_per_step: int = 16
    """B, prompts per training step; N = B * G completions. (TRL: generation_batch_size / num_generations.)"""
    per_device_train_batch_size: int = 32
    """Completions per micro-batch in the update; must divide N. Smaller saves memory, same gradient."""

    # --- sampling ----------------------------------------------------------------
    max_prompt_length: int = 256
    """Longest prompt in tokens; longer prompts are an error (raise it or shorten the prompt)."""
    max_completion_length: int = 64
    """T_max, new tokens per completion. Also Dr. GRPO's constant normaliser. Typical 32-1024."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed at the same temperature (as TRL does)."""
    top_p: float = 1.0
    """Nucleus sampling; 1.0 samples from the full distribution (what the policy gradient assumes)."""
    fast_generation: bool = False
    """Opt-in: a static KV cache in `generate`, which transformers then compiles (CUDA graphs on a GPU); faster
    decoding after a slow first call. Off by default; turn it on with GRPOConfig(fast_generation=True) on a GPU.
    `python bench/gpu_check.py` checks on your GPU that its greedy tokens equal the plain path's."""
    share_prompt_prefix: bool = True
    """Run each prompt once per group instead of G times and reuse its KV cache for the G completions
    (generation prefill, reference and policy log-probs). Same numbers up to float rounding, far less work
    when prompts are long. False = the plain path. Applies to micro-batches of whole groups."""

    # --- advantages (stage 3) ----------------------------------------------------
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide (r - baseline) by the std of the group, of the whole batch, or not at all (Dr. GRPO)."""
    baseline: Literal["mean", "rloo"] = "mean"
    """'mean' of the group (GRPO) or leave-one-out mean of the others (RLOO)."""
    std_ddof: int = 1
    """1 = Bessel-corrected std (torch.std, TRL, CS336); 0 = population std (numpy.std)."""
    advantage_epsilon: float = 1e-4
    """eps in (r - mean) / (std + eps); keeps near-constant groups from blowing up."""

    # --- objective (stage 4) -----------------------------------------------------
    beta: float = 0.04
    """KL coefficient. 0 disables the KL term and the reference model is never loaded."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman, 'Approximating KL'); k3 is DeepSeekMath's."""
    epsilon: float = 0.2
    """Lower clip range: the ratio is clipped below at 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip range (DAPO's clip-higher, e.g. 0.28); None means the same as epsilon."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """'token': one ratio per token (GRPO); 'sequence': one ratio per completion (GSPO)."""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "grpo"
    """How per-token losses are averaged; see losses.aggregate_loss."""
    mask_truncated_completions: bool = False
    """Drop completions that hit max_completion_length without EOS from the loss (DAPO)."""
    num_iterations: int = 1
    """mu, optimisation passes over each rollout batch. 1 = strictly on-policy (ratio == 1)."""

    # --- optimisation ------------------------------------------------------------
    learning_rate: float = 1e-6
    """AdamW step size. ~1e-6 for a 0.5B model; the tiny preset uses 3e-4."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    """AdamW betas (DeepSeekMath uses 0.9 / 0.95; TRL 0.9 / 0.999)."""
    warmup_steps: int = 0
    """Linear warm-up steps of the learning rate."""
    lr_scheduler_type: Literal["constant", "linear"] = "constant"
    """After warm-up: 'constant' (DeepSeekMath) or 'linear' decay to 0 at max_steps (TRL's default)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (TRL's name):
    about 1/3 more compute for a fraction of the activation memory. For real models on small GPUs (qwen_t4).
    The update then runs each completion with its prompt (needs share_prompt_prefix=False: a KV cache
    cannot cross a checkpointed layer); generation and reference log-probs are unaffected."""
    fsdp: bool = False
    """Under torchrun: shard the policy over the processes with FSDP2 (torch.distributed.fsdp.fully_shard) instead
    of a whole copy per process in DDP. For a policy whose weights, gradients and AdamW moments do not fit one
    GPU; slower (every forward gathers the weights). Ignored in one process."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    max_steps: int = 100
    """Training steps (one rollout batch each)."""
    seed: int = 0
    """Seeds data order, sampling and initialisation."""

    # --- evaluation, logging, checkpoints ---------------------------------------
    eval_steps: int = 50
    """Greedy evaluation on the held-out set every this many steps (0 = only at the end)."""
    eval_batch_size: int = 128
    """Prompts per greedy `generate` call during evaluation."""
    logprob_chunk_size: int = 4096
    """Rows (sequence positions) of logits turned into log-probs at once; bounds fp32 memory."""
    save_steps: int = 50
    """Write a checkpoint every this many steps (0 = only at the end)."""
    save_total_limit: int = 2
    """Keep at most this many step checkpoints (the oldest are deleted)."""
    output_dir: str = "runs/minigrpo"
    """Where metrics.jsonl, checkpoints and the final model go."""
    reward_weights: list[float] | None = field(default=None)
    """One weight per reward function (None = all 1.0); the reward is the weighted sum."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def epsilon_low(self) -> float:
        return self.epsilon

    @property
    def clip_epsilon_high(self) -> float:
        """The upper clip range actually used (epsilon_high, or epsilon when it is None)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def num_completions(self) -> int:
        """N = B * G, completions per step."""
        return self.prompts_per_step * self.num_generations

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimisation pass: N / per_device_train_batch_size."""
        return self.num_completions // self.per_device_train_batch_size

    def validate(self) -> None:
        """Fail at once, with one message that names the value and what to change."""
        _check_choice("loss_type", self.loss_type, LOSS_TYPES)
        _check_choice("lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULERS)
        _check_choice("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        _check_choice("baseline", self.baseline, BASELINES)
        _check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _check_choice("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations={self.num_generations}: GRPO needs at least 2 completions per prompt "
                "(the group is its own baseline). Set num_generations >= 2, typically 4-16."
            )
        if self.prompts_per_step < 1:
            raise ValueError(f"prompts_per_step={self.prompts_per_step}: set it to 1 or more.")
        n = self.num_completions
        mb = self.per_device_train_batch_size
        if mb < 1 or n % mb != 0:
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            raise ValueError(
                f"batch of {self.prompts_per_step} prompts x G={self.num_generations} = {n} completions "
                f"is not divisible into micro-batches of per_device_train_batch_size={mb}: "
                f"choose a divisor of {n} ({', '.join(map(str, divisors))})."
            )
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof={self.std_ddof}: use 1 (Bessel, the default) or 0 (population std).")
        positive = {
            "max_prompt_length": self.max_prompt_length,
            "max_completion_length": self.max_completion_length,
            "temperature": self.temperature,
            "learning_rate": self.learning_rate,
            "num_iterations": self.num_iterations,
            "logprob_chunk_size": self.logprob_chunk_size,
            "eval_batch_size": self.eval_batch_size,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name}={value}: it must be positive.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: choose a value in (0, 1].")
        if self.beta < 0:
            raise ValueError(f"beta={self.beta}: the KL coefficient must be >= 0 (0 turns the KL term off).")
        if self.epsilon < 0 or self.clip_epsilon_high < 0:
            raise ValueError(f"epsilon={self.epsilon}, epsilon_high={self.epsilon_high}: clip ranges must be >= 0.")
        if self.epsilon >= 1:
            raise ValueError(f"epsilon={self.epsilon}: the lower clip 1 - epsilon must stay above 0; use < 1.")
        if self.advantage_epsilon < 0:
            raise ValueError(f"advantage_epsilon={self.advantage_epsilon}: it must be >= 0 (typical 1e-4).")
        if self.gradient_checkpointing and self.share_prompt_prefix:
            raise ValueError(
                "gradient_checkpointing=True with share_prompt_prefix=True: the shared prompt's KV cache cannot "
                "pass through checkpointed layers (transformers drops it). Set share_prompt_prefix=False."
            )
        for name in ("max_steps", "eval_steps", "save_steps", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: it must be >= 0.")

    def replace(self, **changes) -> GRPOConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # --- named presets -----------------------------------------------------------
    @classmethod
    def tiny_cpu(cls, **overrides) -> GRPOConfig:
        """The bundled tiny Qwen on a laptop CPU: the default of `python -m minigrpo train`."""
        preset = dict(
            prompts_per_step=16,
            num_generations=8,
            per_device_train_batch_size=128,
            max_prompt_length=96,
            max_completion_length=24,
            learning_rate=3e-4,
            beta=0.04,
            max_steps=200,
            eval_steps=25,
            save_steps=50,
            eval_batch_size=256,
        )
        return cls(**{**preset, **overrides})

    @classmethod
    def for_model(cls, model_name: str, **overrides) -> GRPOConfig:
        """The preset for a model: tiny_cpu() for the bundled "tiny" model, qwen_t4() for anything else
        (a Hub id or a local path of a real Qwen). The one place that choice is made."""
        preset = cls.tiny_cpu if model_name == "tiny" else cls.qwen_t4
        return preset(**overrides)

    @classmethod
    def qwen_t4(cls, **overrides) -> GRPOConfig:
        """Qwen2.5-0.5B-Instruct on a free Colab T4 (15 GB; no native bf16, so fp32 weights, fp32 AdamW, no autocast).

        fp32 policy + fp32 reference + gradients + AdamW's two moments are 5 x 2 GB = 9.2 GiB before any
        activation; micro-batches of 8 completions with gradient checkpointing keep a full step's live tensors
        at 11.0 GiB, reached at the AdamW step (`python bench/memory.py --model qwen0.5b-shape --preset t4`:
        completions forced to 128 tokens; rollout 6.1 GiB, update 11.0 GiB of which 1.8 GiB AdamW temporaries)."""
        preset = dict(
            prompts_per_step=8,
            num_generations=8,
            per_device_train_batch_size=8,
            gradient_checkpointing=True,
            share_prompt_prefix=False,
            max_prompt_length=128,
            max_completion_length=128,
            learning_rate=1e-6,
            beta=0.04,
            max_steps=100,
            eval_steps=25,
            save_steps=25,
            eval_batch_size=64,
            logprob_chunk_size=1024,
        )
        return cls(**{**preset, **overrides})


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}: choose one of them.")

"""GRPOConfig: every knob of a GRPO run in one flat dataclass.

Field names, meanings and defaults follow TRL's ``GRPOConfig`` (the version
pinned in the test extra, 1.16), so ``GRPOConfig()`` trains what
``trl.GRPOConfig()`` trains and a TRL script means the same thing here. TRL's
defaults are not the paper's, and they have moved between releases (beta 0.04 ->
0.0, loss_type "grpo" -> "bnpo" -> "dapo", constant -> linear learning rate):
the paper's values live in a named preset instead,
``GRPOConfig.deepseekmath()``, and the course's presets (tiny_cpu, qwen_t4,
qwen1_5b_lora_t4) start from it (tiny_cpu decays its rate linearly, as TRL does,
so that its default run ends at its best). Every preset sets every field in
``TRAINING_FIELDS`` (what decides which samples are drawn and how the weights
are updated), so a change of a bare default never moves a preset's run.
``DIFFERING_DEFAULTS`` lists the few fields whose default is minigrpo's own,
each with its reason (lesson 08, section 3, prints the table).

Each field is declared once: its type, default and one-line meaning, and an
``Option`` that says where it belongs (its --help section, whether it defines
the training, whether a resume may change it, why its default is not TRL's).
TRAINING_FIELDS, RESUME_FREE_FIELDS, DIFFERING_DEFAULTS, the command line's
flags and the TRL switches refused at other values are all read from them.

Notation (used everywhere in the package): B prompts per step, G =
num_generations completions per prompt, N = B * G completions, T completion
tokens, P prompt tokens, V vocabulary size.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Annotated, Literal

from minigrpo.trl_compat import BATCH_FIELDS, check_trl_switches, refuse_unknown_fields, resolve_batch_sizes, world_size

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
LR_SCHEDULERS = ("constant", "linear", "cosine")
SCALE_REWARDS = ("group", "batch", "none")
BASELINES = ("mean", "rloo")
KL_ESTIMATORS = ("k1", "k2", "k3")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SAMPLER_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")

RESOLVED_FIELDS = (*BATCH_FIELDS, "eval_strategy")
"""Fields whose None a config resolves when it is built: the batch sizes, derived from each other
(resolve_batch_sizes), and eval_strategy, 'steps'. Each config keeps them as they were given, so that replace()
resolves them again and eval_generations knows whether eval_strategy was given."""

GROUPS = {
    "model": "model and reference model (TRL)",
    "data": "data preprocessing (TRL)",
    "generation": "generation (TRL)",
    "training": "training (TRL)",
    "optimisation": "optimisation (TrainingArguments)",
    "memory": "memory and precision (TrainingArguments)",
    "logging": "logging, evaluation and saving (TrainingArguments)",
    "completions": "completions (TRL)",
}
"""The sections a field's --flag is listed in by `python -m minigrpo train --help`: the groups of TRL's GRPOConfig
documentation ("Parameters that control ..."), then transformers' TrainingArguments, which TRL's config extends.
minigrpo's own fields join the section where they act."""


@dataclass(frozen=True)
class Option:
    """What the package needs to know about a field besides its type, default and meaning, declared beside it:
    ``beta: Annotated[float, Option("training", trains=True)] = 0.0``. Every list of fields is read from these
    (below the class), so a new field is one declaration. (Annotated, not dataclasses.field(metadata=...):
    transformers' HfArgumentParser hands a field's metadata to argparse as keywords.)"""

    group: str
    """Its section of the command line's --help (GROUPS); every field is a flag of `python -m minigrpo train`."""
    trains: bool = False
    """It decides which samples are drawn or how the weights are updated: every preset sets it (TRAINING_FIELDS)."""
    resume_free: bool = False
    """A resumed run may change it (RESUME_FREE_FIELDS): run length, logging, memory knobs that give the same numbers
    up to float rounding. A resume that changes any other field stops unless allow_config_change=True."""
    differs: str | None = None
    """Why its default is minigrpo's own, not TRL's (DIFFERING_DEFAULTS)."""
    refused: str | None = None
    """A TRL switch minigrpo implements only at False: the error for True (trl_compat.check_trl_switches)."""

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"Option group {self.group!r} is not one of {', '.join(map(repr, GROUPS))}.")


@refuse_unknown_fields
@dataclass
class GRPOConfig:
    """Hyper-parameters of a GRPO run: TRL's names, meanings and defaults (the module docstring says where they
    differ and why). The paper's algorithm: GRPOConfig.deepseekmath(); the course's runs: tiny_cpu(), qwen_t4()."""

    # --- the group -------------------------------------------------------------
    num_generations: Annotated[int, Option("data", trains=True)] = 8
    """G, completions sampled per prompt (TRL's 8). At least 2 (a group of one has no baseline). Typical 4-16;
    DeepSeekMath sampled 64, and 8 keeps a step affordable on a CPU or a T4."""
    per_device_train_batch_size: Annotated[int, Option("optimisation", trains=True, resume_free=True)] = 8
    """Completions per micro-batch (per process) in the update, as in TRL. Smaller saves memory, same gradient.
    Without prompts_per_step it also sizes the generation (TRL's rule: 8 completions = one prompt x G=8)."""
    # free on resume, as steps_per_generation: they say how a generation is split, not its size (B)
    gradient_accumulation_steps: Annotated[int | None, Option("optimisation", resume_free=True)] = None
    """Micro-batches per optimizer step (TRL's meaning). None: one optimizer step per generation when B is
    given as prompts_per_step, else 1 (TRL's default)."""
    generation_batch_size: Annotated[int | None, Option("generation")] = None
    """Completions sampled per generation, B * G (TRL). None: derived as in TRL (see resolve_batch_sizes)."""
    steps_per_generation: Annotated[int | None, Option("generation", resume_free=True)] = None
    """Micro-batches each generation feeds (TRL); a multiple of gradient_accumulation_steps. None: derived."""
    prompts_per_step: Annotated[int | None, Option("generation", trains=True)] = None
    """B, prompts per generation: minigrpo's name for generation_batch_size / num_generations, an alias that
    always equals it. Setting it sets generation_batch_size = B * G (and, unless gradient_accumulation_steps
    is given, one optimizer step per generation)."""

    # --- sampling ----------------------------------------------------------------
    max_prompt_length: Annotated[int | None, Option("data", trains=True)] = None
    """Longest prompt in tokens, or None (TRL 1.16 has no such field): no limit but the model's context. The
    presets set one, so that a prompt much longer than the task's is an error instead of a slow step."""
    max_completion_length: Annotated[int, Option("data", trains=True)] = 512
    """T_max, new tokens per completion. Also Dr. GRPO's constant normaliser. Typical 32-1024 (the course's
    arithmetic answers need 24-128)."""
    temperature: Annotated[float, Option("generation", trains=True)] = 1.0
    """Sampling temperature; log-probs are computed at the same temperature (as TRL does)."""
    top_p: Annotated[float, Option("generation", trains=True)] = 1.0
    """Nucleus sampling; 1.0 samples from the full distribution (what the policy gradient assumes)."""
    fast_generation: Annotated[bool, Option("generation", resume_free=True)] = False
    """Opt-in: a static KV cache in `generate`, which transformers then compiles (CUDA graphs on a GPU); faster
    decoding after a slow first call. Off by default; turn it on with GRPOConfig(fast_generation=True) on a GPU.
    `python bench/gpu_check.py` checks on your GPU that its greedy tokens equal the plain path's."""
    share_prompt_prefix: Annotated[bool, Option("generation", resume_free=True)] = True
    """Run each prompt once per group instead of G times and reuse its KV cache for the G completions
    (generation prefill, reference and policy log-probs). Same numbers up to float rounding, far less work
    when prompts are long. False = the plain path. Applies to micro-batches of whole groups."""

    # --- advantages (stage 3) ----------------------------------------------------
    scale_rewards: Annotated[Literal["group", "batch", "none"], Option("training", trains=True)] = "group"
    """Divide (r - baseline) by the std of the group, of the whole batch, or not at all (Dr. GRPO)."""
    baseline: Annotated[Literal["mean", "rloo"], Option("training", trains=True)] = "mean"
    """'mean' of the group (GRPO) or leave-one-out mean of the others (RLOO)."""
    std_ddof: Annotated[int, Option("training", trains=True)] = 1
    """1 = Bessel-corrected std (torch.std, TRL, CS336); 0 = population std (numpy.std)."""
    advantage_epsilon: Annotated[float, Option("training", trains=True)] = 1e-4
    """eps in (r - mean) / (std + eps); keeps near-constant groups from blowing up."""

    # --- objective (stage 4) -----------------------------------------------------
    beta: Annotated[float, Option("training", trains=True)] = 0.0
    """KL coefficient (DeepSeekMath 0.04; TRL 0.0). 0 disables the KL term and the reference model is never loaded."""
    kl_estimator: Annotated[Literal["k1", "k2", "k3"], Option("training", trains=True)] = "k3"
    """Per-token KL estimator (Schulman, 'Approximating KL'); k3 is DeepSeekMath's."""
    epsilon: Annotated[float, Option("training", trains=True)] = 0.2
    """Lower clip range: the ratio is clipped below at 1 - epsilon."""
    epsilon_high: Annotated[float | None, Option("training", trains=True)] = None
    """Upper clip range (DAPO's clip-higher, e.g. 0.28); None means the same as epsilon."""
    importance_sampling_level: Annotated[Literal["token", "sequence"], Option("training", trains=True)] = "token"
    """'token': one ratio per token (GRPO); 'sequence': one ratio per completion (GSPO)."""
    loss_type: Annotated[Literal["grpo", "bnpo", "dr_grpo", "dapo"], Option("training", trains=True)] = "dapo"
    """How per-token losses are averaged (losses.aggregate_loss): "grpo" is DeepSeekMath's per-sequence mean,
    "dapo" (TRL's default) a token mean over the whole step."""
    mask_truncated_completions: Annotated[bool, Option("training", trains=True)] = False
    """Drop completions that hit max_completion_length without EOS from the loss (DAPO)."""
    num_iterations: Annotated[int, Option("training", trains=True)] = 1
    """mu, optimisation passes over each rollout batch. 1 = strictly on-policy (ratio == 1)."""

    # --- dynamic sampling (DAPO) ---------------------------------------------------
    dynamic_sampling: Annotated[bool, Option("training", trains=True)] = False
    """DAPO's dynamic sampling (Yu et al., 2025, arXiv 2503.14476, section 3.2): sample rounds of B prompts until B
    groups whose rewards are not all equal are kept, and train on those (minigrpo.dynamic_sampling). verl's
    algorithm.filter_groups.enable; TRL 1.16 has no such option. GRPOTrainer only, in one process."""
    max_num_gen_batches: Annotated[int, Option("training", trains=True)] = 10
    """With dynamic_sampling: at most this many rounds of B prompts per step (verl's name; DAPO's recipe uses 10).
    When they run out, the step trains on the groups kept so far (fewer than B; none: no update) and logs
    dynamic_sampling/groups_kept. At least 1 (verl's 0, no limit, would loop forever on a task nobody solves)."""

    # --- optimisation ------------------------------------------------------------
    learning_rate: Annotated[float, Option("optimisation", trains=True)] = 1e-6
    """AdamW step size. ~1e-6 for a 0.5B model; the tiny preset uses 3e-4."""
    weight_decay: Annotated[float, Option("optimisation", trains=True)] = 0.0
    """AdamW weight decay."""
    adam_beta1: Annotated[float, Option("optimisation", trains=True)] = 0.9
    adam_beta2: Annotated[float, Option("optimisation", trains=True)] = 0.999
    """AdamW betas (TRL's 0.9 / 0.999; DeepSeekMath's pre-training used 0.9 / 0.95, its RL section states none)."""
    warmup_steps: Annotated[float, Option("optimisation", trains=True)] = 0
    """Linear warm-up of the learning rate, as transformers 5 defines it: W steps (a whole number >= 1), or a ratio
    in [0, 1) of max_steps (W = ceil(ratio x max_steps)); factor step / W at optimizer step 0, 1, ..., W - 1."""
    lr_scheduler_type: Annotated[Literal["constant", "linear", "cosine"], Option("optimisation", trains=True)] = (
        "linear"
    )
    """After warm-up: 'linear' decay to 0 at max_steps (TRL's default), 'cosine' (half a cosine down to 0 at
    max_steps: transformers' get_cosine_schedule_with_warmup, num_cycles 0.5), or 'constant'."""
    gradient_checkpointing: Annotated[
        bool,
        Option(
            "memory",
            resume_free=True,
            differs="False, not TRL's True: the same numbers for a third more compute; the course's tiny model does "
            "not need it, and it cannot run with share_prompt_prefix (on by default: the same numbers, less "
            "work)",
        ),
    ] = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (TRL's name):
    about 1/3 more compute for a fraction of the activation memory. For real models on small GPUs (qwen_t4).
    The update then runs each completion with its prompt (needs share_prompt_prefix=False: a KV cache
    cannot cross a checkpointed layer); generation and reference log-probs are unaffected."""
    fsdp: Annotated[
        bool,
        Option(
            "memory",
            differs="a switch (shard the policy with FSDP2 under torchrun), where TRL's is transformers' list of FSDP "
            "options",
        ),
    ] = False
    """Under torchrun: shard the policy over the processes with FSDP2 (torch.distributed.fsdp.fully_shard) instead
    of a whole copy per process in DDP. For a policy whose weights, gradients and AdamW moments do not fit one
    GPU; slower (every forward gathers the weights). Ignored in one process."""
    max_grad_norm: Annotated[float, Option("optimisation", trains=True)] = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    max_steps: Annotated[int, Option("optimisation", trains=True, resume_free=True)] = -1
    """Optimizer steps to train (TRL's meaning). -1: num_train_epochs passes over the prompts (TRL's formula)."""
    num_train_epochs: Annotated[float, Option("optimisation", trains=True, resume_free=True)] = 3.0
    """Passes over the training prompts when max_steps == -1 (TRL's default 3.0)."""
    seed: Annotated[
        int,
        Option(
            "optimisation",
            trains=True,
            differs="0, not TRL's 42: the course's figures were measured with seed 0 (presets set it; a seed is a "
            "seed)",
        ),
    ] = 0
    """Seeds data order, sampling and initialisation (TRL's default is 42)."""
    shuffle_dataset: Annotated[bool, Option("data", trains=True)] = True
    """Visit the prompts in a fresh seeded order each epoch (TRL's name); False: in dataset order."""
    bf16: Annotated[
        bool | None,
        Option(
            "memory",
            trains=True,
            resume_free=True,
            differs="None = bf16 autocast exactly where the GPU has native bf16, fp32 elsewhere; TRL's default turns "
            "it on wherever torch reports bf16, emulated on a T4 too, and refuses to start on a CPU",
        ),
    ] = None
    """bf16 autocast (TRL's name). None: exactly where the GPU has native bf16 (compute capability >= 8.0).
    True on a T4, V100 or CPU: a warning, and fp32 (emulated bf16 is slower than fp32 there). False: fp32."""
    fp16: Annotated[
        bool,
        Option(
            "memory",
            refused="fp16 activations of Qwen2 overflow. minigrpo uses bf16 autocast where the GPU has native bf16 "
            "and fp32 elsewhere (T4, V100, CPU): drop fp16.",
        ),
    ] = False
    """Refused when True: fp16 activations of Qwen2 overflow; minigrpo trains in fp32 where bf16 is missing."""
    use_bias_correction_kl: Annotated[bool, Option("training", trains=True)] = True
    """Multiply the per-token KL by the importance ratio (TRL 1.16's default): with samples from pi_old the k3
    term then has the reverse-KL gradient. False: the DeepSeekMath loss, whose k3 gradient is the forward KL's."""
    use_vllm: Annotated[
        bool,
        Option(
            "generation",
            refused="minigrpo generates with model.generate. For vLLM generation use TRL's GRPOTrainer (the same "
            "reward functions and dataset work there; lesson 08).",
        ),
    ] = False
    """Refused when True: minigrpo generates with `model.generate`; vLLM generation is TRL's (lesson 08)."""
    # --- a sampler that is not the trainer (TRL's vllm_importance_sampling_*) ----------------------
    vllm_importance_sampling_correction: Annotated[
        bool,
        Option(
            "training",
            trains=True,
            differs="False, not TRL's True: minigrpo samples with the policy it trains, so there is nothing to "
            "correct unless a rollout carries a different sampler's log-probs (TRL applies it only with use_vllm=True)",
        ),
    ] = False
    """Weight each token's loss by pi_old / pi_sampler, truncated or masked (losses.sampler_importance_weights), for
    rollouts that carry the sampler's own log-probs (Rollout.sampling_per_token_logps: vLLM, a bf16 copy; lesson 06b).
    A rollout without them is on-policy and left as it is. TRL's name; TRL's default True applies only with vLLM."""
    vllm_importance_sampling_mode: Annotated[
        Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"], Option("training", trains=True)
    ] = "sequence_mask"
    """One weight per token or per completion (the product of its tokens'), clipped into [clip_min, clip_max]
    ('*_truncate') or set to 0 outside it ('*_mask'). TRL's default 'sequence_mask'."""
    vllm_importance_sampling_clip_max: Annotated[float | None, Option("training", trains=True)] = 3.0
    """C_max, the upper bound of the weight (TRL's 3.0); None: no upper bound ('*_mask' modes)."""
    vllm_importance_sampling_clip_min: Annotated[float | None, Option("training", trains=True)] = None
    """C_min, the lower bound of the weight (None: none, TRL's default); must be below clip_max."""
    vllm_importance_sampling_cap: Annotated[float | None, Option("training")] = None
    """Deprecated (TRL 1.6): the old name of vllm_importance_sampling_clip_max. Set, it warns and sets clip_max."""
    remove_unused_columns: Annotated[
        bool,
        Option(
            "data",
            refused="GRPO's reward functions receive the dataset's other columns (e.g. `answer`), so minigrpo keeps "
            "them, as TRL's GRPO does by default. Set it to False.",
        ),
    ] = False
    """False, as in TRL's GRPO: every dataset column reaches the reward functions. True is refused."""
    disable_dropout: Annotated[bool, Option("model", trains=True)] = False
    """Set every dropout probability of the policy to 0 (TRL's name). Qwen2 has none by default."""
    top_k: Annotated[int, Option("generation", trains=True)] = 0
    """Sample only among the k most likely tokens (0: off, TRL's default). Off is what the policy gradient assumes."""
    min_p: Annotated[float | None, Option("generation", trains=True)] = None
    """Min-p sampling threshold (None: off). Off is what the policy gradient assumes."""
    repetition_penalty: Annotated[float, Option("generation", trains=True)] = 1.0
    """Generation's repetition penalty (1.0: off)."""
    max_tool_calling_iterations: Annotated[int | None, Option("generation", trains=True)] = None
    """With tools (GRPOTrainer(tools=...)): at most this many rounds of tool calls in one episode (None: until a turn
    calls no tool or the episode's max_completion_length tokens run out), as in TRL."""
    tool_timeout: Annotated[float | None, Option("generation", resume_free=True)] = 10.0
    """Seconds one tool call may take before its result is an error (None: no limit). minigrpo's own: TRL waits."""

    # --- evaluation, logging, checkpoints ---------------------------------------
    logging_steps: Annotated[
        int, Option("logging", resume_free=True, differs="1, not 10: a learner watches every step")
    ] = 1
    """Log (metrics.jsonl, log_history) every this many optimizer steps, averaging the metrics in between
    (TRL's default is 10; a learner wants every step)."""
    logging_dir: Annotated[str | None, Option("logging", resume_free=True)] = None
    """Folder for metrics.jsonl (None: output_dir)."""
    report_to: Annotated[
        None | str | list[str],
        Option(
            "logging",
            resume_free=True,
            differs="'none': no tracker on any transformers version (metrics.jsonl and log_history are always "
            "written); TRL keeps transformers' default: 'none' (stored as []) from transformers 5, every "
            "installed tracker ('all') before",
        ),
    ] = "none"  # this order of the union is what HfArgumentParser reads
    """Experiment trackers that get every logged row, as in transformers: "none" (or None / []), "tensorboard",
    "wandb", "trackio", a list of them, or "all" (those installed). metrics.jsonl and log_history are always
    written. Through transformers' own callbacks (run.trackers); pip install 'minigrpo[trackers]'."""
    use_cpu: Annotated[bool, Option("memory", resume_free=True)] = False
    """Train on the CPU even where a GPU is available (transformers' field); under torchrun the processes then
    talk over gloo. False: CUDA when there is a GPU, else the CPU."""
    log_completions: Annotated[bool, Option("completions", resume_free=True)] = False
    """Every logging step, print a table of the last generation's prompts, completions, per-function rewards and
    advantages, and append them all to <output_dir>/completions.jsonl (TRL's field; run.completions_log)."""
    num_completions_to_print: Annotated[int | None, Option("completions", resume_free=True)] = None
    """How many completions log_completions prints (None: all, as in TRL); the file gets every one."""
    run_name: Annotated[str | None, Option("logging", resume_free=True)] = None
    """The run's name in the tracker (wandb, trackio), as in transformers (None: the tracker picks one)."""
    project: Annotated[str, Option("logging", resume_free=True)] = "huggingface"
    """The trackio project the run is logged under (transformers' field; wandb reads WANDB_PROJECT instead)."""
    trackio_space_id: Annotated[str | None, Option("logging", resume_free=True)] = None
    """A Hugging Face Space to host the trackio dashboard (None: local only, `trackio show`)."""
    trackio_bucket_id: Annotated[str | None, Option("logging", resume_free=True)] = None
    """transformers' trackio field: a Hub bucket for the logs (None: none)."""
    trackio_static_space_id: Annotated[str | None, Option("logging", resume_free=True)] = None
    """transformers' trackio field: the static Space frozen after training (only with trackio_space_id)."""
    hub_private_repo: Annotated[bool | None, Option("logging", resume_free=True)] = None
    """transformers' field: whether a Space that trackio creates is private."""
    eval_strategy: Annotated[
        Literal["no", "steps"] | None,
        Option(
            "logging",
            resume_free=True,
            differs="'steps', not 'no': the course evaluates held-out accuracy during training",
        ),
    ] = None
    """'steps': evaluate on eval_dataset every eval_steps and at the end; 'no': only when trainer.evaluate() is
    called (TRL's default); None, minigrpo's default, reads 'steps', with greedy accuracy only. Greedy accuracy is
    always measured; a given eval_strategy (as a TRL script that evaluates gives it, and TRL's parser from
    --eval_strategy) also samples TRL's eval_loss at each evaluation, as TRL does (eval_generations)."""
    eval_steps: Annotated[
        float | None,
        Option(
            "logging",
            resume_free=True,
            differs="50, not None (= logging_steps): evaluating every step would cost more than training",
        ),
    ] = 50
    """Evaluate every this many optimizer steps (0 = only at the end; None = logging_steps, as in TRL). Below 1, a
    fraction of the run, as in TRL: 0.25 evaluates every ceil(0.25 x max_steps) steps."""
    eval_batch_size: Annotated[
        int,
        Option(
            "logging",
            resume_free=True,
            differs="prompts per greedy generate call in minigrpo's held-out evaluation (128); TRL's name is a "
            "read-only count of evaluation samples per device batch (8)",
        ),
    ] = 128
    """Prompts per greedy `generate` call during evaluation."""
    num_generations_eval: Annotated[int | None, Option("logging", resume_free=True)] = None
    """G', completions sampled per held-out prompt at each evaluation for eval_loss, the GRPO loss on them as TRL's
    GRPOTrainer computes it (GRPOTrainer.evaluation_loss). None, as in TRL: num_generations when eval_strategy is
    given (a TRL script), and no eval_loss when eval_strategy is minigrpo's default, whose evaluation stays greedy
    and cheap (G samples per prompt cost about G greedy evaluations): eval_generations says which."""
    logprob_chunk_size: Annotated[int, Option("training", resume_free=True)] = 4096
    """Rows (sequence positions) of logits turned into log-probs at once; bounds fp32 memory."""
    save_strategy: Annotated[Literal["no", "steps"], Option("logging", resume_free=True)] = "steps"
    """'steps': a checkpoint every save_steps and at the end; 'no': none (TRL's names)."""
    save_steps: Annotated[
        float,
        Option(
            "logging",
            resume_free=True,
            differs="50, not 500: the course's runs are a few hundred steps, and a Colab runtime can disconnect at "
            "any time",
        ),
    ] = 50
    """Write a checkpoint every this many optimizer steps (0 = only at the end; below 1, a fraction of the run, as
    in TRL). Checkpoints are written between generations: one due inside a generation's optimizer steps is
    written at its end."""
    save_total_limit: Annotated[
        int, Option("logging", resume_free=True, differs="2, not None (keep all): a notebook's disk is small")
    ] = 2
    """Keep at most this many step checkpoints (the oldest are deleted); at least 1."""
    output_dir: Annotated[
        str,
        Option(
            "logging",
            resume_free=True,
            differs="'runs/minigrpo': TRL 1.16's default (None) names a folder after the model",
        ),
    ] = "runs/minigrpo"
    """Where metrics.jsonl, checkpoints and the final model go."""
    overwrite_output_dir: Annotated[bool, Option("logging", resume_free=True)] = False
    """A fresh run (not a resume) in an output_dir that holds an earlier run's checkpoints or metrics: False
    refuses with an error, True deletes them first (transformers' TrainingArguments name)."""
    reward_weights: Annotated[list[float] | None, Option("training", trains=True)] = None
    """One weight per reward function (None = all 1.0); the reward is the weighted sum."""
    reward_timeout: Annotated[float | None, Option("training", resume_free=True)] = None
    """Seconds each reward function may take for one step's N completions (None = no limit); see rewards.py."""

    # --- TRL's script fields ------------------------------------------------------
    model_init_kwargs: Annotated[dict | str | None, Option("model")] = None
    """Keywords for from_pretrained when the trainer loads the model by name (TRL's field), e.g. {"dtype":
    "bfloat16"}; a JSON string (from the command line) is parsed. trust_remote_code=True is refused."""
    resume_from_checkpoint: Annotated[str | None, Option("logging", resume_free=True)] = None
    """For scripts, as in transformers: the trainer does not read it; a script passes it on with
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint), as TRL's grpo.py does."""
    trust_remote_code: Annotated[
        bool,
        Option(
            "model",
            refused="minigrpo never runs code shipped in a model folder. Use a model whose architecture transformers "
            "implements (Qwen2 and its kin), and set trust_remote_code=False.",
        ),
    ] = False
    """Refused when True: minigrpo never runs code shipped in a model folder (TRL's field)."""
    push_to_hub: Annotated[
        bool,
        Option(
            "logging",
            refused="minigrpo does not upload. Save with trainer.save_model(path), then push that folder with "
            "huggingface_hub (HfApi().upload_folder).",
        ),
    ] = False
    """Refused when True: save with trainer.save_model(path) and upload that folder with huggingface_hub."""

    def __post_init__(self) -> None:
        if isinstance(self.model_init_kwargs, str):  # from the command line: a JSON object
            self.model_init_kwargs = _parse_json_object("model_init_kwargs", self.model_init_kwargs)
        # The batch fields and eval_strategy as the user gave them (None = derive), so that replace() derives the
        # batch fields again and keeps whether eval_strategy was given (eval_generations).
        self._given = {name: getattr(self, name) for name in RESOLVED_FIELDS}
        if self.eval_strategy is None:  # minigrpo's default: evaluate every eval_steps, greedily
            self.eval_strategy = "steps"
        if self.vllm_importance_sampling_cap is not None:  # as TRL: the deprecated name wins, with a warning
            warnings.warn(
                "vllm_importance_sampling_cap is deprecated (TRL 1.6, removed in TRL 2.0): use "
                "vllm_importance_sampling_clip_max instead.",
                FutureWarning,
                stacklevel=2,
            )
            self.vllm_importance_sampling_clip_max = self.vllm_importance_sampling_cap
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
    def eval_generations(self) -> int | None:
        """G' of eval_loss, or None for no eval_loss (greedy evaluation only). num_generations_eval when it is set;
        when it is None, TRL's rule (num_generations) if eval_strategy was given, as every TRL script that
        evaluates gives it (TRL's default, 'no', never evaluates during training), and None if eval_strategy was
        left at minigrpo's default: the presets' and `python -m minigrpo train`'s evaluation stays greedy."""
        if self.num_generations_eval is not None:
            return self.num_generations_eval
        return self.num_generations if self._given["eval_strategy"] is not None else None

    @property
    def optimizer_steps_per_generation(self) -> int:
        """Optimizer steps per generation: num_iterations x steps_per_generation / gradient_accumulation_steps."""
        return self.num_iterations * self.steps_per_generation // self.gradient_accumulation_steps

    def validate(self) -> None:
        """Fail at once, with one message that names the value and what to change."""
        _check_types(self)
        _check_finite(self)
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
        resolve_batch_sizes(self, world_size())
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof={self.std_ddof}: use 1 (Bessel, the default) or 0 (population std).")
        positive = {
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
        if self.max_prompt_length is not None and not self.max_prompt_length > 0:
            raise ValueError(f"max_prompt_length={self.max_prompt_length}: it must be positive, or None (no limit).")
        for name in ("eval_steps", "save_steps"):
            value = getattr(self, name)
            if value is not None and (value < 0 or (value >= 1 and value != int(value))):
                raise ValueError(
                    f"{name}={value}: give a whole number of steps, a fraction of the run below 1 (as in TRL), "
                    "or 0 (only at the end)."
                )
        if self.fast_generation and self.max_prompt_length is None:
            raise ValueError(
                "fast_generation=True needs max_prompt_length: the static KV cache is sized for the longest prompt "
                "plus max_completion_length. Set max_prompt_length (e.g. 256)."
            )
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
        for name in ("eval_steps", "save_steps", "warmup_steps"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: it must be >= 0.")
        if self.warmup_steps >= 1 and not float(self.warmup_steps).is_integer():
            raise ValueError(
                f"warmup_steps={self.warmup_steps}: give a whole number of steps (>= 1), or a ratio of max_steps in "
                "[0, 1) (transformers 5's meaning: 0.1 warms up over the first tenth of the run)."
            )
        if self.max_steps < -1 or self.max_steps == 0:
            raise ValueError(f"max_steps={self.max_steps}: give a number of steps >= 1, or -1 to use num_train_epochs.")
        if self.max_steps == -1 and not self.num_train_epochs > 0:
            raise ValueError(f"num_train_epochs={self.num_train_epochs}: it must be > 0 (or set max_steps).")
        if self.logging_steps < 1:
            raise ValueError(f"logging_steps={self.logging_steps}: log every 1 or more steps.")
        if not 0 <= self.seed < 2**32:
            raise ValueError(
                f"seed={self.seed} (--seed) is out of range: give an integer in 0..{2**32 - 1} (numpy, which TRL "
                "seeds too, takes no other; the prompt order and the sampling seeds are derived from it)."
            )
        if not self.output_dir.strip():
            raise ValueError(
                f"output_dir={self.output_dir!r} (--output-dir) is empty, which would write checkpoints into the "
                "current folder: give a folder, e.g. output_dir='runs/minigrpo'."
            )
        _check_choice("eval_strategy", self.eval_strategy, ("no", "steps"))
        if self.num_generations_eval is not None and self.num_generations_eval < 2:
            raise ValueError(
                f"num_generations_eval={self.num_generations_eval}: eval_loss samples a group per held-out prompt, and "
                "a group of one has no baseline (its advantage is 0). Set num_generations_eval >= 2, or None for "
                "greedy evaluation without eval_loss."
            )
        _check_choice("save_strategy", self.save_strategy, ("no", "steps"))
        check_trl_switches(self, REFUSED_SWITCHES)
        _check_sampler_correction(self)
        if self.top_k < 0 or not 0 <= (self.min_p or 0) <= 1 or not self.repetition_penalty > 0:
            raise ValueError(
                f"top_k={self.top_k}, min_p={self.min_p}, repetition_penalty={self.repetition_penalty}: use top_k >= 0 "
                "(0 = off), min_p in [0, 1] or None, repetition_penalty > 0 (1.0 = off)."
            )
        if self.save_total_limit < 1:
            raise ValueError(
                f"save_total_limit={self.save_total_limit}: keep at least 1 checkpoint (0 would delete each one "
                "as it is written); to save less often, raise save_steps."
            )
        for name in ("weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}: it must be >= 0 (0 turns it off).")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: an Adam beta must be in [0, 1) (typical 0.9-0.999).")
        _check_dynamic_sampling(self)
        if self.num_completions_to_print is not None and self.num_completions_to_print < 1:
            raise ValueError(
                f"num_completions_to_print={self.num_completions_to_print}: print 1 or more, or None for all (set "
                "log_completions=False to print none)."
            )
        for name in ("reward_timeout", "tool_timeout"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(
                    f"{name}={getattr(self, name)}: give a positive number of seconds, or None for no limit."
                )
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 0:
            raise ValueError(
                f"max_tool_calling_iterations={self.max_tool_calling_iterations}: give 0 or more rounds of tool "
                "calls per episode, or None for no limit."
            )

    def to_dict(self) -> dict:
        """Every field as a dict of plain values, as TrainingArguments.to_dict (what a tracker records as the
        run's config)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def to_json_string(self) -> str:
        """to_dict as indented JSON, as TrainingArguments.to_json_string (TensorBoard's "args" text)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    def replace(self, **changes) -> GRPOConfig:
        """A copy with some fields changed (validated again). The batch sizes the user did not give are derived
        again from the new values (config.replace(num_generations=4) keeps B, not B*G)."""
        return self.from_config(self, **changes)

    @classmethod
    def from_config(cls, other: GRPOConfig, **changes) -> GRPOConfig:
        """A `cls` with `other`'s fields (those `cls` has), then `changes`: e.g. PPOConfig.from_config(grpo_config).
        The batch sizes `other` derived are derived again; a new prompts_per_step or generation_batch_size
        replaces the other one (and steps_per_generation)."""
        values = {f.name: getattr(other, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(other, f.name)}
        given = dict(getattr(other, "_given", {}))
        if {"prompts_per_step", "generation_batch_size"} & changes.keys():
            given.update(prompts_per_step=None, generation_batch_size=None, steps_per_generation=None)
        values.update(given)
        values.update(changes)
        return cls(**values)

    # --- named presets (their values: the dictionaries below the class) --------------
    @classmethod
    def from_preset(cls, preset: dict, **overrides) -> GRPOConfig:
        """A config of `preset` (every field in TRAINING_FIELDS, and some operational ones), then `overrides`."""
        return cls(**{**preset, **overrides})

    @classmethod
    def deepseekmath(cls, **overrides) -> GRPOConfig:
        """DeepSeekMath's GRPO (Shao et al., 2024, arXiv 2402.03300): the paper's algorithm, sized for one
        machine. Each value and its source: DEEPSEEKMATH below."""
        return cls.from_preset(DEEPSEEKMATH, **overrides)

    @classmethod
    def tiny_cpu(cls, **overrides) -> GRPOConfig:
        """The bundled tiny Qwen on a laptop CPU: the default of `python -m minigrpo train`. The paper's algorithm
        (deepseekmath()) at the tiny model's sizes and learning rate, with TRL's linear decay of the rate to 0 over
        max_steps in place of the paper's constant rate: TINY_CPU below. (What the default run reaches: README.md and
        lesson 06.)"""
        return cls.from_preset(TINY_CPU, **overrides)

    @classmethod
    def tiny_tools_cpu(cls, **overrides) -> GRPOConfig:
        """The tools model ("tiny-tools") learning to use its calculator on a laptop CPU, tools=[calculator]: tiny_cpu()
        at the sizes of an episode (a call, its result, an answer), 30 steps. TINY_TOOLS_CPU below; what it reaches:
        bench/calculator_tools.py."""
        return cls.from_preset(TINY_TOOLS_CPU, **overrides)

    @classmethod
    def for_model(cls, model_name: str, **overrides) -> GRPOConfig:
        """The preset for a model: tiny_cpu() for the bundled "tiny" model, qwen_t4() for anything else
        (a Hub id or a local path of a real Qwen), as preset_for chooses."""
        return getattr(cls, preset_for(model_name))(**overrides)

    @classmethod
    def qwen_t4(cls, **overrides) -> GRPOConfig:
        """Qwen2.5-0.5B-Instruct on a free Colab T4 (16 GB, 15 GB usable; no native bf16, so fp32 weights, fp32
        AdamW, no autocast). The paper's algorithm (deepseekmath()) at a T4's sizes: QWEN_T4 below.

        fp32 policy + fp32 reference + gradients + AdamW's two moments are 5 copies of the weights before any
        activation; micro-batches of 8 completions with gradient checkpointing keep a whole step within a T4's
        memory (`python bench/memory.py --model qwen0.5b-shape --preset t4` measures it; the memory table in
        docs/performance.md gives the figures)."""
        return cls.from_preset(QWEN_T4, **overrides)

    @classmethod
    def qwen1_5b_lora_t4(cls, **overrides) -> GRPOConfig:
        """Qwen2.5-1.5B-Instruct with LoRA on a free Colab T4; pass ``peft_config=lora_config()`` to the trainer.

        qwen_t4()'s batch (8 prompts x G=8, micro-batches of 8, gradient checkpointing, 128 + 128 tokens) at a
        learning rate 10x higher: a LoRA update B A starts at zero and is scaled by alpha / r, and the best LoRA rate
        measured in "LoRA Without Regret" (Schulman et al., 2025) was about 10x the best full fine-tuning rate, for
        every rank (1e-5 here; not swept).
        Weights are the fp32 base and the adapters (with their gradients and AdamW moments); the reference is the
        base with the adapters off, no copy. `python bench/memory.py --model qwen1.5b-shape --preset lora-t4 --lora`
        measures a whole step's peak (on a bf16 GPU add --fp32 for a T4's precision); the LoRA table in
        docs/architecture.md gives the figures."""
        return cls.from_preset(QWEN1_5B_LORA_T4, **overrides)


# --- the lists of fields, read from each field's Option ----------------------------------
def field_options(config_class: type) -> dict[str, Option]:
    """{field: its Option}, in the order of declaration: what the lists below are read from."""
    hints = typing.get_type_hints(config_class, include_extras=True)
    options = {}
    for f in dataclasses.fields(config_class):
        option = next(
            (extra for extra in getattr(hints[f.name], "__metadata__", ()) if isinstance(extra, Option)), None
        )
        if option is None:
            raise TypeError(
                f"{config_class.__name__}.{f.name} has no Option: declare it as "
                f'{f.name}: Annotated[<type>, Option("<group>", ...)] = <default> (config.Option says what to give).'
            )
        options[f.name] = option
    return options


OPTIONS = field_options(GRPOConfig)

TRAINING_FIELDS = tuple(name for name, option in OPTIONS.items() if option.trains)
"""Every field that changes which samples are drawn or how the weights are updated (Option.trains). Each preset sets
all of them (tests/test_config.py checks it). The rest (logging, evaluation, checkpoints, memory knobs that give the
same numbers up to rounding, output folders) is operational."""

RESUME_FREE_FIELDS = tuple(name for name, option in OPTIONS.items() if option.resume_free)
"""Fields a resumed run may change (Option.resume_free): how long it runs, what it logs and saves, how much memory a
step takes (the same numbers up to float rounding). Every other field defines the run, and a resume that changes one
stops with an error unless allow_config_change=True (checkpoints.changed_run_fields)."""

DIFFERING_DEFAULTS = {name: option.differs for name, option in OPTIONS.items() if option.differs}
"""Fields whose default is minigrpo's own, not TRL's, with the reason (Option.differs): none changes what a run
computes except seed (which sample is drawn) and bf16 (where no GPU has native bf16 both train in fp32);
vllm_importance_sampling_correction changes it only for rollouts that carry another sampler's log-probs, which
minigrpo's own sampler never does (TRL applies it only when vLLM samples). Lesson 08 (section 3) prints this table."""

REFUSED_SWITCHES = {name: option.refused for name, option in OPTIONS.items() if option.refused}
"""TRL's switches minigrpo accepts only at False, with the error for True (Option.refused)."""

# DeepSeekMath's GRPO, each value with its source (Shao et al., 2024, arXiv 2402.03300: section 4.1.1 "Group Relative
# Policy Optimization" (eq. 3, 4), section 4.2 "Training and Evaluating DeepSeekMath-RL", section 5.2.2).
DEEPSEEKMATH_ALGORITHM = dict(
    # sampling: from pi_theta itself, no warping (eq. 3 takes expectations over o ~ pi_old)
    temperature=1.0,
    top_p=1.0,
    top_k=0,
    min_p=None,
    repetition_penalty=1.0,
    max_tool_calling_iterations=None,  # tools (TRL's default): rounds of calls until a turn calls none
    # advantages, "outcome supervision" (4.1.2): A_i = (r_i - mean(r)) / std(r), every token of o_i
    scale_rewards="group",
    baseline="mean",
    std_ddof=1,  # the paper writes std(r); Bessel's, as torch.std and TRL compute it
    advantage_epsilon=1e-4,  # not in the paper: keeps an all-equal group at 0 instead of 0/0
    # the objective, eq. 3: per-sequence mean of the clipped surrogate minus beta * KL, k3 of eq. 4
    beta=0.04,  # 4.2: "the KL coefficient is 0.04"
    kl_estimator="k3",  # eq. 4
    use_bias_correction_kl=False,  # eq. 3's KL term as written (not weighted by the ratio, as TRL's default is)
    epsilon=0.2,  # eq. 3's epsilon; the paper states no value: PPO's customary 0.2
    epsilon_high=None,
    importance_sampling_level="token",
    loss_type="grpo",  # eq. 3: 1/G sum_i 1/|o_i| sum_t
    mask_truncated_completions=False,
    num_iterations=1,  # 4.2: "the policy model only has a single update following each exploration stage"
    dynamic_sampling=False,
    max_num_gen_batches=10,
    # the sampler is the policy itself (eq. 3's o ~ pi_old): no correction; TRL's mode and bounds if it is turned on
    vllm_importance_sampling_correction=False,
    vllm_importance_sampling_mode="sequence_mask",
    vllm_importance_sampling_clip_max=3.0,
    vllm_importance_sampling_clip_min=None,
    # the optimizer
    learning_rate=1e-6,  # 4.2: "the learning rate of the policy model is 1e-6"
    lr_scheduler_type="constant",  # 4.2 states one learning rate and no schedule: constant is our reading, not its word
    warmup_steps=0,
    weight_decay=0.0,  # not stated for RL
    adam_beta1=0.9,  # not stated for RL (pre-training: 0.9 / 0.95)
    adam_beta2=0.99,  # not stated for RL; minigrpo 0.1's value, which the course's runs were measured with
    max_grad_norm=1.0,  # not stated; TRL's and transformers' default
    bf16=None,
    disable_dropout=False,
    seed=0,
    shuffle_dataset=True,
    reward_weights=None,  # every reward function weighs 1; a task that weighs them sets its own
)
"""The paper's algorithm, without sizes: every preset starts from it."""

DEEPSEEKMATH = dict(
    DEEPSEEKMATH_ALGORITHM,
    # 4.2: "For each question, we sample 64 outputs. The max length is set to 1024, and the training batch size is
    # 1024": 1024 / 64 = 16 questions per step. G and the length are cut to what one GPU or a laptop affords.
    prompts_per_step=16,
    num_generations=8,  # the paper: 64
    per_device_train_batch_size=8,  # micro-batches of one group: memory only, and what DAPO's refill needs
    max_prompt_length=None,  # the paper states no prompt limit; TRL 1.16 has none either
    max_completion_length=256,  # the paper: 1024
    max_steps=-1,
    num_train_epochs=1.0,  # one pass over the prompts; the paper does not say how many passes it made
)

TINY_CPU = dict(
    DEEPSEEKMATH_ALGORITHM,
    prompts_per_step=16,
    num_generations=8,
    per_device_train_batch_size=128,  # the whole step in one micro-batch: the tiny model's activations are small
    max_prompt_length=96,
    max_completion_length=24,  # "What is 12 + 7?" needs a few tokens; 24 leaves room for a format
    learning_rate=3e-4,  # a 260k-parameter model takes far larger steps than a 0.5B one (lesson 08, section 6d)
    # TRL's default schedule, not the paper's constant rate: at a constant 3e-4 the run's accuracy peaked and fell
    # back before the end; decayed to 0 over the run's steps, it ends at its best. Chosen on training problems held
    # back from training (scripts/tune_tiny_cpu.py), never on the test set.
    lr_scheduler_type="linear",
    max_steps=200,
    num_train_epochs=3.0,
    # operational
    eval_steps=25,
    save_steps=50,
    eval_batch_size=256,
)

TINY_TOOLS_CPU = dict(
    TINY_CPU,
    # the calculator task on the tools model ("tiny-tools"): an episode is a call, the tool's result and an answer
    prompts_per_step=8,
    num_generations=8,
    per_device_train_batch_size=64,  # the whole step in one micro-batch
    max_prompt_length=96,  # the one-line tool list and "What is 123 * 456?": 77 tokens
    max_completion_length=192,  # a call (about 75 tokens), its result (about 47) and the answer (about 25)
    learning_rate=3e-4,  # tiny_cpu's: at 1e-3 the first steps broke the copying (KL 0.2, reward 0); 1e-4 is slow
    max_steps=30,  # the tool-call rate passes 90% by step 20 (bench/calculator_tools.py)
    eval_steps=10,
    save_steps=10,
    eval_batch_size=128,
)

QWEN_T4 = dict(
    DEEPSEEKMATH_ALGORITHM,
    prompts_per_step=8,
    num_generations=8,
    per_device_train_batch_size=8,
    max_prompt_length=128,
    max_completion_length=128,
    max_steps=100,
    num_train_epochs=3.0,
    # operational: memory (the same numbers), cadence
    gradient_checkpointing=True,
    share_prompt_prefix=False,  # a KV cache cannot cross checkpointed layers
    logprob_chunk_size=1024,
    eval_steps=25,
    save_steps=25,
    eval_batch_size=64,
)

QWEN1_5B_LORA_T4 = dict(QWEN_T4, learning_rate=1e-5)


def preset_for(model_name: str) -> str:
    """The name of the preset for a model (a key of PRESETS, and the GRPOConfig class method): "tiny_cpu" for the
    bundled "tiny" model, "tiny_tools_cpu" for the bundled tools model "tiny-tools", "qwen_t4" for anything else. The
    one place that choice is made (for_model; the command line's --help shows the tiny and the Qwen presets' values)."""
    return {"tiny": "tiny_cpu", "tiny-tools": "tiny_tools_cpu"}.get(model_name, "qwen_t4")


PRESETS = {
    "deepseekmath": DEEPSEEKMATH,
    "tiny_cpu": TINY_CPU,
    "tiny_tools_cpu": TINY_TOOLS_CPU,
    "qwen_t4": QWEN_T4,
    "qwen1_5b_lora_t4": QWEN1_5B_LORA_T4,
}
"""Every named preset's values, by the name of its GRPOConfig class method."""


def _check_dynamic_sampling(config: GRPOConfig) -> None:
    """dynamic_sampling trains on B groups, or fewer when max_num_gen_batches rounds run out: the update must
    take any whole number of groups, so each pass is one optimizer step of equal micro-batches."""
    if config.max_num_gen_batches < 1:
        raise ValueError(
            f"max_num_gen_batches={config.max_num_gen_batches}: give at least 1 round per step (DAPO's recipe "
            "uses 10). There is no unlimited setting: a step where every group stays all-wrong would never end."
        )
    if not config.dynamic_sampling:
        return
    G, N, mb = config.num_generations, config.num_completions, config.per_device_train_batch_size
    if config.steps_per_generation != config.gradient_accumulation_steps:
        raise ValueError(
            f"dynamic_sampling=True with steps_per_generation={config.steps_per_generation} != "
            f"gradient_accumulation_steps={config.gradient_accumulation_steps}: a step may keep fewer than B "
            "groups, which cannot be cut into a fixed number of optimizer steps. Give prompts_per_step and leave "
            "steps_per_generation and gradient_accumulation_steps unset (one optimizer step per generation)."
        )
    if G % mb != 0 and mb < N:
        raise ValueError(
            f"dynamic_sampling=True with per_device_train_batch_size={mb}: when fewer than B groups are kept, "
            f"micro-batches of {mb} would come out unequal and weigh their completions unequally. Set it to a "
            f"divisor of num_generations={G}, or to N = {N} or more (one micro-batch)."
        )


def _matches(value, hint) -> bool:
    """Whether `value` fits the type annotation `hint` (int, float, bool, str, dict, list[float], unions of them,
    Literal: checked by _check_choice). An int is a float; a bool is neither."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list | tuple) and all(_matches(item, args[0]) for item in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _check_sampler_correction(config: GRPOConfig) -> None:
    """The bounds of TRL's sampler correction: a known mode, clip_min below clip_max, a bound to truncate at."""
    _check_choice("vllm_importance_sampling_mode", config.vllm_importance_sampling_mode, SAMPLER_IS_MODES)
    low, high = config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max
    if low is not None and high is not None and low >= high:
        raise ValueError(
            f"vllm_importance_sampling_clip_min={low} must be below vllm_importance_sampling_clip_max={high}: "
            "lower clip_min (or set it to None)."
        )
    if low is None and high is None and config.vllm_importance_sampling_mode.endswith("_truncate"):
        raise ValueError(
            f"vllm_importance_sampling_mode={config.vllm_importance_sampling_mode!r} truncates the weight at "
            "vllm_importance_sampling_clip_min / _clip_max, and both are None: set clip_max (TRL's 3.0)."
        )


def _check_types(config: GRPOConfig) -> None:
    """Every field of the type its annotation says, checked when the config is built: a learning_rate of "1e-5" or
    num_generations of 2.0 would otherwise fail steps later with a TypeError that does not name the field."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.init and not _matches(value, hints[f.name]):
            raise TypeError(
                f"{type(config).__name__}: {f.name}={value!r} is a {type(value).__name__}, but the field takes "
                f"{_type_name(hints[f.name])} (its default: {f.name}={f.default!r})."
            )


def _type_name(hint) -> str:
    """float -> 'float', list[float] | None -> 'list[float] | None'."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "").replace("NoneType", "None")


def _check_finite(config: GRPOConfig) -> None:
    """Every float field (and reward weight) must be a finite number: NaN passes every `<` check silently, and an
    inf learning rate or beta turns the weights into NaN at the first update."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ValueError(f"{f.name}={value}: it must be a finite number (not NaN or inf).")


def _parse_json_object(name: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f'{name}={text!r} is not valid JSON ({error}): give a JSON object, e.g. \'{{"dtype": "float32"}}\'.'
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}={text!r}: give a JSON object (a dict of keywords), not {type(value).__name__}.")
    return value


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}: choose one of them.")

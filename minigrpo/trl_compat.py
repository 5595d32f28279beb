"""TRL's rules that GRPOConfig follows: the batch fields, and the fields minigrpo refuses.

A TRL script runs on minigrpo with only its import line changed when it sets
fields minigrpo implements (``GRPOConfig`` has TRL's names and meanings for
them). Three kinds of TRL field need a rule, and each rule lives here:

- the batch fields (``resolve_batch_sizes``): generation_batch_size,
  steps_per_generation, gradient_accumulation_steps and prompts_per_step are
  derived from whichever of them a config gives, as TRL derives them;
- switches minigrpo accepts only at the value it implements (use_vllm, fp16,
  remove_unused_columns, trust_remote_code, push_to_hub: ``check_trl_switches``;
  each field's ``Option(refused=...)`` in config.py holds its message),
  kept as fields so that ``HfArgumentParser`` and ``TrlParser`` read a TRL
  recipe that passes them, and the trackers report_to may name
  (``requested_trackers``);
- any other TRL keyword (``refuse_unknown_fields``): one clear error that
  names the field and says what minigrpo does instead.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types

# What minigrpo does instead, for the fields a TRL GRPO script most often sets.
INSTEAD = {
    "per_device_eval_batch_size": "evaluation is greedy, eval_batch_size prompts per generate call",
    "gradient_checkpointing_kwargs": "gradient_checkpointing=True always uses non-reentrant checkpointing",
    "optim": "the optimizer is AdamW (adam_beta1, adam_beta2, weight_decay)",
    "adam_epsilon": "AdamW's epsilon is torch's default, 1e-8",
    "lr_scheduler_kwargs": "lr_scheduler_type is 'constant', 'linear' or 'cosine' (num_cycles 0.5), with warmup_steps",
    "warmup_ratio": "give warmup_steps a ratio in [0, 1) instead, as transformers 5 does (warmup_steps=0.1)",
    "deepspeed": "minigrpo scales with torch.distributed (torchrun); DeepSpeed ZeRO is TRL's domain (lesson 08)",
    "fsdp_config": "minigrpo scales with torch.distributed (torchrun); see docs/scaling.md",
    "vllm_mode": "minigrpo generates with model.generate; vLLM is TRL's domain (lesson 08)",
    "hub_model_id": "save with trainer.save_model(path), then push that folder with huggingface_hub",
    "logging_strategy": "metrics are logged every logging_steps optimizer steps",
    "logging_first_step": "metrics are logged every logging_steps optimizer steps",
    "save_only_model": "checkpoints hold everything exact resume needs; trainer.save_model(path) writes the model",
    "torch_compile": "set fast_generation=True for the compiled decoding path on a GPU",
    "use_liger_kernel": "log-probs are computed in chunks (logprob_chunk_size) instead",
    "entropy_coef": "GRPO's loss has no entropy bonus here (PPOConfig has entropy_coef)",
    "sync_ref_model": "the reference model stays the policy at the start (DeepSeekMath)",
    "dataloader_num_workers": "prompts are read directly from the dataset; no data loader",
    # the optimizer and precision
    "optim_args": "the optimizer is AdamW (adam_beta1, adam_beta2, weight_decay)",
    "optim_target_modules": "the optimizer is AdamW over every trainable parameter (LoRA: pass peft_config)",
    "tf32": "set torch.backends.cuda.matmul.allow_tf32 yourself before training",
    "bf16_full_eval": "evaluation runs in the training precision (bf16 where the GPU has native bf16)",
    "fp16_full_eval": "evaluation runs in the training precision (bf16 where the GPU has native bf16)",
    "label_smoothing_factor": "GRPO's loss has no labels to smooth",
    "neftune_noise_alpha": "GRPO samples its own completions; there are no embeddings of labels to perturb",
    "auto_find_batch_size": "lower per_device_train_batch_size (the same gradient, less memory)",
    "average_tokens_across_devices": "loss_type='dapo' already divides by the tokens of every process",
    "router_aux_loss_coef": "minigrpo trains dense models (Qwen2)",
    "cast_lm_head_to_fp32": "log-probs are computed in fp32 (logprob_chunk_size bounds their memory)",
    "activation_checkpointing": "set gradient_checkpointing=True",
    "activation_checkpointing_kwargs": "gradient_checkpointing=True always uses non-reentrant checkpointing",
    "liger_kernel_config": "log-probs are computed in chunks (logprob_chunk_size) instead",
    "use_cache": "generation always uses the KV cache; fast_generation=True uses a static one on a GPU",
    "torch_empty_cache_steps": "memory is bounded by per_device_train_batch_size and logprob_chunk_size",
    "pad_to_multiple_of": "prompts are left-padded to the longest in the batch",
    # generation
    "generation_kwargs": "set temperature, top_p, top_k, min_p and repetition_penalty (fields of GRPOConfig)",
    "chat_template_kwargs": "prompts are rendered with the tokenizer's chat template as it is",
    "cache_implementation": "set fast_generation=True for a static KV cache on a GPU",
    # logging and evaluation
    "log_level": "use Python's logging for transformers (transformers.logging.set_verbosity_*)",
    "log_level_replica": "under torchrun only the main process prints and logs",
    "log_on_each_node": "under torchrun only the main process prints and logs",
    "logging_nan_inf_filter": "a NaN or inf loss stops the run with its likely cause (NonFiniteError)",
    "include_num_input_tokens_seen": "num_tokens is always logged, and trainer.state.num_input_tokens_seen",
    "disable_tqdm": "the progress bar is shown on the main process; redirect or ignore stderr",
    "log_multimodal": "minigrpo trains text models",
    "log_unique_prompts": "log_completions writes every completion; filter completions.jsonl by prompt",
    "log_completions_hub_repo": "log_completions writes <output_dir>/completions.jsonl; upload it with huggingface_hub",
    "eval_delay": "set eval_steps (0 = only at the end)",
    "eval_on_start": "call trainer.evaluate() before trainer.train()",
    "prediction_loss_only": "evaluation reports eval_reward, eval_rewards/<name>/mean and eval_accuracy",
    "include_for_metrics": "evaluation reports eval_reward, eval_rewards/<name>/mean and eval_accuracy",
    "batch_eval_metrics": "evaluation reports eval_reward, eval_rewards/<name>/mean and eval_accuracy",
    "eval_do_concat_batches": "evaluation is greedy, eval_batch_size prompts per generate call",
    "eval_use_gather_object": "evaluation is greedy, eval_batch_size prompts per generate call",
    "eval_accumulation_steps": "evaluation is greedy, eval_batch_size prompts per generate call",
    "load_best_model_at_end": "every checkpoint's log_history holds eval_accuracy: load the best with from_pretrained",
    "metric_for_best_model": "every checkpoint's log_history holds eval_accuracy: load the best with from_pretrained",
    "greater_is_better": "every checkpoint's log_history holds eval_accuracy: load the best with from_pretrained",
    # checkpoints and resume
    "save_on_each_node": "the main process writes every checkpoint",
    "enable_jit_checkpoint": "SIGTERM and Ctrl-C already save a checkpoint before stopping",
    "ignore_data_skip": "a resume restores the prompt sampler's position exactly (allow_dataset_change for a new set)",
    "restore_callback_states_from_checkpoint": "re-add your callbacks to the resumed trainer",
    "full_determinism": "a run is determined by seed (every sampling group has its own seeded generator)",
    "data_seed": "seed decides the prompt order too (shuffle_dataset=False keeps the dataset's order)",
    # the data
    "label_names": "GRPO has no labels: reward functions receive the dataset's columns",
    "train_sampling_strategy": "prompts are drawn in a seeded permutation per epoch (shuffle_dataset)",
    "length_column_name": "prompts are drawn in a seeded permutation per epoch (shuffle_dataset)",
    # processes
    "accelerator_config": "minigrpo runs under torchrun (plain PyTorch DDP); see docs/scaling.md",
    "parallelism_config": "minigrpo runs under torchrun (plain PyTorch DDP; fsdp=True shards the policy)",
    "local_rank": "torchrun sets LOCAL_RANK; minigrpo reads it",
    "debug": "run one process with python -X faulthandler, or torchrun's own --log-dir",
    "skip_memory_metrics": "measure memory with minigrpo.measuring (bench/memory.py)",
    "do_train": "call trainer.train()",
    "do_eval": "call trainer.evaluate(), or give eval_dataset (eval_strategy='steps')",
    "do_predict": "sample completions with trainer.collect_rollout() or minigrpo.run.evaluation",
    "ds3_gather_for_generation": "DeepSpeed ZeRO-3 is TRL's domain (lesson 08)",
    "hub_token": "log in with huggingface_hub (hf auth login) and push a saved folder yourself",
    # the algorithm: variants minigrpo does not implement
    "delta": "two-sided clipping is epsilon / epsilon_high; the upper bound delta is not implemented",
    "multi_objective_aggregation": "rewards are the weighted sum of the functions (reward_weights)",
    "ref_model_mixup_alpha": "the reference model stays the policy at the start (DeepSeekMath)",
    "ref_model_sync_steps": "the reference model stays the policy at the start (DeepSeekMath)",
    "top_entropy_quantile": "every completion token counts in the loss (mask_truncated_completions drops cut-offs)",
    "use_adaptive_entropy": "GRPO's loss has no entropy bonus here (PPOConfig has entropy_coef)",
    "off_policy_mask_threshold": "every token counts; num_iterations > 1 keeps the clipped ratio for off-policy steps",
    "use_transformers_continuous_batching": "minigrpo generates with model.generate (fast_generation on a GPU)",
    "transformers_continuous_batching_config": "minigrpo generates with model.generate (fast_generation on a GPU)",
    "use_transformers_paged": "minigrpo generates with model.generate (fast_generation on a GPU)",
}

INSTEAD_BY_PREFIX = {
    "vllm_": "minigrpo generates with model.generate; vLLM is TRL's domain (lesson 08)",
    "ddp_": "torchrun and minigrpo set up DDP (gloo on the CPU, nccl on GPUs); see docs/scaling.md",
    "dataloader_": "prompts are read directly from the dataset; no data loader",
    "hub_": "save with trainer.save_model(path), then push that folder with huggingface_hub",
    "torch_compile_": "set fast_generation=True for the compiled decoding path on a GPU",
    "sapo_": "loss_type is one of 'grpo', 'bnpo', 'dr_grpo', 'dapo' (SAPO is TRL's)",
    "vespo_": "loss_type is one of 'grpo', 'bnpo', 'dr_grpo', 'dapo' (VESPO is TRL's)",
    "entropy_": "GRPO's loss has no entropy bonus here (PPOConfig has entropy_coef)",
}
"""What minigrpo does instead, for a family of fields (those INSTEAD does not name)."""


def instead_of(field_name: str) -> str | None:
    """What minigrpo does instead of TRL's field (INSTEAD, else INSTEAD_BY_PREFIX), or None."""
    if field_name in INSTEAD:
        return INSTEAD[field_name]
    return next((text for prefix, text in INSTEAD_BY_PREFIX.items() if field_name.startswith(prefix)), None)


def refused_field_message(config_name: str, field_name: str) -> str:
    instead = instead_of(field_name)
    reason = f"minigrpo does not implement it: {instead}." if instead else "minigrpo does not implement it."
    return (
        f"{config_name} got {field_name}=...: that is a TRL / transformers field (or a typo), and {reason} "
        "Remove it; docs/trl.md lists every field minigrpo accepts."
    )


def refuse_unknown_fields(cls):
    """Class decorator for a config dataclass: an unknown keyword raises one TypeError naming the field and
    what minigrpo does instead (a dataclass's own message only says 'unexpected keyword argument')."""
    init = cls.__init__
    known = {f.name for f in dataclasses.fields(cls) if f.init}

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        unknown = [name for name in kwargs if name not in known]
        if unknown:
            raise TypeError("\n".join(refused_field_message(cls.__name__, name) for name in unknown))
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def check_trl_switches(config, refused: dict[str, str]) -> None:
    """TRL fields minigrpo accepts only at the value it implements: one clear error for the others. refused: field ->
    what to do instead, for the switches accepted only at False (config.REFUSED_SWITCHES, from the fields' Option)."""
    for name, instead in refused.items():
        if getattr(config, name):
            raise ValueError(f"{name}={getattr(config, name)!r}: {instead}")
    requested_trackers(config.report_to)  # an unknown tracker name fails here, before a model loads


# --- report_to: the experiment trackers -------------------------------------------------
TRACKERS = ("tensorboard", "wandb", "trackio")
"""The trackers report_to accepts: those whose transformers callback fits minigrpo's config and state."""


def requested_trackers(report_to) -> list[str]:
    """report_to as a list of tracker names, as transformers reads it: "none", None or [] -> [], a name -> [name],
    "all" -> ["all"] (run.trackers resolves it to the installed trackers). An unknown name is one clear error."""
    if report_to is None or report_to == "none":
        return []
    names = [report_to] if isinstance(report_to, str) else [name for name in report_to if name != "none"]
    if names == ["all"]:
        return names
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise ValueError(
            f"report_to={report_to!r}: minigrpo reports to {', '.join(TRACKERS)} (or 'all' of those installed, "
            f"or 'none'), not {', '.join(map(repr, unknown))}. Every logged row is also in <output_dir>/metrics.jsonl "
            "and trainer.state.log_history, for any other tool to read."
        )
    return names


# --- the batch fields ----------------------------------------------------------------
BATCH_FIELDS = ("prompts_per_step", "generation_batch_size", "steps_per_generation", "gradient_accumulation_steps")


def world_size() -> int:
    """K, the processes in the run: the process group's size once torch.distributed is set up, torchrun's
    WORLD_SIZE before that (a config is built before the group exists), else 1. The one source of truth:
    minigrpo.run.distributed uses it too. per_device_train_batch_size is per process."""
    import torch.distributed as dist  # here, not at the top: the config (and the CLI's --help) needs no torch

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_batch_sizes(config, processes: int = 1) -> None:
    """Fill in generation_batch_size, steps_per_generation, gradient_accumulation_steps and prompts_per_step.

    TRL's rule (GRPOConfig.__post_init__), with mb = per_device_train_batch_size and K processes:

        generation_batch_size = mb * K * steps_per_generation      (completions per generation)
        steps_per_generation  = gradient_accumulation_steps       when neither is given
        prompts_per_step (B)  = generation_batch_size / G

    minigrpo's prompts_per_step is the same quantity seen from the prompts: giving it sets
    generation_batch_size = B * G and, unless gradient_accumulation_steps is given, makes each generation one
    optimizer step over all of its N = B * G completions (DeepSeekMath's on-policy update).

    Under torchrun each process takes B/K whole groups (group statistics never cross processes), so B must be a
    multiple of K; when it is not, no micro-batch size helps, and the error names the prompts per step, G and
    process counts that work (split_advice).
    """
    given = {name: getattr(config, name) for name in BATCH_FIELDS}
    try:
        _derive_batch_sizes(config, processes)
    except _UnevenSplitError as error:
        raise ValueError(f"{error} {split_advice(config, given, processes)}") from None


class _UnevenSplitError(ValueError):
    """B prompts that K processes cannot share in whole groups."""


def _derive_batch_sizes(c, processes: int) -> None:
    """resolve_batch_sizes' rule on the batch fields of `c` (a config, or a trial of split_advice)."""
    G, mb = c.num_generations, c.per_device_train_batch_size
    if mb < 1:
        raise ValueError(f"per_device_train_batch_size={mb}: it must be 1 or more.")
    for name in BATCH_FIELDS:
        if getattr(c, name) is not None and getattr(c, name) < 1:
            raise ValueError(f"{name}={getattr(c, name)}: it must be 1 or more (or None to derive it).")
    if c.prompts_per_step is not None:
        if c.generation_batch_size is not None and c.generation_batch_size != c.prompts_per_step * G:
            raise ValueError(
                f"prompts_per_step={c.prompts_per_step} x G={G} = {c.prompts_per_step * G} completions disagrees "
                f"with generation_batch_size={c.generation_batch_size}: give one of the two."
            )
        c.generation_batch_size = c.prompts_per_step * G
    if c.steps_per_generation is not None and c.generation_batch_size is not None:
        if c.generation_batch_size != mb * processes * c.steps_per_generation:
            raise ValueError(
                f"generation_batch_size={c.generation_batch_size} and steps_per_generation={c.steps_per_generation} "
                f"disagree (micro-batches of {mb} x {processes} process(es)): give one of the two."
            )
    elif c.generation_batch_size is not None:
        _check_whole_groups(c, processes)  # first: no micro-batch size can mend a generation K cannot share
        if c.prompts_per_step is not None:
            # minigrpo's spelling: a micro-batch larger than a process's share of the generation is that share
            # (the tiny preset's 128 on one process is 64 on each of two)
            mb = min(mb, c.generation_batch_size // processes)
        if c.generation_batch_size % (mb * processes) != 0:
            n = c.generation_batch_size // processes
            divisors = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
            raise ValueError(
                f"a generation of {c.generation_batch_size // G} prompts x G={G} = {c.generation_batch_size} "
                f"completions is not divisible into micro-batches of per_device_train_batch_size={mb} on "
                f"{processes} process(es): choose a divisor of {n} ({divisors})."
            )
        c.steps_per_generation = c.generation_batch_size // (mb * processes)
        if c.gradient_accumulation_steps is None and c.prompts_per_step is not None:
            c.gradient_accumulation_steps = c.steps_per_generation  # one optimizer step per generation
    else:
        if c.steps_per_generation is None:
            c.gradient_accumulation_steps = c.gradient_accumulation_steps or 1
            c.steps_per_generation = c.gradient_accumulation_steps
        c.generation_batch_size = mb * processes * c.steps_per_generation
    c.gradient_accumulation_steps = c.gradient_accumulation_steps or 1
    _check_whole_groups(c, processes)
    if c.steps_per_generation % c.gradient_accumulation_steps != 0:
        raise ValueError(
            f"steps_per_generation={c.steps_per_generation} is not a multiple of gradient_accumulation_steps="
            f"{c.gradient_accumulation_steps}: each generation must feed whole optimizer steps."
        )
    c.prompts_per_step = c.generation_batch_size // G


def _check_whole_groups(c, processes: int) -> None:
    """A generation is whole groups of G, and each of the K processes takes B/K of them."""
    G, completions = c.num_generations, c.generation_batch_size
    if completions % G != 0:
        raise ValueError(
            f"generation_batch_size={completions} is not a whole number of groups of "
            f"num_generations={G}: make it a multiple of {G} (per_device_train_batch_size x processes x "
            "steps_per_generation), or give prompts_per_step instead."
        )
    B = completions // G
    if B % processes != 0:
        raise _UnevenSplitError(
            f"a generation of {B} prompts x G={G} = {completions} completions cannot be split over {processes} "
            f"processes: each process takes whole groups (B/K prompts, each with its G completions), and B = {B} is "
            f"not a multiple of K = {processes}, whatever the micro-batch size."
        )


def split_advice(config, given: dict, processes: int) -> str:
    """What works instead when B prompts do not split over K processes, each candidate tried with the batch rule and
    the other fields as given: the nearest prompts per step (or generation_batch_size, when that is how the
    generation was sized) below and above that K divides, the nearest G (when B is not given), and the counts of
    processes up to max(8, 2K)."""
    G, B = config.num_generations, config.generation_batch_size // config.num_generations

    def works(processes: int = processes, **changes) -> bool:
        fields = {"num_generations": G, "per_device_train_batch_size": config.per_device_train_batch_size, **given}
        trial = types.SimpleNamespace(**(fields | changes))
        try:
            _derive_batch_sizes(trial, processes)
        except ValueError:
            return False
        return True

    def nearest(values, change) -> list[int]:  # the first value of each direction that works
        return [next((v for v in direction if works(**change(v))), None) for direction in values]

    options = []
    by_size = given["generation_batch_size"] is not None and given["prompts_per_step"] is None
    multiples = (range(B - B % processes, 0, -processes), range(B + processes - B % processes, 8 * B, processes))
    if by_size:  # TRL's spelling: size the generation in completions
        found = nearest(multiples, lambda b: {"generation_batch_size": b * G})
        options.append(("generation_batch_size", [b * G for b in found if b is not None]))
    else:
        found = nearest(multiples, lambda b: {"prompts_per_step": b, "generation_batch_size": None})
        options.append(("prompts_per_step", [b for b in found if b is not None]))
    if given["prompts_per_step"] is None:  # G sizes B only when the generation is sized in completions
        found = nearest((range(G - 1, 1, -1), range(G + 1, 4 * G)), lambda g: {"num_generations": g})
        options.append(("num_generations", [g for g in found if g is not None]))
    counts = [k for k in range(2, max(8, 2 * processes) + 1) if k != processes and works(processes=k)]
    said = [f"{name}={' or '.join(map(str, values))}" for name, values in options if values]
    if counts:
        said.append(f"or {_listed(counts)} processes (torchrun --nproc-per-node)")
    if not said:
        return f"Make B = generation_batch_size / G a multiple of {processes}."
    return "What works: " + "; ".join(said) + "."


def _listed(values: list[int]) -> str:
    """[2, 4, 8] -> '2, 4 or 8'."""
    return " or ".join(filter(None, [", ".join(map(str, values[:-1])), str(values[-1])]))


def check_trl_keywords(optimizers, quantization_config, rollout_func=None, environment_factory=None) -> None:
    """The GRPOTrainer keywords of TRL that minigrpo accepts only in the form it implements."""
    if rollout_func is not None:
        raise ValueError(
            "rollout_func: minigrpo samples its own rollouts (stage 1, rollout.py), so a custom generation backend "
            "is TRL's domain. For tool use pass tools=[...]; to change what is sampled, subclass GRPOTrainer and "
            "override generate_and_score."
        )
    if environment_factory is not None:
        raise ValueError(
            "environment_factory: stateful environments are TRL's (experimental) feature; minigrpo runs stateless "
            "tools. Pass their methods as plain functions in tools=[...], keeping any state in a closure, or train "
            "with TRL's GRPOTrainer."
        )
    if tuple(optimizers or (None, None)) != (None, None):
        raise ValueError(
            "optimizers=(optimizer, scheduler): minigrpo builds its AdamW and learning-rate schedule from the "
            "config. Set learning_rate, adam_beta1, adam_beta2, weight_decay, lr_scheduler_type and warmup_steps "
            "(the same fields work in TRL), and drop optimizers."
        )
    if quantization_config is not None and not getattr(quantization_config, "load_in_4bit", False):
        raise ValueError(
            "quantization_config: minigrpo quantizes only to 4 bits (QLoRA, BitsAndBytesConfig(load_in_4bit=True)) "
            "and trains adapters on top (pass a peft_config)."
        )

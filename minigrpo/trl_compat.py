"""TRL's config fields that minigrpo does not have: one clear error each, instead of a bare TypeError.

A TRL script runs on minigrpo with only its import line changed when it sets
fields minigrpo implements (``GRPOConfig`` has TRL's names and meanings for
them). Any other keyword fails at once with a message that names the field
and says what minigrpo does instead; the README lists them all.
"""

from __future__ import annotations

import dataclasses
import functools

# What minigrpo does instead, for the fields a TRL GRPO script most often sets.
INSTEAD = {
    "per_device_eval_batch_size": "evaluation is greedy, eval_batch_size prompts per generate call",
    "num_generations_eval": "evaluation is one greedy completion per prompt",
    "gradient_checkpointing_kwargs": "gradient_checkpointing=True always uses non-reentrant checkpointing",
    "optim": "the optimizer is AdamW (adam_beta1, adam_beta2, weight_decay)",
    "adam_epsilon": "AdamW's epsilon is torch's default, 1e-8",
    "lr_scheduler_kwargs": "lr_scheduler_type is 'constant' or 'linear', with warmup_steps",
    "warmup_ratio": "give warmup_steps",
    "deepspeed": "minigrpo scales with torch.distributed (torchrun); DeepSpeed ZeRO is TRL's domain (lesson 08)",
    "fsdp_config": "minigrpo scales with torch.distributed (torchrun); see the README's 'Scaling out'",
    "vllm_mode": "minigrpo generates with model.generate; vLLM is TRL's domain (lesson 08)",
    "push_to_hub": "save with trainer.save_model(path), then push that folder with huggingface_hub",
    "hub_model_id": "save with trainer.save_model(path), then push that folder with huggingface_hub",
    "log_completions": "completions are in the rollout; print a few with trainer.collect_rollout()",
    "num_completions_to_print": "completions are in the rollout; print a few with trainer.collect_rollout()",
    "run_name": "one run per output_dir; metrics go to <output_dir>/metrics.jsonl",
    "logging_strategy": "metrics are logged every logging_steps optimizer steps",
    "logging_first_step": "metrics are logged every logging_steps optimizer steps",
    "save_only_model": "checkpoints hold everything exact resume needs; trainer.save_model(path) writes the model",
    "resume_from_checkpoint": "pass it to train(resume_from_checkpoint=True or a path), as in TRL",
    "torch_compile": "set fast_generation=True for the compiled decoding path on a GPU",
    "use_liger_kernel": "log-probs are computed in chunks (logprob_chunk_size) instead",
    "entropy_coef": "GRPO's loss has no entropy bonus here (PPOConfig has entropy_coef)",
    "sync_ref_model": "the reference model stays the policy at the start (DeepSeekMath)",
    "dataloader_num_workers": "prompts are read directly from the dataset; no data loader",
    "use_cpu": "minigrpo picks the device itself: CUDA when there is a GPU, else the CPU",
}


def refused_field_message(config_name: str, field_name: str) -> str:
    instead = INSTEAD.get(field_name)
    reason = f"minigrpo does not implement it: {instead}." if instead else "minigrpo does not implement it."
    return (
        f"{config_name} got {field_name}=...: that is a TRL / transformers field (or a typo), and {reason} "
        "Remove it; the README's 'From TRL' table lists every field minigrpo accepts."
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

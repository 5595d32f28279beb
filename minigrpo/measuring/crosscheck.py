"""minigrpo against TRL's GRPOTrainer: the config mapping and the loss cross-check.

Needs the `bench` extra (`pip install -e ".[bench]"`: trl and accelerate);
TRL is never a core dependency, so `trl` is imported inside the functions that
use it. ``bench/vs_trl.py`` (the side-by-side benchmark) and
``tests/test_crosscheck_trl.py`` use this module.

The cross-check (`crosscheck()`): one fixed rollout batch, sampled once by
minigrpo, is fed to TRL through its own `rollout_func` hook, so TRL's own code
computes the rewards, advantages and reference log-probs
(`_generate_and_score_completions`) and the loss (`_compute_loss`); minigrpo
computes the same with its stage functions. The policy is first perturbed (the
same seeded noise on both copies) so that pi_theta != pi_ref (the KL term is
non-zero), and each loss_type is checked twice: on-policy (pi_old = pi_theta
detached, as with num_iterations=1) and off-policy (pi_old = the unperturbed
policy's log-probs plus noise, so ratios leave [1 - eps, 1 + eps] and clipping
is exercised). It runs in fp32 on the CPU.
"""

from __future__ import annotations

import tempfile

import torch
from transformers import AutoModelForCausalLM

from minigrpo.advantages import group_relative_advantages, group_rewards
from minigrpo.config import GRPOConfig
from minigrpo.logprobs import per_token_logps
from minigrpo.losses import grpo_loss
from minigrpo.models import TINY_MODEL_DIR, autocast_dtype, make_reference_model
from minigrpo.rewards import compute_rewards
from minigrpo.rollout import repeat_for_group, sample_group_rollout
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset
from minigrpo.tokenization import load_tokenizer


def load_fp32(path: str, device: str = "cpu", attn: str = "sdpa"):
    """(model, tokenizer) in fp32 on `device` with the given attention implementation."""
    tokenizer = load_tokenizer(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    return model.to(device), tokenizer


def prompts_dataset(n: int):
    """n arithmetic training prompts (seed 1), the same for every trainer compared."""
    return make_arithmetic_dataset(n=n, split="train", seed=1)


def varied_prompts(n: int):
    """n prompts whose answers have 1, 2, 3, 2, 3, ... digits, so completion lengths differ."""
    full = prompts_dataset(400)
    answers, picks = full["answer"], []
    for k in range(n):
        digits = 1 if k == 0 else 2 + (k - 1) % 2
        unused = [i for i in range(len(answers)) if i not in picks]
        picks.append(next((i for i in unused if len(answers[i]) == digits), unused[0]))
    return full.select(picks)


def trl_config(config: GRPOConfig, device: str, output_dir: str, gradient_checkpointing: bool = False):
    """minigrpo's GRPOConfig mapped onto TRL's, field by field (trl.GRPOConfig).

    gradient_checkpointing: TRL's default is on; minigrpo does not checkpoint
    the model, so a like-for-like comparison turns it off.
    """
    import trl

    bf16 = autocast_dtype(torch.device(device), config.bf16) is not None  # minigrpo autocasts to bf16 exactly there
    accumulation = config.gradient_accumulation_steps
    neutral = dict(top_k=0, top_p=config.top_p, min_p=None, repetition_penalty=1.0)
    return trl.GRPOConfig(
        output_dir=output_dir,
        # the group and the batch: one generation batch of B * G completions per optimizer step
        num_generations=config.num_generations,
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        max_completion_length=config.max_completion_length,
        # sampling exactly from pi_theta
        temperature=config.temperature,
        **neutral,
        generation_kwargs=dict(neutral),
        # the objective
        reward_weights=config.reward_weights,
        beta=config.beta,
        epsilon=config.epsilon,
        epsilon_high=config.clip_epsilon_high,
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        importance_sampling_level=config.importance_sampling_level,
        mask_truncated_completions=config.mask_truncated_completions,
        use_bias_correction_kl=config.use_bias_correction_kl,  # TRL 1.16's default is True; the paper's loss False
        num_iterations=config.num_iterations,
        # the optimiser
        learning_rate=config.learning_rate,
        adam_beta1=config.adam_beta1,
        adam_beta2=config.adam_beta2,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        lr_scheduler_type=trl_schedule(config),
        warmup_steps=config.warmup_steps,  # steps, or a ratio of max_steps in [0, 1) (transformers 5)
        optim="adamw_torch",
        max_steps=config.max_steps,
        seed=config.seed,
        # precision and devices
        use_cpu=device == "cpu",
        bf16=bf16,
        fp16=False,
        gradient_checkpointing=gradient_checkpointing,
        # the same prompts in the same order; no logging, saving or evaluation during the timed loop
        shuffle_dataset=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def trl_schedule(config: GRPOConfig) -> str:
    """transformers' name of minigrpo's schedule: its "constant" warms up too, where transformers' does not."""
    if config.lr_scheduler_type == "constant" and config.warmup_steps > 0:
        return "constant_with_warmup"
    return config.lr_scheduler_type


def relative_grad_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """max |grad_a - grad_b| / max |grad_b| over all parameters."""
    diff = max((pa.grad - pb.grad).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters(), strict=True))
    scale = max(pb.grad.abs().max().item() for pb in b.parameters())
    return diff / max(scale, 1e-30)


def perturb_both(ours, theirs, generator: torch.Generator, noise: float) -> None:
    """The same seeded noise on both policies (noise x each parameter's std), so that pi_theta != pi_ref: the KL
    term is tested."""
    with torch.no_grad():
        for p_ours, p_theirs in zip(ours.parameters(), theirs.parameters(), strict=True):
            delta = noise * p_ours.std().nan_to_num(0.0) * torch.randn(p_ours.shape, generator=generator)
            p_ours.add_(delta)
            p_theirs.add_(delta)


def crosscheck(
    path: str = "tiny",
    prompts: int = 4,
    generations: int = 4,
    max_completion_length: int = 24,
    beta: float = 0.04,
    temperature: float = 0.9,
    noise: float = 0.05,
    old_noise: float = 0.3,
    seed: int = 0,
    verbose: bool = True,
    use_bias_correction_kl: bool = False,
) -> dict:
    """minigrpo's advantages and loss vs TRL's own code on one fixed rollout batch, in fp32 on the CPU.

    Returns {"advantages": max |diff|, "<loss_type>/on_policy" and "<loss_type>/off_policy": |loss diff|,
    "grad/<loss_type>/<regime>": max |grad diff| / max |grad|, "max_loss_diff", "max_grad_diff", "kl"}.
    """
    import trl

    path = str(TINY_MODEL_DIR) if path == "tiny" else path
    torch.manual_seed(seed)
    ours, tokenizer = load_fp32(path)
    theirs, _ = load_fp32(path)
    reference = make_reference_model(ours)  # pi_ref: the policy before the perturbation
    config = GRPOConfig.tiny_cpu(
        prompts_per_step=prompts,
        num_generations=generations,
        per_device_train_batch_size=prompts * generations,
        max_completion_length=max_completion_length,
        max_prompt_length=256,
        beta=beta,
        temperature=temperature,
        use_bias_correction_kl=use_bias_correction_kl,
    )
    dataset = varied_prompts(prompts)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trl.GRPOTrainer(
            model=theirs,
            reward_funcs=[correctness_reward],
            args=trl_config(config, "cpu", tmp),
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=lambda prompts, trainer: fixed["rollout"],
        )
    generator = torch.Generator().manual_seed(seed)
    perturb_both(ours, theirs, generator, noise)

    # one fixed rollout batch, sampled by minigrpo
    rollout = sample_group_rollout(ours, tokenizer, dataset["prompt"], config, reference)
    lengths = rollout.prompt_mask.sum(1).tolist()
    prompt_ids = [row[len(row) - int(n) :] for row, n in zip(rollout.prompt_ids.tolist(), lengths, strict=True)]
    fixed = {"rollout": {"prompt_ids": prompt_ids, "completion_ids": rollout.completion_id_lists(), "logprobs": None}}

    # TRL: its own rewards, advantages, reference log-probs and loss
    theirs.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [dict(zip(dataset.column_names, values, strict=True)) for values in zip(*dataset[:].values(), strict=True)]
    inputs = trainer._generate_and_score_completions(repeat_for_group(rows, generations))

    # minigrpo: its own stage functions
    columns = {k: repeat_for_group(dataset[k], generations) for k in dataset.column_names if k != "prompt"}
    _, rewards = compute_rewards(
        [correctness_reward],
        repeat_for_group(dataset["prompt"], generations),
        rollout.completions,
        rollout.completion_id_lists(),
        columns,
    )
    advantages = group_relative_advantages(
        group_rewards(rewards, generations),
        config.scale_rewards,
        config.baseline,
        config.std_ddof,
        config.advantage_epsilon,
    ).flatten()  # (N,)
    T = rollout.completion_ids.shape[1]
    diffs = {"advantages": (advantages - inputs["advantages"]).abs().max().item()}
    if verbose:
        print(
            f"cross-check: {prompts} prompts x G={generations}, beta={beta}, temperature={temperature}, "
            f"policy perturbed (noise {noise}), off-policy pi_old = pi_ref log-probs + noise ({old_noise})"
        )
        print(f"  rewards {rewards.tolist()}")
        print(f"  completion lengths {rollout.completion_mask.sum(1).tolist()}")
        print(f"  advantages  max |minigrpo - TRL| = {diffs['advantages']:.2e}")
        head = f"  {'loss_type':<10}{'pi_old':<12}{'minigrpo':>14}{'TRL':>14}"
        print(head + f"{'|diff|':>11}{'grad diff':>11}{'clipped':>9}")
    # pi_old for the off-policy regime: the unperturbed policy's log-probs, shifted by seeded noise so that
    # ratios leave [1 - eps, 1 + eps]; the very same tensor goes to both.
    shift = old_noise * torch.randn(rollout.ref_per_token_logps.shape, generator=generator)  # (N, T)
    noisy = rollout.ref_per_token_logps + shift
    ours.train()
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        for regime in ("on_policy", "off_policy"):
            old = None if regime == "on_policy" else noisy
            ours.zero_grad(set_to_none=True)
            logps, _ = per_token_logps(ours, rollout.input_ids, rollout.attention_mask, T, config.temperature)
            loss, metrics = grpo_loss(
                logps,
                old,
                rollout.ref_per_token_logps,
                advantages,
                rollout.completion_mask,
                config.replace(loss_type=loss_type),
                int(rollout.completion_mask.sum()),
            )
            loss.backward()
            trainer.loss_type = loss_type  # the only place TRL reads it (GRPOTrainer.__init__: self.loss_type)
            batch = dict(inputs)
            if old is not None:
                batch["old_per_token_logps"] = old
            theirs.zero_grad(set_to_none=True)
            their_loss = trainer._compute_loss(theirs, batch)
            their_loss.backward()
            key = f"{loss_type}/{regime}"
            diffs[key] = abs(loss.item() - their_loss.item())
            diffs[f"grad/{key}"] = relative_grad_diff(ours, theirs)
            if verbose:
                print(
                    f"  {loss_type:<10}{regime:<12}{loss.item():>14.8f}{their_loss.item():>14.8f}"
                    f"{diffs[key]:>11.2e}{diffs[f'grad/{key}']:>11.2e}{metrics['clip_ratio/region_mean']:>9.3f}"
                )
    diffs["max_loss_diff"] = max(v for k, v in diffs.items() if k.endswith("_policy") and not k.startswith("grad/"))
    diffs["max_grad_diff"] = max(v for k, v in diffs.items() if k.startswith("grad/"))
    diffs["kl"] = metrics["kl"]
    if verbose:
        print(
            f"  KL(pi_theta || pi_ref) = {diffs['kl']:.4f}; max loss |diff| = {diffs['max_loss_diff']:.2e}; "
            f"max relative gradient diff = {diffs['max_grad_diff']:.2e}"
        )
    return diffs

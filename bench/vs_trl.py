"""minigrpo vs TRL's GRPOTrainer: the same GRPO work, side by side, plus a loss cross-check.

    python bench/vs_trl.py                          # tiny Qwen on the CPU (default), 16 prompts x G=8
    python bench/vs_trl.py --model qwen0.5b-shape   # random-init Qwen2.5-0.5B-Instruct shape, offline (GPU)
    python bench/vs_trl.py --model Qwen/Qwen2.5-0.5B-Instruct   # a Hub id (needs the network)
    python bench/vs_trl.py --crosscheck-only        # just the loss / advantage cross-check

Needs the `bench` extra (`pip install -e ".[bench]"`: trl 1.16.0 and accelerate); TRL is never a core
dependency of minigrpo.

What is compared. Both trainers get the same weights (loaded from one folder), tokenizer, prompts (the
same B prompts at step k, in the same order), reward function (`correctness_reward`) and the GRPO
hyper-parameters, mapped field by field in `trl_config()`: num_generations, prompts per step (TRL's
generation batch = B * G completions, split into micro-batches of per_device_train_batch_size with
gradient accumulation, one optimizer step per generation batch), max_completion_length, temperature,
top_p, beta, epsilon(s), loss_type, scale_rewards, num_iterations, learning rate, AdamW betas, weight
decay, gradient clipping, constant schedule. Both sample exactly from pi_theta: TRL's generation
kwargs (top_k=0, top_p=1, min_p=None, repetition_penalty=1) and minigrpo's `generation_config_for`
override a Qwen-style model generation_config (top_k=20, top_p=0.8, repetition_penalty=1.05), and
the script prints both effective sampling settings. Same dtype (fp32 weights; bf16 autocast on a GPU
that has bf16: TRL `bf16=True`, minigrpo's `precision_context`), same attention implementation
(`--attn`, default sdpa). TRL's gradient checkpointing (its default is on) is turned off, because
minigrpo does not checkpoint the model (pass --trl-gradient-checkpointing to keep TRL's default).
minigrpo runs with its own defaults (the fast paths in GRPOConfig are on where they default on).

How it is timed. Each trainer lives in its own worker process; the parent tells them to take one
step in turn, A B A B ..., so they never run at the same time and see the same machine load. A
step is one optimizer step: prompts -> B * G completions -> rewards -> advantages -> loss ->
update. TRL runs its real `train()` loop; a callback blocks at the end of each step until the
parent says "next", and a step is timed from that release to the next `on_step_end` (so TRL's data
loading, logging bookkeeping and loop overhead count). minigrpo's step is the body of its `train()`
loop (`_guarded_step` + `_log`). Rollout = generation + reference log-probs + rewards + advantages
(TRL: `_generate_and_score_completions`; minigrpo: `collect_rollout` + its share of `optimize`
before the first forward is negligible and counted in update); update = the rest. The table reports
medians over steps 3..N (steps 1-2 are warm-up: allocator, lazy optimizer state, compilation).

Peak memory. GPU: `torch.cuda.max_memory_allocated()` in each worker (reset after the trainer is
built, so weights + reference + optimizer state + activations count). CPU: peak RSS
(`resource.getrusage(RUSAGE_SELF).ru_maxrss`) of each worker. RSS cannot be split between two
trainers in one process, hence the separate processes; both workers import the same libraries
(torch, transformers, datasets, trl, minigrpo) before building anything, so the library baseline is
the same and the difference is what the trainers allocate. The table also shows the RSS just before
the first step.

The cross-check (`crosscheck()`): one fixed rollout batch, sampled once by minigrpo, is fed to TRL
through its own `rollout_func` hook, so TRL's own code computes the rewards, advantages and reference
log-probs (`_generate_and_score_completions`) and the loss (`_compute_loss`); minigrpo computes the
same with its stage functions. The policy is first perturbed (the same seeded noise on both copies) so
that pi_theta != pi_ref (the KL term is non-zero), and each loss_type is checked twice: on-policy
(pi_old = pi_theta detached, as with num_iterations=1) and off-policy (pi_old = the unperturbed
policy, so ratios leave [1 - eps, 1 + eps] and clipping is exercised). It runs in fp32 on the CPU.

GPU run (for a session with the GPU machine; the image lacks trl and datasets, see
../shared/gpu/fetch-wheels.sh). Prepare here, from the repository root:

    ../shared/gpu/fetch-wheels.sh .whl && echo "/.whl/" >> .git/info/exclude

then run there as one command (about 5 minutes; leave room for a rerun):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site && mkdir -p $OUT && \
    python3 bench/vs_trl.py --model qwen0.5b-shape --prompts 8 --generations 8 --max-completion-length 128 \
        --steps 8 --json-out $OUT/gpu_vs_trl.json 2>&1 | tee $OUT/gpu_vs_trl.log && \
    python3 bench/vs_trl.py --model qwen0.5b-shape --t4-config --steps 4 --only minigrpo \
        --json-out $OUT/gpu_t4_config.json 2>&1 | tee $OUT/gpu_t4_config.log

(`--t4-config` runs GRPOConfig.qwen_t4() unchanged, fp32 without autocast as on a T4, and reports
minigrpo's peak GPU memory, to check it stays under 12 GiB.)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

# Qwen/Qwen2.5-0.5B-Instruct's config.json and generation_config.json, written out so the shape runs offline.
QWEN25_05B_CONFIG = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=32768,
    max_window_layers=21,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    sliding_window=32768,
    use_sliding_window=False,
    tie_word_embeddings=True,
    attention_dropout=0.0,
    initializer_range=0.02,
    bos_token_id=151643,
    eos_token_id=151645,
    use_cache=True,
)
QWEN25_GENERATION_CONFIG = dict(
    bos_token_id=151643,
    pad_token_id=151643,
    do_sample=True,
    eos_token_id=[151645, 151643],
    repetition_penalty=1.05,
    temperature=0.7,
    top_p=0.8,
    top_k=20,
)
QWEN_ENDOFTEXT, QWEN_IM_START, QWEN_IM_END = 151643, 151644, 151645


# --- the model, the data, the two configs ---------------------------------------------------
def qwen_shape_tokenizer():
    """The tiny character tokenizer widened to Qwen2.5's 151,936 ids, with its chat tokens at Qwen's ids.

    A random-init model samples any of the 151,936 ids, so every id must decode; the filler ids decode
    to short strings. The prompts are character-level (~40 tokens), close to Qwen's real prompt length.
    """
    from minigrpo.models import CHARACTERS, character_tokenizer

    vocab = {c: i for i, c in enumerate(CHARACTERS)}  # characters take ids 0..len-1
    for i in range(len(CHARACTERS), QWEN25_05B_CONFIG["vocab_size"]):
        vocab[f"<f{i}>"] = i
    for token, i in (("<|endoftext|>", QWEN_ENDOFTEXT), ("<|im_start|>", QWEN_IM_START), ("<|im_end|>", QWEN_IM_END)):
        del vocab[f"<f{i}>"]
        vocab[token] = i
    vocab["<unk>"] = vocab.pop(f"<f{len(CHARACTERS)}>")
    return character_tokenizer(vocab, model_max_length=131_072)  # Qwen2.5's tokenizer limit


def prepare_model_dir(name: str, folder: Path) -> str:
    """Write the benchmark model and tokenizer to `folder` (so both trainers, and TRL's reference
    model, load the very same weights); returns the path to load from."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from minigrpo.models import TINY_MODEL_DIR

    if name == "tiny":
        return str(TINY_MODEL_DIR)
    if name != "qwen0.5b-shape":
        return name  # a Hub id or a local folder
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B_CONFIG))
    model.generation_config = GenerationConfig(**QWEN25_GENERATION_CONFIG)  # Qwen's sampling defaults, on purpose
    model.save_pretrained(folder)
    qwen_shape_tokenizer().save_pretrained(folder)
    return str(folder)


def load(path: str, device: str, attn: str):
    """(model, tokenizer) in fp32 on `device` with the given attention implementation."""
    from transformers import AutoModelForCausalLM

    from minigrpo.models import load_tokenizer

    tokenizer = load_tokenizer(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    return model.to(device), tokenizer


def prompts_dataset(n: int):
    from minigrpo import make_arithmetic_dataset

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


def minigrpo_config(args, output_dir: str):
    from minigrpo import GRPOConfig

    if args.t4_config:
        return GRPOConfig.qwen_t4(max_steps=args.steps, eval_steps=0, save_steps=0, output_dir=output_dir)
    base = GRPOConfig.tiny_cpu if args.model == "tiny" else GRPOConfig.qwen_t4
    n = args.prompts * args.generations
    return base(
        prompts_per_step=args.prompts,
        num_generations=args.generations,
        per_device_train_batch_size=args.micro_batch or n,
        max_completion_length=args.max_completion_length,
        max_prompt_length=256,
        beta=args.beta,
        loss_type=args.loss_type,
        max_steps=args.steps,
        eval_steps=0,
        save_steps=0,
        output_dir=output_dir,
    )


def trl_config(config, args, device: str, output_dir: str):
    """minigrpo's GRPOConfig mapped onto TRL's, field by field."""
    import trl

    from minigrpo.models import autocast_dtype

    bf16 = autocast_dtype(torch.device(device)) is not None  # minigrpo autocasts to bf16 exactly there
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
        beta=config.beta,
        epsilon=config.epsilon,
        epsilon_high=config.clip_epsilon_high,
        loss_type=config.loss_type,
        scale_rewards=config.scale_rewards,
        importance_sampling_level=config.importance_sampling_level,
        mask_truncated_completions=config.mask_truncated_completions,
        use_bias_correction_kl=False,  # TRL 1.16 multiplies the KL by the ratio by default; the paper does not
        num_iterations=config.num_iterations,
        # the optimiser
        learning_rate=config.learning_rate,
        adam_beta1=config.adam_beta1,
        adam_beta2=config.adam_beta2,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        lr_scheduler_type="constant",
        warmup_steps=config.warmup_steps,
        optim="adamw_torch",
        max_steps=config.max_steps,
        seed=config.seed,
        # precision and devices
        use_cpu=device == "cpu",
        bf16=bf16,
        fp16=False,
        gradient_checkpointing=args.trl_gradient_checkpointing,
        # the same prompts in the same order; no logging, saving or evaluation during the timed loop
        shuffle_dataset=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


# --- the workers: one trainer per process -------------------------------------------------------
def _peak_memory(device: str) -> dict:
    report = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.startswith("cuda"):
        report["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return report


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _import_everything() -> None:
    """Both workers import the same libraries first, so their RSS baselines match."""
    import datasets  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import minigrpo  # noqa: F401


class SequentialSampler:
    """Prompts 0..B-1 at step 1, B..2B-1 at step 2, ...: TRL's order with shuffle_dataset=False."""

    def __init__(self):
        self.position = 0

    def next_indices(self, count: int) -> list[int]:
        indices = list(range(self.position, self.position + count))
        self.position += count
        return indices

    def state_dict(self) -> dict:
        return {"position": self.position}


def minigrpo_worker(conn, args, path: str, device: str, workdir: str) -> None:
    _import_everything()
    from minigrpo import GRPOTrainer
    from minigrpo.tasks.arithmetic import correctness_reward

    torch.set_num_threads(args.threads) if args.threads else None
    model, tokenizer = load(path, device, args.attn)
    config = minigrpo_config(args, f"{workdir}/minigrpo")
    if args.t4_config:
        _emulate_t4()
    dataset = prompts_dataset(config.prompts_per_step * (args.steps + 1))
    trainer = GRPOTrainer(model, tokenizer, [correctness_reward], dataset, config)
    trainer.sampler = SequentialSampler()
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    trainer.model.train()
    from minigrpo.rollout import generation_config_for

    sampling = generation_config_for(config, model, tokenizer)
    conn.send(
        {
            "ready": True,
            "rss_before_mib": _rss_mib(),
            "sampling": {k: getattr(sampling, k, None) for k in SAMPLING_KEYS},
            "config": {k: v for k, v in vars(config).items() if not k.startswith("_")},
        }
    )
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    while conn.recv() == "step":
        started = time.perf_counter()
        metrics = trainer._guarded_step()
        trainer.step += 1
        trainer._log(metrics)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        tokens = metrics["completions/mean_length"] * config.num_completions
        rollout = metrics["time/rollout"] + metrics["time/rewards"]
        conn.send({"step_time": seconds, "rollout": rollout, "update": seconds - rollout, "tokens": tokens})
    conn.send(_peak_memory(device))


SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "cache_implementation")


def trl_worker(conn, args, path: str, device: str, workdir: str) -> None:
    _import_everything()
    import trl
    from transformers import TrainerCallback

    from minigrpo.tasks.arithmetic import correctness_reward

    torch.set_num_threads(args.threads) if args.threads else None
    model, tokenizer = load(path, device, args.attn)
    config = minigrpo_config(args, f"{workdir}/minigrpo")
    dataset = prompts_dataset(config.prompts_per_step * (args.steps + 1))
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[correctness_reward],
        args=trl_config(config, args, device, f"{workdir}/trl"),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    timing = {"rollout": 0.0, "tokens": 0.0}
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(inputs):
        started = time.perf_counter()
        output = generate_and_score(inputs)
        timing["rollout"] += time.perf_counter() - started
        timing["tokens"] += float(output["completion_mask"].sum())
        return output

    trainer._generate_and_score_completions = timed_generate_and_score

    class StepByStep(TrainerCallback):
        """Blocks after each optimizer step until the parent says 'step' again."""

        def on_train_begin(self, *_, **__):
            self.wait()

        def on_step_end(self, *_, **__):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - self.started
            conn.send(
                {"step_time": seconds, "rollout": timing["rollout"], "update": seconds - timing["rollout"], **timing}
            )
            self.wait()

        def wait(self):
            conn.recv()  # "step" (or "finish" after the last step, when train() returns by itself)
            timing.update(rollout=0.0, tokens=0.0)
            self.started = time.perf_counter()

    trainer.add_callback(StepByStep())
    sampling = trainer.generation_config
    conn.send(
        {
            "ready": True,
            "rss_before_mib": _rss_mib(),
            "sampling": {k: getattr(sampling, k, None) for k in SAMPLING_KEYS},
            "prompt_ids_match": _same_prompt_ids(trainer, tokenizer, dataset, config),
        }
    )
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    conn.send(_peak_memory(device))


def _same_prompt_ids(trainer, tokenizer, dataset, config) -> bool:
    """TRL's prompt tokenisation equals minigrpo's (the same chat template, no special tokens added)."""
    from minigrpo.rollout import render_prompts

    prompts = list(dataset["prompt"][:4])
    theirs = trainer._tokenize_prompts(prompts)[0]
    ours = tokenizer(render_prompts(tokenizer, prompts), add_special_tokens=False)["input_ids"]
    return [list(ids) for ids in theirs] == ours


def _emulate_t4() -> None:
    """On a bf16 GPU, make minigrpo behave as on a T4 (no bf16: fp32 forward passes)."""
    torch.cuda.is_bf16_supported = lambda *a, **k: False


# --- the cross-check ------------------------------------------------------------------------
def _relative_grad_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """max |grad_a - grad_b| / max |grad_b| over all parameters."""
    diff = max((pa.grad - pb.grad).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters(), strict=True))
    scale = max(pb.grad.abs().max().item() for pb in b.parameters())
    return diff / max(scale, 1e-30)


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
) -> dict:
    """minigrpo's advantages and loss vs TRL's own code on one fixed rollout batch, in fp32 on the CPU.

    Returns {"advantages": max |diff|, "<loss_type>/on_policy" and "<loss_type>/off_policy": |loss diff|,
    "grad/<loss_type>/<regime>": max |grad diff| / max |grad|, "max_loss_diff", "max_grad_diff", "kl"}.
    """
    import trl

    from minigrpo import GRPOConfig
    from minigrpo.advantages import group_relative_advantages, group_rewards
    from minigrpo.logprobs import per_token_logps
    from minigrpo.losses import grpo_loss
    from minigrpo.models import TINY_MODEL_DIR, make_reference_model
    from minigrpo.rewards import compute_rewards
    from minigrpo.rollout import repeat_for_group, sample_group_rollout
    from minigrpo.tasks.arithmetic import correctness_reward

    path = str(TINY_MODEL_DIR) if path == "tiny" else path
    torch.manual_seed(seed)
    ours, tokenizer = load(path, "cpu", "sdpa")
    theirs, _ = load(path, "cpu", "sdpa")
    reference = make_reference_model(ours)  # pi_ref: the policy before the perturbation
    config = GRPOConfig.tiny_cpu(
        prompts_per_step=prompts,
        num_generations=generations,
        per_device_train_batch_size=prompts * generations,
        max_completion_length=max_completion_length,
        max_prompt_length=256,
        beta=beta,
        temperature=temperature,
    )
    dataset = varied_prompts(prompts)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trl.GRPOTrainer(
            model=theirs,
            reward_funcs=[correctness_reward],
            args=trl_config(config, argparse.Namespace(trl_gradient_checkpointing=False), "cpu", tmp),
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=lambda prompts, trainer: fixed["rollout"],
        )
    # the same perturbation on both policies, so that pi_theta != pi_ref
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p_ours, p_theirs in zip(ours.parameters(), theirs.parameters(), strict=True):
            delta = noise * p_ours.std().nan_to_num(0.0) * torch.randn(p_ours.shape, generator=generator)
            p_ours.add_(delta)
            p_theirs.add_(delta)

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
            diffs[f"grad/{key}"] = _relative_grad_diff(ours, theirs)
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


# --- the parent: alternate A B A B, then the table ------------------------------------------
def run_pair(args, path: str, device: str, workdir: str) -> dict:
    context = mp.get_context("spawn")
    workers, conns = {}, {}
    kinds = ["minigrpo", "trl"] if args.only is None else [args.only]
    for kind in kinds:
        parent_end, child_end = context.Pipe()
        target = minigrpo_worker if kind == "minigrpo" else trl_worker
        workers[kind] = context.Process(target=target, args=(child_end, args, path, device, workdir), daemon=True)
        workers[kind].start()
        conns[kind] = parent_end
    info = {kind: conns[kind].recv() for kind in kinds}
    for kind in kinds:
        print(f"{kind:>9} sampling: {info[kind]['sampling']}")
    if "trl" in info:
        print(f"TRL's prompt token ids equal minigrpo's: {info['trl']['prompt_ids_match']}")
    steps = {kind: [] for kind in kinds}
    for step in range(1, args.steps + 1):
        for kind in kinds:
            conns[kind].send("step")
            steps[kind].append(conns[kind].recv())
        line = "  ".join(f"{kind} {steps[kind][-1]['step_time']:.3f}s" for kind in kinds)
        print(f"step {step}/{args.steps}: {line}", flush=True)
    for kind in kinds:
        conns[kind].send("finish")
        info[kind].update(conns[kind].recv())
        workers[kind].join(timeout=60)
    return {kind: summarize(steps[kind], info[kind]) for kind in kinds}


def summarize(steps: list[dict], info: dict) -> dict:
    timed = steps[2:] if len(steps) > 2 else steps  # steps 3..N
    median = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    step_time = median("step_time")
    return {
        "step_time": step_time,
        "rollout": median("rollout"),
        "update": median("update"),
        "tokens_per_step": median("tokens"),
        "tokens_per_s": statistics.median(s["tokens"] / s["step_time"] for s in timed),
        "step_times": [round(s["step_time"], 4) for s in steps],
        **{k: v for k, v in info.items() if k in ("rss_before_mib", "peak_rss_mib", "peak_gpu_mib")},
    }


def print_table(results: dict, device: str) -> None:
    memory_key = "peak_gpu_mib" if device.startswith("cuda") else "peak_rss_mib"
    memory_name = "peak GPU alloc" if device.startswith("cuda") else "peak RSS"
    header = f"{'':<10}{'s/step':>9}{'rollout s':>11}{'update s':>10}{'tok/step':>10}{'tok/s':>9}{memory_name:>16}"
    print(header + ("" if device.startswith("cuda") else f"{'RSS at start':>14}"))
    for kind, r in results.items():
        line = f"{kind:<10}{r['step_time']:>9.3f}{r['rollout']:>11.3f}{r['update']:>10.3f}"
        line += f"{r['tokens_per_step']:>10.0f}{r['tokens_per_s']:>9.0f}{r[memory_key]:>12.0f} MiB"
        print(line + ("" if device.startswith("cuda") else f"{r['rss_before_mib']:>10.0f} MiB"))
    if len(results) == 2:
        a, b = results["minigrpo"], results["trl"]
        print(f"{'ratio':<10}{a['step_time'] / b['step_time']:>9.3f}{'':>41}{a[memory_key] / b[memory_key]:>12.3f}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny | qwen0.5b-shape | a Hub id or local folder")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--steps", type=int, default=12, help="steps per trainer; medians over steps 3..N")
    parser.add_argument("--prompts", type=int, default=16, help="B, prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="G, completions per prompt")
    parser.add_argument("--max-completion-length", type=int, default=24)
    parser.add_argument("--micro-batch", type=int, default=None, help="per_device_train_batch_size (default: N)")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--loss-type", default="grpo", choices=("grpo", "bnpo", "dr_grpo", "dapo"))
    parser.add_argument("--attn", default="sdpa", help="attention implementation of both models")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per worker (CPU default: 1)")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true", help="keep TRL's default (on)")
    parser.add_argument("--t4-config", action="store_true", help="GRPOConfig.qwen_t4() as on a T4 (fp32)")
    parser.add_argument("--only", choices=("minigrpo", "trl"), default=None, help="run one trainer only")
    parser.add_argument("--crosscheck-only", action="store_true")
    parser.add_argument("--skip-crosscheck", action="store_true")
    parser.add_argument("--json-out", default=None, help="also write the final JSON object here")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and args.threads is None:
        args.threads = 1  # the tiny model gains nothing from threads; one thread each keeps timings stable
    summary = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"}
    with tempfile.TemporaryDirectory() as workdir:
        path = prepare_model_dir(args.model, Path(workdir) / "model")
        if not args.skip_crosscheck:
            checks = crosscheck(path)
            summary["max_loss_diff"] = checks["max_loss_diff"]
            summary["max_advantage_diff"] = checks["advantages"]
            summary["loss_diffs"] = {k: v for k, v in checks.items() if "/" in k}
        if not args.crosscheck_only:
            print(f"\nbenchmark: {args.model} on {device}, {args.prompts} prompts x G={args.generations}, "
                  f"max_completion_length={args.max_completion_length}, beta={args.beta}, loss_type={args.loss_type}, "
                  f"{args.steps} steps each, alternating, threads={args.threads}")  # fmt: skip
            results = run_pair(args, path, device, workdir)
            print()
            print_table(results, device)
            memory_key = "peak_gpu_mib" if device.startswith("cuda") else "peak_rss_mib"
            summary.update({f"{kind}_{k}": v for kind, r in results.items() for k, v in r.items()})
            if len(results) == 2:
                summary["step_time_ratio"] = results["minigrpo"]["step_time"] / results["trl"]["step_time"]
                summary["peak_memory_ratio"] = results["minigrpo"][memory_key] / results["trl"][memory_key]
    summary["model"] = args.model
    line = json.dumps(summary)
    if args.json_out:
        Path(args.json_out).write_text(line + "\n")
    print(line)
    return summary


if __name__ == "__main__":
    main()

"""examples/grpo_single_file.py, the whole algorithm in one file, is the package's algorithm: on one fixed batch its
advantages, log-probs, loss and gradients equal minigrpo's within 1e-5, and its updated weights within 1e-6 wherever
float32 rounding cannot decide Adam's first step, for every loss_type, on- and off-policy, with and without the KL
term; its evaluation is the package's; its defaults are the tiny preset's; it imports none of the package's stages;
and its fast mode runs."""

import ast
import copy
import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from minigrpo import (
    GRPOConfig,
    GRPOTrainer,
    Rollout,
    completion_mask_from_eos,
    correctness_reward,
    evaluate_model,
    group_relative_advantages,
    grpo_loss,
    load_model_and_tokenizer,
    make_arithmetic_dataset,
    per_token_logps,
)
from minigrpo.tasks.arithmetic import make_question

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "grpo_single_file.py"
TOLERANCE = 1e-5
STEP_TOLERANCE = 1e-6  # weights after one step of lr 3e-4: a few float32 steps of a weight near 1 (1.2e-7 each)
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
ALLOWED_IMPORTS = {
    "minigrpo.models": {"load_model_and_tokenizer"},  # the bundled tiny Qwen's folder, loaded as any model is
    "minigrpo.tasks.arithmetic": {"REWARD_WEIGHTS", "correctness_reward", "format_reward", "make_arithmetic_dataset"},
}
"""What the file may take from minigrpo: the model's loader and the task (problems and reward functions), no stage."""


def load_script():
    spec = importlib.util.spec_from_file_location("grpo_single_file", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


sf = load_script()


# --- the file stands alone -------------------------------------------------------------------------------------
def test_the_file_imports_no_stage_trainer_or_run_module_of_minigrpo():
    tree = ast.parse(SCRIPT.read_text())
    taken = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not [a.name for a in node.names if a.name.split(".")[0] == "minigrpo"], "import minigrpo.X: use from"
            assert "importlib" not in [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "minigrpo":
            taken.setdefault(node.module, set()).update(a.name for a in node.names)
        elif isinstance(node, ast.Name):
            assert node.id != "__import__"
    assert set(taken) <= set(ALLOWED_IMPORTS), sorted(set(taken) - set(ALLOWED_IMPORTS))
    for module, names in taken.items():
        assert names <= ALLOWED_IMPORTS[module], (module, sorted(names - ALLOWED_IMPORTS[module]))
    assert taken  # the check above saw the file's minigrpo imports at all


def test_the_defaults_are_the_tiny_presets_and_the_train_commands():
    from minigrpo.__main__ import EVAL_PROMPTS, TRAIN_PROMPTS

    args, config = sf.Args(), GRPOConfig.tiny_cpu()
    shared = [f.name for f in sf.dataclasses.fields(sf.Args) if hasattr(config, f.name) and f.name != "epsilon_high"]
    assert len(shared) == 22
    assert {name: getattr(args, name) for name in shared} == {name: getattr(config, name) for name in shared}
    assert args.epsilon_high == config.clip_epsilon_high
    assert (args.model, args.train_size, args.eval_size) == ("tiny", TRAIN_PROMPTS, EVAL_PROMPTS)
    # what the file fixes instead of reading from its arguments (its module docstring says so)
    fixed = dict(scale_rewards="group", baseline="mean", std_ddof=1, kl_estimator="k3", use_bias_correction_kl=False,
                 importance_sampling_level="token", top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
                 mask_truncated_completions=False, dynamic_sampling=False)  # fmt: skip
    assert {name: getattr(config, name) for name in fixed} == fixed
    assert config.optimizer_steps_per_generation == config.num_iterations  # one optimizer step per pass


def test_arguments_that_cannot_work_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="choose a divisor of 12"):
        sf.Args(prompts_per_step=3, num_generations=4, per_device_train_batch_size=5)
    with pytest.raises(ValueError, match="choose one of grpo, bnpo, dr_grpo, dapo"):
        sf.Args(loss_type="ppo")
    with pytest.raises(ValueError, match="at least 2"):
        sf.Args(num_generations=1)
    assert sf.parse_args(["--fast", "--loss-type", "dapo"]) == sf.Args(**{**sf.FAST, "loss_type": "dapo"})


# --- stage by stage, against the package -------------------------------------------------------------------------
def test_completion_mask_by_hand_and_as_the_package():
    ids = torch.tensor([[5, 258, 256, 256], [5, 6, 7, 8], [256, 5, 5, 5], [5, 6, 7, 258]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(sf.completion_mask(ids, [258, 256]), expected)
    assert torch.equal(sf.completion_mask(ids, [258, 256]), completion_mask_from_eos(ids, [258, 256])[0])


def test_advantages_by_hand_and_as_the_package():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # a mixed group, an all-equal group
    # mean 0.5, so r - mean = +-0.5; std with ddof 1: sqrt(4 x 0.25 / 3) = sqrt(1/3); A = +-0.866
    by_hand = 0.5 * torch.tensor([1, -1, -1, 1, 0, 0, 0, 0]) / (math.sqrt(1 / 3) + 1e-4)
    assert torch.allclose(sf.group_advantages(rewards, 4, 1e-4), by_hand, atol=1e-6)
    assert torch.equal(sf.group_advantages(rewards, 4, 1e-4)[4:], torch.zeros(4))  # exactly 0, no rounding noise
    random_rewards = torch.rand(6, 8, generator=torch.Generator().manual_seed(0)).round(decimals=1)  # (B, G), ties
    package = group_relative_advantages(random_rewards, "group", "mean", 1, 1e-4).flatten()
    assert (sf.group_advantages(random_rewards.flatten(), 8, 1e-4) - package).abs().max() <= TOLERANCE


def test_learning_rate_schedule_by_hand_and_as_transformers():
    from transformers import get_scheduler

    args = sf.Args()
    assert [sf.lr_at(step, args) for step in (0, 100, 199, 200)] == pytest.approx([3e-4, 1.5e-4, 1.5e-6, 0.0])
    for scheduler, name in (("linear", "linear"), ("cosine", "cosine"), ("constant", "constant_with_warmup")):
        args = sf.Args(lr_scheduler_type=scheduler, warmup_steps=3, max_steps=10)
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
        reference = get_scheduler(name, optimizer, 3, 10)
        for step in range(10):
            assert sf.lr_at(step, args) == pytest.approx(reference.get_last_lr()[0], rel=1e-12, abs=0)
            optimizer.step()
            reference.step()


# --- one fixed batch ---------------------------------------------------------------------------------------------
G = 4
QUESTIONS = ((3, 4), (45, 67), (12, 7))  # prompts of different lengths: left padding matters
REWARDS = torch.tensor([1.1, 0.1, 0.0, 1.0, 1.1, 1.1, 1.1, 1.1, 0.0, 0.1, 1.1, 0.1])  # the middle group all equal


def batch_args(**changes):
    """3 prompts x G=4 in micro-batches of 4 (three micro-batches, each a whole group), the gradient clipped to a
    norm of 0.1 (its norm here is 0.75-1.7, so clipping always acts); the tiny preset otherwise."""
    return sf.Args(prompts_per_step=3, num_generations=G, per_device_train_batch_size=4, max_grad_norm=0.1, **changes)


@pytest.fixture(scope="module")
def fixed():
    """The fixed batch: tokenised prompts, seeded completions with a truncated row and an immediate EOS, and seeded
    perturbations of the log-probs for pi_old (ratio != 1, some beyond the clip range) and pi_ref (KL != 0)."""
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    prompts = [[{"role": "user", "content": make_question(a, "+", b)}] for a, b in QUESTIONS]
    dataset = Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a, b in QUESTIONS]})
    group_prompts = [p for p in prompts for _ in range(G)]
    args = batch_args()
    prompt_ids, prompt_mask = sf.tokenize_prompts(tokenizer, group_prompts, args.max_prompt_length, "cpu")
    torch.manual_seed(0)
    completion_ids = sf.generate(model, tokenizer, prompt_ids, prompt_mask, args)  # (12, T)
    eos = sf.eos_token_ids(model, tokenizer)
    completion_ids[0] = 65  # "A" to the end: no EOS, truncated
    completion_ids[5, 0] = eos[0]  # an EOS first: a completion of one token
    completion_mask = sf.completion_mask(completion_ids, eos)
    assert prompt_mask.sum(1).unique().numel() == 3 and completion_mask[0].all() and completion_mask[5].sum() == 1
    with torch.no_grad():
        logps = sf.per_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, 1.0)
    noise = torch.Generator().manual_seed(1)
    old = logps + 0.3 * torch.randn(logps.shape, generator=noise)  # exp(+-0.3): many ratios outside [0.8, 1.2]
    ref = logps + 0.3 * torch.randn(logps.shape, generator=noise)
    return dict(tokenizer=tokenizer, dataset=dataset, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                completion_ids=completion_ids, completion_mask=completion_mask, old=old, ref=ref)  # fmt: skip


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_per_token_logps_are_the_packages(fixed, temperature):
    model, _ = load_model_and_tokenizer("tiny", device="cpu")
    ids, masks = (fixed["prompt_ids"], fixed["completion_ids"]), (fixed["prompt_mask"], fixed["completion_mask"])
    ours = sf.per_token_logps(model, ids[0], masks[0], ids[1], masks[1], temperature)
    T = ids[1].shape[1]
    package = per_token_logps(model, torch.cat(ids, 1), torch.cat(masks, 1), T, temperature)[0]
    assert (ours - package).abs().max() <= TOLERANCE


CASES = [
    (loss_type, off_policy, beta) for loss_type in LOSS_TYPES for off_policy in (False, True) for beta in (0.04, 0.0)
]


def package_config(args, tmp_path) -> GRPOConfig:
    return GRPOConfig.tiny_cpu(
        prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_train_batch_size,
        beta=args.beta,
        loss_type=args.loss_type,
        max_grad_norm=args.max_grad_norm,
        output_dir=str(tmp_path / "run"),
    )


@pytest.mark.parametrize("loss_type, off_policy, beta", CASES)
def test_loss_and_its_gradient_are_the_packages(fixed, loss_type, off_policy, beta, tmp_path):
    args = batch_args(loss_type=loss_type, beta=beta)
    config = package_config(args, tmp_path)
    mask = fixed["completion_mask"][:4]  # one micro-batch: the first group
    advantages = sf.group_advantages(REWARDS, G, args.advantage_epsilon)[:4]
    logps = fixed["ref"][:4] - 0.1  # any log-probs: the loss is a function of them
    old = fixed["old"][:4] if off_policy else None
    ref = fixed["ref"][:4] if beta else None
    step_tokens = int(fixed["completion_mask"].sum())
    ours_logps, package_logps = logps.clone().requires_grad_(), logps.clone().requires_grad_()
    ours = sf.grpo_loss(ours_logps, old, ref, advantages, mask, args, step_tokens)
    package, metrics = grpo_loss(package_logps, old, ref, advantages, mask, config, step_tokens)
    ours.backward()
    package.backward()
    assert abs(ours.item() - package.item()) <= TOLERANCE
    assert (ours_logps.grad - package_logps.grad).abs().max() <= TOLERANCE
    assert ours_logps.grad.abs().max() > 1e-3  # a gradient that is there
    assert (metrics["clip_ratio/region_mean"] > 0.1) == off_policy  # off-policy, the clip switches tokens off


def package_update(trainer, rollout, advantages):
    """One optimizer step of the package's trainer on the rollout: GRPOTrainer.grpo_step (the one place this test
    calls a trainer method by name)."""
    return trainer.grpo_step(rollout, advantages, rollout.completion_mask)


def adam_first_step_is_conditioned(ours: torch.Tensor, theirs: torch.Tensor, eps: float) -> torch.Tensor:
    """Where Adam's first step is a function of the gradient that float32 rounding cannot change: a boolean mask.

    That step moves each weight by lr * g / (|g| + eps) (and the decay): where |g| is near Adam's eps (1e-8), a
    rounding difference of 1e-9 in g, as two summation orders give, moves it by a noticeable part of lr (a weight
    1.7e-5 apart at lr 3e-4 on one CPU). Where both gradients exceed 100 eps, or both are exactly 0 (the embeddings
    of tokens absent from the batch), the two steps agree to float32's last digit."""
    both_large = (ours.abs() > 100 * eps) & (theirs.abs() > 100 * eps)
    return both_large | ((ours == 0) & (theirs == 0))


@pytest.mark.parametrize("loss_type, off_policy, beta", CASES)
def test_one_update_is_the_packages_trainer_step(fixed, loss_type, off_policy, beta, tmp_path):
    """The whole update: micro-batches with accumulation, clipping (the gradient norm exceeds max_grad_norm here),
    AdamW at the schedule's first rate. Same loss, gradient norm before clipping, gradients and weights after."""
    args = batch_args(loss_type=loss_type, beta=beta)
    tokenizer = fixed["tokenizer"]
    old, ref = (fixed["old"] if off_policy else None), (fixed["ref"] if beta else None)
    advantages = sf.group_advantages(REWARDS, G, args.advantage_epsilon)  # (12,)
    tensors = {k: fixed[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}

    model, _ = load_model_and_tokenizer("tiny", device="cpu")
    optimizer = sf.make_optimizer(model, args)
    for group in optimizer.param_groups:
        group["lr"] = sf.lr_at(0, args)
    loss, grad_norm = sf.grpo_update(
        model, optimizer, sf.Rollout(**tensors, old_logps=old, ref_logps=ref), advantages, args
    )

    package_model, _ = load_model_and_tokenizer("tiny", device="cpu")
    trainer = GRPOTrainer(package_model, [correctness_reward], package_config(args, tmp_path), fixed["dataset"],
                          processing_class=tokenizer)  # fmt: skip
    is_truncated = completion_mask_from_eos(fixed["completion_ids"], sf.eos_token_ids(model, tokenizer))[1]
    rollout = Rollout(**tensors, is_truncated=is_truncated, completions=[], old_per_token_logps=old,
                      ref_per_token_logps=ref)  # fmt: skip
    metrics = package_update(trainer, rollout, advantages)

    assert abs(loss - metrics["loss"]) <= TOLERANCE
    assert abs(grad_norm - metrics["grad_norm"]) <= TOLERANCE and grad_norm > args.max_grad_norm
    ours, theirs = dict(model.named_parameters()), dict(package_model.named_parameters())
    assert ours.keys() == theirs.keys()
    compared = 0
    for name, parameter in ours.items():
        assert (parameter.grad - theirs[name].grad).abs().max() <= TOLERANCE, name
        conditioned = adam_first_step_is_conditioned(parameter.grad, theirs[name].grad, optimizer.defaults["eps"])
        assert ((parameter - theirs[name]) * conditioned).abs().max() <= STEP_TOLERANCE, name
        compared += int(conditioned.sum())
    assert compared >= 0.9 * sum(p.numel() for p in ours.values())  # nearly all the weights: 95% here
    start, _ = load_model_and_tokenizer("tiny", device="cpu")
    moved = [(p - q).abs().max().item() for p, q in zip(model.parameters(), start.parameters(), strict=True)]
    assert max(moved) > 1e-4  # the step changed the weights


def test_evaluation_is_the_packages():
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    held_out = make_arithmetic_dataset(48, "test", seed=0)
    args = sf.Args(eval_batch_size=32)  # two generate calls, the second of 16 prompts
    package = evaluate_model(model, tokenizer, held_out, [correctness_reward], GRPOConfig.tiny_cpu())
    accuracy = package["eval_accuracy"]  # float32: equal to 1e-6 means the same number of problems right
    assert sf.evaluate(model, tokenizer, held_out, args) == pytest.approx(accuracy, abs=1e-6)


def test_a_rollout_holds_pi_old_and_pi_ref_log_probs_as_the_package_computes_them():
    """num_iterations=2 and beta > 0: collect_rollout keeps pi_old's and pi_ref's log-probs, computed in micro-batches
    without gradients; before any update both are the policy's own, as the package's per_token_logps gives them."""
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    reference = copy.deepcopy(model)
    args = sf.Args(prompts_per_step=2, num_generations=4, per_device_train_batch_size=4, num_iterations=2)
    batch = make_arithmetic_dataset(2, "train", seed=3)[:]
    torch.manual_seed(0)
    rollout, rewards, accuracy = sf.collect_rollout(model, reference, tokenizer, batch, args)
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)  # (8, P + T)
    attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], 1)
    package = per_token_logps(model, input_ids, attention_mask, rollout.completion_ids.shape[1])[0].detach()
    assert rollout.old_logps.shape == rollout.ref_logps.shape == package.shape == (8, rollout.completion_ids.shape[1])
    assert (rollout.old_logps - package).abs().max() <= TOLERANCE
    assert (rollout.ref_logps - package).abs().max() <= TOLERANCE
    assert not rollout.old_logps.requires_grad and rewards.shape == (8,) and 0.0 <= accuracy <= 1.0


def test_prompt_batches_visit_every_prompt_once_per_epoch():
    batches = sf.prompt_batches(10, 4, seed=0)
    indices = [i for _ in range(5) for i in next(batches)]  # 20 indices: two epochs
    assert sorted(indices[:10]) == sorted(indices[10:]) == list(range(10))
    assert indices[:10] != indices[10:]  # a fresh order each epoch
    other_seed = sf.prompt_batches(10, 4, seed=1)
    assert indices[:10] != [i for _ in range(3) for i in next(other_seed)][:10]  # another seed, another order


# --- the fast mode -----------------------------------------------------------------------------------------------
def test_fast_mode_trains_three_steps_and_reports_accuracy(capsys):
    summary = sf.train(sf.parse_args(["--fast"]))
    history = summary["history"]
    assert [log["step"] for log in history] == [1, 2, 3]
    assert [log["lr"] for log in history] == pytest.approx([3e-4, 2e-4, 1e-4])  # linear decay to 0 at step 3
    assert all(math.isfinite(log["loss"]) and log["grad_norm"] > 0 for log in history)  # the weights moved
    assert all(0.0 <= log["reward"] <= 1.1 for log in history)
    assert ["eval_accuracy" in log for log in history] == [False, False, True]
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    before, after = (float(x) for x in re.fullmatch(r"accuracy before: ([\d.]+) after: ([\d.]+)", last_line).groups())
    assert (before, after) == (round(summary["accuracy_before"], 3), round(summary["accuracy_after"], 3))
    assert summary["accuracy_after"] == history[-1]["eval_accuracy"]

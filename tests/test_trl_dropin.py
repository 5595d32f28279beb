"""A GRPO script written the way TRL's documentation writes it runs on minigrpo with only the import line changed,
and does what TRL does with it: the same batch arithmetic, the same number of optimizer steps, the same prompts and
completions per step."""

import importlib
import math

import pytest

from minigrpo.models import TINY_MODEL_DIR, load_model_and_tokenizer
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset

trl = pytest.importorskip("trl", reason="trl is in the test extra: pip install -e '.[test]'")


def run_trl_style_script(library: str, output_dir: str) -> tuple[object, list[int]]:
    """The issue's script, verbatim but for the import line; returns the trainer and the group sizes scored."""
    module = importlib.import_module(library)
    GRPOConfig, GRPOTrainer = module.GRPOConfig, module.GRPOTrainer  # noqa: N806 (the script's names)
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    dataset = make_arithmetic_dataset(16, "train", seed=3)
    scored = []

    def math_reward_func(prompts, completions, completion_ids=None, **kwargs):
        scored.append(len(completions))
        return correctness_reward(prompts, completions, completion_ids, **kwargs)

    args = GRPOConfig(output_dir=output_dir, num_train_epochs=1, per_device_train_batch_size=2,
                      gradient_accumulation_steps=4, learning_rate=1e-6, logging_steps=10, save_steps=100,
                      max_completion_length=32, num_generations=4, temperature=0.9, beta=0.04, bf16=False,
                      report_to="none", seed=0)  # fmt: skip
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                          train_dataset=dataset, reward_funcs=[math_reward_func])  # fmt: skip
    trainer.train()
    trainer.save_model(f"{output_dir}/trained")
    return trainer, scored


def test_the_trl_script_runs_on_minigrpo(tmp_path):
    trainer, scored = run_trl_style_script("minigrpo", str(tmp_path))
    # per_device 2 x accumulation 4 = 8 completions per generation = 2 prompts x G=4; 16 prompts: 8 steps
    assert (trainer.args.generation_batch_size, trainer.args.prompts_per_step) == (8, 2)
    assert trainer.state.global_step == trainer.state.max_steps == 8
    assert scored == [8] * 8
    assert [row["step"] for row in trainer.state.log_history] == [8]  # logging_steps=10: the last step only
    assert {"loss", "reward", "kl", "grad_norm", "learning_rate", "epoch"} <= trainer.state.log_history[0].keys()
    reloaded, _ = load_model_and_tokenizer(str(tmp_path / "trained"), device="cpu")
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in trainer.model.parameters())


def test_the_same_script_on_trl_makes_the_same_steps(tmp_path):
    ours, our_scored = run_trl_style_script("minigrpo", str(tmp_path / "minigrpo"))
    theirs, their_scored = run_trl_style_script("trl", str(tmp_path / "trl"))
    assert theirs.state.global_step == ours.state.global_step
    assert their_scored == our_scored  # the same number of generations, each of the same size


@pytest.mark.parametrize(
    "fields",
    [
        dict(per_device_train_batch_size=2, gradient_accumulation_steps=4, num_generations=4),
        dict(per_device_train_batch_size=8, num_generations=8),
        dict(per_device_train_batch_size=4, generation_batch_size=32, num_generations=8),
        dict(per_device_train_batch_size=4, steps_per_generation=6, gradient_accumulation_steps=3, num_generations=4),
        dict(per_device_train_batch_size=16, gradient_accumulation_steps=2, num_generations=16),
    ],
)
def test_batch_arithmetic_matches_trls_config(fields, tmp_path):
    from minigrpo import GRPOConfig

    ours = GRPOConfig(output_dir=str(tmp_path), **fields)
    theirs = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, **fields)
    for name in ("generation_batch_size", "steps_per_generation", "gradient_accumulation_steps"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.prompts_per_step == theirs.generation_batch_size // theirs.num_generations


def test_prompts_per_step_is_an_alias_that_cannot_disagree():
    from minigrpo import GRPOConfig

    config = GRPOConfig(prompts_per_step=6, num_generations=4, per_device_train_batch_size=8)
    assert (config.generation_batch_size, config.steps_per_generation, config.gradient_accumulation_steps) == (24, 3, 3)
    assert config.replace(num_generations=8).generation_batch_size == 48  # B stays 6
    with pytest.raises(ValueError, match="disagrees with generation_batch_size"):
        GRPOConfig(prompts_per_step=6, generation_batch_size=16, num_generations=4, per_device_train_batch_size=8)
    with pytest.raises(ValueError, match="choose a divisor of 24"):
        GRPOConfig(prompts_per_step=6, num_generations=4, per_device_train_batch_size=5)


def test_max_steps_from_epochs_follows_trls_count():
    from minigrpo import GRPOConfig
    from minigrpo.run.schedule import resolve_max_steps

    config = GRPOConfig(per_device_train_batch_size=2, gradient_accumulation_steps=4, num_generations=4,
                        num_train_epochs=1.5)  # fmt: skip
    assert resolve_max_steps(config, 16, config.optimizer_steps_per_generation) == math.ceil(1.5 * 16 / 2)
    two_steps = config.replace(steps_per_generation=8)  # each generation of 4 prompts feeds 2 optimizer steps
    assert resolve_max_steps(two_steps, 16, two_steps.optimizer_steps_per_generation) == 12  # 1.5 x 4 gens x 2
    with pytest.raises(ValueError, match="fewer than one generation"):
        resolve_max_steps(config.replace(prompts_per_step=32), 16, 1)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("use_vllm", True, "model.generate"),
        ("fp16", True, "overflow"),
        ("remove_unused_columns", True, "reward functions receive"),
        ("report_to", "mlflow", "metrics.jsonl"),
        ("optim", "adamw_8bit", "AdamW"),
        ("deepspeed", "ds.json", "torchrun"),
        ("num_generationz", 8, "typo"),
    ],
)
def test_a_field_minigrpo_does_not_implement_is_one_clear_error(field, value, says):
    from minigrpo import GRPOConfig

    with pytest.raises((TypeError, ValueError), match=says) as error:
        GRPOConfig(**{field: value})
    assert field in str(error.value)


def test_bf16_true_without_native_bf16_warns_and_trains_in_fp32(tmp_path):
    from minigrpo import GRPOConfig, GRPOTrainer

    config = GRPOConfig.tiny_cpu(bf16=True, max_steps=1, prompts_per_step=2, num_generations=2,
                                 per_device_train_batch_size=4, output_dir=str(tmp_path))  # fmt: skip
    with pytest.warns(UserWarning, match="no native bf16"):
        trainer = GRPOTrainer("tiny", [correctness_reward], config, make_arithmetic_dataset(8, "train"))
    assert trainer.ref_model.dtype.is_floating_point and str(trainer.ref_model.dtype) == "torch.float32"


def test_use_bias_correction_kl_weights_the_kl_by_the_ratio():
    import torch

    from minigrpo import GRPOConfig
    from minigrpo.losses import grpo_loss

    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old, ref, mask = torch.tensor([[-1.5, -1.0]]), torch.tensor([[-1.2, -2.5]]), torch.ones(1, 2)
    plain_config = GRPOConfig(beta=1.0, max_steps=1, use_bias_correction_kl=False)  # the paper's k3 term
    plain, _ = grpo_loss(logps, old, ref, torch.zeros(1), mask, plain_config)
    corrected, _ = grpo_loss(
        logps, old, ref, torch.zeros(1), mask, GRPOConfig(beta=1.0, max_steps=1, use_bias_correction_kl=True)
    )
    delta = ref - logps.detach()
    k3 = delta.exp() - delta - 1
    ratio = (logps.detach() - old).exp()
    assert plain.item() == pytest.approx(k3.mean().item())  # advantages 0: the loss is beta * KL alone
    assert corrected.item() == pytest.approx((ratio * k3).mean().item())


def test_the_tiny_model_name_works_where_trl_takes_a_model_id(tmp_path):
    from minigrpo import GRPOConfig, GRPOTrainer

    # max_completion_length: TRL's default 512 and minigrpo's max_prompt_length 256 exceed the tiny model's context
    config = GRPOConfig(
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=24,
        output_dir=str(tmp_path),
    )
    trainer = GRPOTrainer(str(TINY_MODEL_DIR), correctness_reward, config, make_arithmetic_dataset(4, "train"))
    assert trainer.processing_class is trainer.tokenizer and trainer.args is trainer.config


def test_a_generation_can_feed_several_optimizer_steps(tmp_path):
    from minigrpo import GRPOConfig, GRPOTrainer

    # 4 completions per micro-batch, 1 micro-batch per optimizer step, 2 per generation: 2 optimizer steps each
    config = GRPOConfig(
        per_device_train_batch_size=4, gradient_accumulation_steps=1, steps_per_generation=2, num_generations=2,
        max_steps=4, max_completion_length=24, learning_rate=3e-4, save_steps=0, output_dir=str(tmp_path),
    )  # fmt: skip
    assert (config.prompts_per_step, config.optimizer_steps_per_generation) == (4, 2)
    trainer = GRPOTrainer("tiny", [correctness_reward], config, make_arithmetic_dataset(16, "train"))
    rollouts = []
    collect = trainer.collect_rollout
    trainer.collect_rollout = lambda: rollouts.append(collect()) or rollouts[-1]
    trainer.train()
    history = trainer.state.log_history
    assert [row["step"] for row in history] == [2, 4] and len(rollouts) == 2
    assert all(rollout.old_per_token_logps is not None for rollout, _, _ in rollouts)  # step 2 is off-policy

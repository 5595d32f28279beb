"""GRPOConfig: paper defaults, presets, and errors that name the value and the fix."""

import pytest

from minigrpo.config import GRPOConfig


def test_paper_defaults():
    config = GRPOConfig()
    assert (config.beta, config.epsilon, config.num_generations) == (0.04, 0.2, 8)
    assert (config.loss_type, config.num_iterations, config.kl_estimator) == ("grpo", 1, "k3")
    assert (config.scale_rewards, config.std_ddof, config.clip_epsilon_high) == ("group", 1, 0.2)


def test_presets_are_valid_and_overridable():
    assert GRPOConfig.tiny_cpu().gradient_accumulation_steps >= 1
    assert GRPOConfig.qwen_t4().gradient_accumulation_steps == 8
    assert GRPOConfig.tiny_cpu(beta=0.0).beta == 0.0


def test_t4_preset_saves_activation_memory():
    config = GRPOConfig.qwen_t4()
    assert config.gradient_checkpointing and not config.share_prompt_prefix
    assert config.per_device_train_batch_size == 8
    assert not GRPOConfig().gradient_checkpointing and not GRPOConfig().fast_generation


def test_checkpointing_needs_the_plain_path():
    with pytest.raises(ValueError, match="gradient_checkpointing=True.*share_prompt_prefix=False"):
        GRPOConfig(gradient_checkpointing=True)
    assert GRPOConfig(gradient_checkpointing=True, share_prompt_prefix=False).gradient_checkpointing
    assert GRPOConfig.tiny_cpu(beta=0.0).beta == 0.0


def test_num_generations_below_two():
    with pytest.raises(ValueError, match="num_generations=1.*at least 2"):
        GRPOConfig(num_generations=1)


def test_micro_batches_must_divide_the_batch():
    with pytest.raises(ValueError) as info:
        GRPOConfig(prompts_per_step=12, num_generations=8, per_device_train_batch_size=5)
    message = str(info.value)
    assert "12 prompts x G=8 = 96 completions" in message
    assert "micro-batches of per_device_train_batch_size=5" in message
    assert "choose a divisor of 96" in message


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("loss_type", "ppo", "not one of"),
        ("scale_rewards", True, "not one of"),
        ("temperature", 0.0, "positive"),
        ("beta", -0.1, ">= 0"),
        ("epsilon", 1.5, "< 1"),
        ("std_ddof", 2, "Bessel"),
        ("top_p", 0.0, "(0, 1]"),
        ("max_completion_length", 0, "positive"),
    ],
)
def test_bad_values_name_the_field(field, value, words):
    with pytest.raises(ValueError, match=field) as info:
        GRPOConfig(**{field: value})
    assert words in str(info.value)


def test_replace_validates_again():
    with pytest.raises(ValueError, match="num_generations"):
        GRPOConfig().replace(num_generations=0)


FLOAT_FIELDS = [
    "learning_rate", "beta", "epsilon", "epsilon_high", "temperature", "top_p", "advantage_epsilon",
    "max_grad_norm", "weight_decay", "adam_beta1", "adam_beta2", "reward_timeout",
]  # fmt: skip


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_float_fields_must_be_finite(field, value):
    with pytest.raises(ValueError, match=f"{field}=.*finite number"):
        GRPOConfig(**{field: value})


def test_ppo_fields_and_reward_weights_must_be_finite_too():
    from minigrpo.ppo import PPOConfig

    with pytest.raises(ValueError, match="gamma=nan: it must be a finite number"):
        PPOConfig(gamma=float("nan"))
    with pytest.raises(ValueError, match=r"reward_weights=\[1.0, inf\]: it must be a finite number"):
        GRPOConfig(reward_weights=[1.0, float("inf")])


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("save_total_limit", 0, "keep at least 1 checkpoint"),
        ("weight_decay", -0.1, ">= 0"),
        ("max_grad_norm", -1.0, ">= 0"),
        ("adam_beta1", 1.0, "[0, 1)"),
        ("adam_beta2", -0.5, "[0, 1)"),
        ("reward_timeout", 0.0, "positive number of seconds"),
    ],
)
def test_ranges_of_the_new_checks(field, value, words):
    with pytest.raises(ValueError, match=field) as info:
        GRPOConfig(**{field: value})
    assert words in str(info.value)


def test_reward_timeout_and_overwrite_defaults():
    config = GRPOConfig()
    assert config.reward_timeout is None and config.overwrite_output_dir is False
    assert GRPOConfig(reward_timeout=2.5, save_total_limit=1, max_grad_norm=0.0).reward_timeout == 2.5

"""GRPOConfig: TRL's defaults, the paper's and the course's presets, and errors that name the value and the fix."""

import dataclasses
import re
from typing import Annotated

import pytest

from minigrpo.config import (
    DEEPSEEKMATH_ALGORITHM,
    DIFFERING_DEFAULTS,
    GROUPS,
    OPTIONS,
    PRESETS,
    REFUSED_SWITCHES,
    RESUME_FREE_FIELDS,
    TRAINING_FIELDS,
    GRPOConfig,
    Option,
    field_options,
)
from minigrpo.trl_compat import requested_trackers


def test_bare_defaults_train_trls_algorithm_and_the_paper_is_a_preset():
    config = GRPOConfig()
    assert (config.beta, config.epsilon, config.num_generations) == (0.0, 0.2, 8)
    assert (config.loss_type, config.num_iterations, config.kl_estimator) == ("dapo", 1, "k3")
    assert (config.scale_rewards, config.std_ddof, config.clip_epsilon_high) == ("group", 1, 0.2)
    assert (config.lr_scheduler_type, config.use_bias_correction_kl, config.adam_beta2) == ("linear", True, 0.999)
    paper = GRPOConfig.deepseekmath()
    assert (paper.beta, paper.loss_type, paper.use_bias_correction_kl) == (0.04, "grpo", False)


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


def advice_in(message: str) -> list[dict]:
    """Each setting the message names after "What works:": {field: value} or {"processes": K}, one per value."""
    advice = message.partition("What works: ")[2]
    assert advice, message
    settings = [
        {field: int(value)}
        for field, values in re.findall(r"(\w+)=(\d+(?: or \d+)?)", advice)
        for value in values.split(" or ")
    ]
    processes = re.search(r"(\d+(?:, \d+)*(?: or \d+)?) processes", advice)
    settings += [{"processes": int(k)} for k in re.split(", | or ", processes.group(1))] if processes else []
    return settings


@pytest.mark.parametrize(
    "processes, fields",
    [
        (3, {}),  # the tiny preset, 16 prompts x G=8, under torchrun --nproc-per-node 3
        (2, dict(prompts_per_step=3, num_generations=4, per_device_train_batch_size=4)),
        (4, dict(prompts_per_step=6, num_generations=8, per_device_train_batch_size=16)),  # 16 divides few shares
        (2, dict(prompts_per_step=None, generation_batch_size=24, num_generations=8, per_device_train_batch_size=4)),
        (2, dict(prompts_per_step=None, num_generations=8, per_device_train_batch_size=4)),  # TRL's rule: B = 1
    ],
)
def test_a_generation_that_does_not_split_over_the_processes_names_settings_that_do(monkeypatch, processes, fields):
    """Each process takes whole groups, so B must be a multiple of K: no micro-batch size can help, and the error
    names the prompts per step, G or process counts that work, each of which then builds and splits."""
    from minigrpo.run import distributed

    monkeypatch.setenv("WORLD_SIZE", str(processes))  # read by the config's batch rule, as under torchrun
    with pytest.raises(ValueError, match=f"cannot be split over {processes} processes") as info:
        GRPOConfig.tiny_cpu(**fields)
    assert "divisor" not in str(info.value)
    advice = advice_in(str(info.value))
    assert advice
    for setting in advice:
        monkeypatch.setenv("WORLD_SIZE", str(setting.get("processes", processes)))
        changes = {name: value for name, value in setting.items() if name != "processes"}
        distributed.check_config(GRPOConfig.tiny_cpu(**{**fields, **changes}))  # builds, and splits over the ranks
    if not fields:
        assert advice == [{"prompts_per_step": 15}, {"prompts_per_step": 18}, *({"processes": k} for k in (2, 4, 8))]


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


# --- defaults: TRL's; presets: explicit ----------------------------------------------------------
def trl_defaults():
    import warnings

    trl = pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # bf16=False: TRL's default (on wherever torch reports bf16) refuses to start on a CPU
        return trl.GRPOConfig(output_dir="unused", bf16=False)


def test_bare_defaults_are_trls_field_by_field():
    theirs, ours = trl_defaults(), GRPOConfig()
    shared = [f.name for f in dataclasses.fields(GRPOConfig) if f.init and hasattr(theirs, f.name)]
    assert len(shared) > 40
    for name in shared:
        their = getattr(getattr(theirs, name), "value", getattr(theirs, name))  # TRL keeps some as enums
        if name in DIFFERING_DEFAULTS:
            assert getattr(ours, name) != their, f"{name} now equals TRL's default: drop it from DIFFERING_DEFAULTS"
        else:
            assert getattr(ours, name) == their, f"{name}: minigrpo {getattr(ours, name)!r}, TRL {their!r}"
    assert set(DIFFERING_DEFAULTS) <= set(shared)


def test_report_to_defaults_to_no_tracker_as_transformers_5_does():
    """minigrpo's 'none' on every transformers version; TRL keeps transformers' default, which was 'all' (every
    installed tracker) before transformers 5 and is 'none', read as [], from it (DIFFERING_DEFAULTS["report_to"])."""
    assert GRPOConfig().report_to == "none" and requested_trackers(GRPOConfig().report_to) == []
    import transformers

    theirs = trl_defaults().report_to
    if int(transformers.__version__.split(".")[0]) >= 5:
        assert theirs == []
    else:
        from transformers.integrations import get_available_reporting_integrations

        assert theirs == get_available_reporting_integrations()


def test_the_defaults_are_not_a_combination_the_config_refuses():
    config = GRPOConfig()
    assert not (config.gradient_checkpointing and config.share_prompt_prefix)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_sets_every_field_that_decides_the_training(name):
    preset = PRESETS[name]
    assert set(TRAINING_FIELDS) <= set(preset), sorted(set(TRAINING_FIELDS) - set(preset))
    config = getattr(GRPOConfig, name)()
    assert {field: getattr(config, field) for field in TRAINING_FIELDS} == {f: preset[f] for f in TRAINING_FIELDS}


def test_a_new_bare_default_would_not_move_a_preset():
    # every training field of every preset comes from the preset, none from a bare default
    for name in PRESETS:
        built = getattr(GRPOConfig, name)()
        for field in TRAINING_FIELDS:
            assert getattr(built, field) == PRESETS[name][field], (name, field)


def test_the_deepseekmath_preset_has_the_papers_algorithm():
    config = GRPOConfig.deepseekmath()
    assert (config.beta, config.kl_estimator, config.use_bias_correction_kl) == (0.04, "k3", False)
    assert (config.loss_type, config.epsilon, config.num_iterations, config.learning_rate) == ("grpo", 0.2, 1, 1e-6)
    assert config.optimizer_steps_per_generation == 1  # one update per rollout
    assert (config.scale_rewards, config.baseline, config.lr_scheduler_type) == ("group", "mean", "constant")


@pytest.mark.parametrize(
    ("name", "own"),
    [("tiny_cpu", {"learning_rate", "lr_scheduler_type"}), ("tiny_tools_cpu", {"learning_rate", "lr_scheduler_type"}),
     ("qwen_t4", {"learning_rate"}), ("qwen1_5b_lora_t4", {"learning_rate"})],
)  # fmt: skip
def test_the_course_presets_run_the_papers_algorithm(name, own):
    preset = PRESETS[name]
    assert {k for k, v in DEEPSEEKMATH_ALGORITHM.items() if preset[k] != v} <= own, name


def test_the_tiny_preset_decays_its_rate_linearly_without_warm_up():
    # TRL's schedule, so that the default run ends at its best; no warm-up, whose first step would have rate 0
    # (a one-step run would not learn)
    config = GRPOConfig.tiny_cpu()
    assert (config.lr_scheduler_type, config.warmup_steps, config.learning_rate) == ("linear", 0, 3e-4)


@pytest.mark.parametrize(
    "field, value",
    [
        ("learning_rate", "1e-5"),
        ("num_generations", 2.0),
        ("reward_weights", [1, "a"]),
        ("seed", None),
        ("output_dir", None),
        ("beta", True),
        ("max_steps", "10"),
    ],  # fmt: skip
)
def test_a_field_of_the_wrong_type_is_refused_when_the_config_is_built(field, value):
    with pytest.raises(
        TypeError, match=re.escape(f"{field}={value!r} is a {type(value).__name__}, but the field takes")
    ):
        GRPOConfig(**{field: value})


def test_numbers_of_the_wider_kind_are_accepted():
    config = GRPOConfig(learning_rate=1, reward_weights=[1, 0.5], num_train_epochs=2, temperature=1)
    assert (config.learning_rate, config.reward_weights) == (1, [1, 0.5])


def test_eval_and_save_steps_below_one_are_a_fraction_of_the_run_as_in_trl():
    from minigrpo.trainer import Trainer

    trainer = Trainer.__new__(Trainer)  # _due reads only step and max_steps
    trainer.max_steps, due = 200, []
    for step in range(1, 201):
        trainer.step = step
        if trainer._due(step - 1, 0.25):
            due.append(step)
    assert due == [50, 100, 150, 200]
    with pytest.raises(ValueError, match="a whole number of steps, a fraction of the run below 1"):
        GRPOConfig(save_steps=2.5)


# --- each field declared once: every list of fields is read from the fields' Options -----------------------------
def test_every_field_declares_an_option_in_a_known_section():
    fields = [f.name for f in dataclasses.fields(GRPOConfig)]
    assert list(OPTIONS) == fields
    assert {option.group for option in OPTIONS.values()} == set(GROUPS)  # no section left empty
    with pytest.raises(ValueError, match="Option group 'sampling' is not one of 'model', 'data'"):
        Option("sampling")


def test_a_field_without_an_option_is_named_at_import():
    @dataclasses.dataclass
    class Config:
        beta: Annotated[float, Option("training", trains=True)] = 0.0
        gamma: float = 1.0

    with pytest.raises(TypeError, match=r"Config.gamma has no Option: declare it as gamma: Annotated\[<type>"):
        field_options(Config)


def test_the_lists_of_fields_are_the_options():
    assert TRAINING_FIELDS == tuple(name for name, option in OPTIONS.items() if option.trains)
    assert set(RESUME_FREE_FIELDS) == {name for name, option in OPTIONS.items() if option.resume_free}
    assert DIFFERING_DEFAULTS == {name: option.differs for name, option in OPTIONS.items() if option.differs}
    # the only training fields a resume may change: the run's length, the precision and the micro-batch (memory)
    assert set(TRAINING_FIELDS) & set(RESUME_FREE_FIELDS) == {
        "max_steps", "num_train_epochs", "bf16", "per_device_train_batch_size",
    }  # fmt: skip
    assert "reward_weights" in TRAINING_FIELDS  # the reward's scale: it moves every advantage
    assert "resume_from_checkpoint" in RESUME_FREE_FIELDS  # the resumed script passes a path the first run had not


def test_a_refused_switch_is_a_field_accepted_only_at_false():
    assert list(REFUSED_SWITCHES) == ["fp16", "use_vllm", "remove_unused_columns", "trust_remote_code", "push_to_hub"]
    defaults = GRPOConfig()
    for name, instead in REFUSED_SWITCHES.items():
        assert getattr(defaults, name) is False
        with pytest.raises(ValueError, match=f"^{name}=True: {re.escape(instead)}$"):
            GRPOConfig(**{name: True})


def test_docs_trl_md_names_every_field():
    """docs/trl.md sorts the fields into those accepted with TRL's meaning and minigrpo's own names."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parent.parent / "docs" / "trl.md").read_text()
    lists = docs[docs.index("- **Accepted with TRL's meaning:**") : docs.index("- **Refused by name:**")]
    assert [name for name in OPTIONS if f"`{name}`" not in lists] == []

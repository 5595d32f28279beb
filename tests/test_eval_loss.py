"""eval_loss, TRL's evaluation loss: the GRPO loss on num_generations_eval samples per held-out prompt.

At evaluation the policy that samples is the one scored, so the ratio is 1 and the loss is -(the advantages'
weighted mean) + beta * KL. The tests rebuild it from those two terms, sampled from the same seeds, and check the
facts the docstring states: 0 under 'grpo' with beta = 0, beta times the KL with beta > 0, not 0 under a
token-weighted loss_type."""

import pytest
import torch

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.advantages import group_relative_advantages, group_rewards
from minigrpo.logprobs import masked_mean, per_token_logps
from minigrpo.ppo import PPOConfig, PPOTrainer
from minigrpo.rewards import completion_text
from minigrpo.rollout import sample_group_rollout
from minigrpo.run import distributed
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset

G_EVAL = 2  # not num_generations (4): evaluation's groups are its own (two of them are 4 rows, not one group of 4)


def length_reward(completions, **kwargs) -> list[float]:
    """Rewards that differ within a group: the text's length (at temperature 2 the tiny model's completions end at
    different lengths; at 1 each is '<answer>NN</answer>')."""
    return [float(len(completion_text(completion))) for completion in completions]  # a string or a chat message


def trainer_for(tmp_path, **fields) -> GRPOTrainer:
    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, prompts_per_step=2,
                  max_steps=1, max_completion_length=24, temperature=2.0, learning_rate=1e-3, logging_steps=1,
                  save_strategy="no", eval_steps=1, eval_batch_size=8, num_generations_eval=G_EVAL, seed=0,
                  bf16=False)  # fmt: skip
    return GRPOTrainer(
        "tiny",
        [length_reward],
        GRPOConfig(**{**values, **fields}),
        make_arithmetic_dataset(8, "train"),
        eval_dataset=make_arithmetic_dataset(6, "test"),  # 6 prompts, 4 per generate call: chunks of 4 and 2
    )


def loss_terms(trainer) -> tuple[float, float]:
    """(the token-weighted mean of the advantages, the mean over completions of each one's mean k3 KL), from the
    evaluation's samples drawn again from its seeds, chunk by chunk as evaluation_loss draws them."""
    config, prompts = trainer.config, list(trainer.eval_dataset["prompt"])
    per_call = config.eval_batch_size // G_EVAL
    weighted, tokens, kls = 0.0, 0.0, []
    for start in range(0, len(prompts), per_call):
        chunk = range(start, min(start + per_call, len(prompts)))
        seeds = distributed.group_seeds(config.seed, trainer.step, (f"eval/{i}" for i in chunk))
        part = prompts[chunk.start : chunk.stop]
        rollout = sample_group_rollout(trainer.model, trainer.tokenizer, part, config, trainer.ref_model, seeds, G_EVAL)
        rewards = torch.tensor(length_reward(rollout.completions))
        advantages = group_relative_advantages(group_rewards(rewards, G_EVAL), config.scale_rewards).flatten()
        lengths = rollout.completion_mask.sum(1).double()
        weighted += float((advantages.double() * lengths).sum())
        tokens += float(lengths.sum())
        if config.beta:
            with torch.no_grad():  # the plain path: every row's prompt run in full
                ids, mask, T = rollout.input_ids, rollout.attention_mask, rollout.completion_ids.shape[1]
                logps, _ = per_token_logps(trainer.model, ids, mask, T, config.temperature)
            delta = rollout.ref_per_token_logps - logps
            kl = torch.exp(delta) - delta - 1  # k3, per token
            kls += masked_mean(kl, rollout.completion_mask, dim=1).tolist()
    return weighted / tokens, (sum(kls) / len(kls) if kls else 0.0)


def test_eval_loss_is_zero_under_grpo_without_kl_as_the_advantages_sum_to_zero_in_each_group(tmp_path):
    trainer = trainer_for(tmp_path, beta=0.0, loss_type="grpo")
    token_weighted_advantage, _ = loss_terms(trainer)
    assert abs(token_weighted_advantage) > 1e-3  # the rewards do differ: the 0 below is the grouping's
    assert trainer.evaluate()["eval_loss"] == pytest.approx(0.0, abs=1e-6)


def test_eval_loss_under_bnpo_is_minus_the_token_weighted_mean_advantage(tmp_path):
    trainer = trainer_for(tmp_path, beta=0.0, loss_type="bnpo")
    token_weighted_advantage, _ = loss_terms(trainer)
    assert abs(token_weighted_advantage) > 1e-3  # the lengths differ within a group
    assert trainer.evaluate()["eval_loss"] == pytest.approx(-token_weighted_advantage, rel=1e-5)


def test_eval_loss_under_grpo_is_beta_times_the_kl_which_training_moves_from_zero(tmp_path):
    trainer = trainer_for(tmp_path, beta=0.04, loss_type="grpo")
    assert trainer.evaluate()["eval_loss"] == pytest.approx(0.0, abs=1e-6)  # the policy is its reference
    trainer.train()  # one step at lr 1e-3, then evaluates (eval_steps=1)
    logged = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert len(logged) == 1 and logged[0]["step"] == 1
    _, mean_kl = loss_terms(trainer)
    assert mean_kl > 0
    assert logged[0]["eval_loss"] == pytest.approx(0.04 * mean_kl, rel=1e-4)
    assert trainer.evaluate()["eval_loss"] == logged[0]["eval_loss"]  # the same seeds: the same samples


def test_without_num_generations_eval_evaluation_stays_greedy_and_logs_no_eval_loss(tmp_path):
    trainer = trainer_for(tmp_path, num_generations_eval=None)
    assert "eval_loss" not in trainer.evaluate() and "eval_accuracy" in trainer.evaluate()


def test_a_group_of_one_and_a_trainer_without_the_grpo_loss_are_refused_with_what_to_set(tmp_path):
    with pytest.raises(ValueError, match="num_generations_eval=1: .* Set num_generations_eval >= 2, or None"):
        GRPOConfig(num_generations_eval=1)
    config = PPOConfig.from_config(GRPOConfig.tiny_cpu(output_dir=str(tmp_path), num_generations_eval=4))
    with pytest.raises(ValueError, match="PPOTrainer does not compute. Set num_generations_eval=None"):
        PPOTrainer("tiny", [correctness_reward], config, make_arithmetic_dataset(4, "train"))


# --- when eval_loss is computed: TRL's rule for TRL scripts, greedy accuracy alone for minigrpo's own runs ---------
def test_a_trl_script_that_evaluates_gets_eval_loss_and_eval_reward_without_num_generations_eval(tmp_path):
    """TRL's GRPOConfig evaluates only when told (eval_strategy="steps"; its default is "no"), and then samples
    num_generations per held-out prompt: eval_loss and eval_reward in log_history and from evaluate()."""
    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                        max_completion_length=8, eval_strategy="steps", eval_steps=1, save_strategy="no",
                        bf16=False, report_to="none")  # fmt: skip
    assert (config.num_generations_eval, config.eval_generations) == (None, 4)
    trainer = GRPOTrainer("tiny", [correctness_reward], config, make_arithmetic_dataset(4, "train"),
                          eval_dataset=make_arithmetic_dataset(2, "test"))  # fmt: skip
    trainer.train()
    (logged,) = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert logged["step"] == 1 and "eval_reward" in logged
    assert {"eval_loss", "eval_reward"} <= trainer.evaluate().keys()


def test_minigrpos_own_runs_evaluate_greedily_without_sampling_eval_loss(tmp_path):
    """eval_strategy left at minigrpo's default (None: 'steps', greedy accuracy): no sampled evaluation in the
    presets, the command line's runs or a bare GRPOConfig; an explicit eval_strategy or num_generations_eval asks
    for it, and replace() keeps which of them was given."""
    from minigrpo.__main__ import build_parser, make_config

    args = vars(build_parser().parse_args(["train"]))
    fields = {name: value for name, value in args.items() if name in GRPOConfig.__dataclass_fields__}
    configs = [make_config("tiny", fields), make_config("Qwen/Qwen2.5-0.5B-Instruct", fields), GRPOConfig()]
    presets = ("deepseekmath", "tiny_cpu", "tiny_tools_cpu", "qwen_t4", "qwen1_5b_lora_t4")
    configs += [getattr(GRPOConfig, preset)() for preset in presets]
    for config in configs:
        assert config.eval_strategy == "steps" and config.eval_generations is None
        assert config.replace(max_steps=3).eval_generations is None
    config = GRPOConfig.tiny_cpu(eval_strategy="steps")
    assert config.eval_generations == 8 and config.replace(max_steps=3).eval_generations == 8
    assert GRPOConfig.tiny_cpu(num_generations_eval=2).eval_generations == 2
    held_out = make_arithmetic_dataset(2, "test")
    trainer = GRPOTrainer("tiny", [correctness_reward], GRPOConfig.tiny_cpu(output_dir=str(tmp_path)),
                          make_arithmetic_dataset(4, "train"), eval_dataset=held_out)  # fmt: skip
    assert "eval_loss" not in trainer.evaluate()


def test_trls_parser_tells_a_given_eval_strategy_from_the_default(tmp_path):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(GRPOConfig)
    (config,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path)])
    assert config.eval_strategy == "steps" and config.eval_generations is None
    (config,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--eval_strategy", "steps"])
    assert config.eval_generations == config.num_generations

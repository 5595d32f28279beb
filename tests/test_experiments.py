"""minigrpo.experiments: the helpers behind lessons 06 and 07 (hand-computed values, invariants, short runs)."""

import matplotlib
import pytest
import torch

from minigrpo import GRPOConfig, GRPOTrainer, correctness_reward, group_relative_advantages, grpo_loss
from minigrpo.experiments import (
    VARIANTS,
    DynamicSamplingGRPOTrainer,
    at_least_reward,
    completion_table,
    config_diff,
    dynamic_sampling_mask,
    make_length_bonus,
    number_anywhere_reward,
    per_token_gradient_weights,
    plot_variant_comparison,
    select_completions,
    simulate_disconnect,
    summarize_run,
    train_short_run,
    variant_config,
)
from minigrpo.rollout import Rollout

matplotlib.use("Agg")

WORKED = [2.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 1.0]
# four groups of G = 8: the worked example, all correct, all wrong, one lucky success
FOUR_GROUPS = torch.tensor([WORKED, [2.0] * 8, [0.0] * 8, [1.0] * 7 + [2.0]])


def test_per_token_gradient_weights_hand_computed():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])  # lengths 2 and 4, T_max = 4, N = 2
    expected = {
        "grpo": [[1 / 4, 1 / 4, 0, 0], [1 / 8] * 4],  # 1 / (N |o_i|)
        "bnpo": [[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4],  # 1 / (2 + 4 tokens)
        "dapo": [[1 / 6, 1 / 6, 0, 0], [1 / 6] * 4],
        "dr_grpo": [[1 / 8, 1 / 8, 0, 0], [1 / 8] * 4],  # 1 / (N T_max)
    }
    for loss_type, weights in expected.items():
        got = per_token_gradient_weights(mask, loss_type, max_completion_length=4)
        torch.testing.assert_close(got, torch.tensor(weights), atol=1e-7, rtol=0)


def test_dynamic_sampling_mask_keeps_groups_with_signal():
    assert dynamic_sampling_mask(FOUR_GROUPS).tolist() == [True, False, False, True]
    with pytest.raises(AssertionError):
        dynamic_sampling_mask(FOUR_GROUPS.flatten())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_filtering_zero_std_groups_only_rescales_the_gradient(loss_type):
    """beta = 0: dropped groups have A = 0, so the kept rows' gradient is the full one times
    N / n_kept (grpo: mean over completions) or tokens / kept tokens (dapo: mean over tokens)."""
    torch.manual_seed(0)
    B, G, T = FOUR_GROUPS.shape[0], FOUR_GROUPS.shape[1], 5
    config = GRPOConfig(num_generations=G, prompts_per_step=B, per_device_train_batch_size=B * G)
    config = config.replace(beta=0.0, loss_type=loss_type)
    advantages = group_relative_advantages(FOUR_GROUPS).flatten()  # (N,)
    lengths = torch.randint(1, T + 1, (B * G,))
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()  # (N, T)
    rows = dynamic_sampling_mask(FOUR_GROUPS).repeat_interleave(G)  # (N,)

    def gradient(logps, adv, m):
        logps = logps.clone().requires_grad_(True)
        loss, _ = grpo_loss(logps, None, None, adv, m, config)
        loss.backward()
        return logps.grad

    logps = torch.randn(B * G, T)
    full = gradient(logps, advantages, mask)
    kept = gradient(logps[rows], advantages[rows], mask[rows])
    assert full[~rows].abs().max() == 0  # zero-advantage groups contribute nothing
    scale = rows.numel() / rows.sum() if loss_type == "grpo" else mask.sum() / mask[rows].sum()
    torch.testing.assert_close(kept, full[rows] * scale, atol=1e-6, rtol=1e-5)


def _rollout(N=4, P=3, T=2, with_logps=True):
    logps = torch.arange(N * T, dtype=torch.float32).view(N, T) if with_logps else None
    return Rollout(
        prompt_ids=torch.arange(N * P).view(N, P),
        prompt_mask=torch.ones(N, P, dtype=torch.long),
        completion_ids=torch.arange(N * T).view(N, T),
        completion_mask=torch.ones(N, T, dtype=torch.long),
        is_truncated=torch.tensor([False, True, False, True])[:N],
        completions=[f"c{i}" for i in range(N)],
        old_per_token_logps=logps,
        ref_per_token_logps=None,
    )


def test_select_completions_keeps_the_chosen_rows_in_order():
    rows = torch.tensor([False, True, False, True])
    picked = select_completions(_rollout(), rows)
    assert picked.completions == ["c1", "c3"]
    assert picked.prompt_ids.tolist() == [[3, 4, 5], [9, 10, 11]]
    assert picked.completion_ids.tolist() == [[2, 3], [6, 7]]
    assert picked.old_per_token_logps.tolist() == [[2.0, 3.0], [6.0, 7.0]]
    assert picked.ref_per_token_logps is None
    assert picked.is_truncated.tolist() == [True, True]
    with pytest.raises(AssertionError):
        select_completions(_rollout(), torch.tensor([0, 1, 0, 1]))


def test_number_anywhere_reward_can_be_gamed():
    completions = ["<answer>19</answer>", "<answer>18 19 20</answer>", "<answer>18</answer>", "119", "-19"]
    assert number_anywhere_reward(None, completions, answer=["19"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]
    # the honest reward pays only the first: the last number in the tag must be right
    assert correctness_reward(None, completions[:3], answer=["19"] * 3) == [1.0, 0.0, 0.0]


def test_at_least_reward_pays_any_answer_that_is_too_big():
    completions = ["<answer>19</answer>", "<answer>99</answer>", "<answer>18</answer>", "no number"]
    assert at_least_reward(None, completions, answer=["19"] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_length_bonus_is_the_fraction_of_the_budget_used():
    bonus = make_length_bonus(4)
    assert bonus.__name__ == "length_bonus"
    assert bonus(None, ["a", "b", "c"], [[1], [1, 2, 3, 4], [1, 2, 3, 4, 5]]) == [0.25, 1.0, 1.0]
    with pytest.raises(ValueError):
        make_length_bonus(0)


def test_simulate_disconnect_raises_on_the_chosen_call_only():
    reward = simulate_disconnect(correctness_reward, on_call=2)
    assert reward.__name__ == "correctness_reward"
    assert reward(None, ["<answer>3</answer>"], answer=["3"]) == [1.0]
    with pytest.raises(KeyboardInterrupt, match="call 2"):
        reward(None, ["<answer>3</answer>"], answer=["3"])
    assert reward(None, ["<answer>4</answer>"], answer=["3"]) == [0.0]
    with pytest.raises(ValueError):
        simulate_disconnect(correctness_reward, on_call=0)


def test_summarize_run_averages_the_last_steps():
    history = [{"step": s, "reward": float(s)} for s in range(1, 7)]
    history[2]["eval/accuracy"] = 0.25
    history[5]["eval/accuracy"] = 0.5
    summary = summarize_run(history, last=3)
    assert summary == {"reward": 5.0, "eval/accuracy": 0.5}
    with pytest.raises(ValueError):
        summarize_run([])


def test_variant_configs_change_only_their_fields():
    base = GRPOConfig.tiny_cpu()
    assert config_diff(variant_config("GRPO", base), base) == {}
    assert config_diff(variant_config("Dr. GRPO", base), base) == {"scale_rewards": "none", "loss_type": "dr_grpo"}
    dapo = variant_config("DAPO", base)
    assert (dapo.loss_type, dapo.clip_epsilon_high, dapo.mask_truncated_completions, dapo.beta) == (
        "dapo",
        0.28,
        True,
        0.0,
    )
    assert variant_config("GSPO", base).importance_sampling_level == "sequence"
    assert variant_config("RLOO", base).baseline == "rloo"
    assert [name for name, v in VARIANTS.items() if v.dynamic_sampling] == ["DAPO"]
    with pytest.raises(ValueError, match="unknown variant"):
        variant_config("PPO", base)


def test_completion_table_marks_right_answers():
    table = completion_table(["1 + 1", "2 + 2"], ["2", "4"], ["<answer>2</answer>", "5"], ["<answer>2</answer>", "4"])
    assert list(table.columns) == ["question", "answer", "before", "ok before", "after", "ok after"]
    assert table["ok before"].tolist() == [True, False]
    assert table["ok after"].tolist() == [True, True]


def test_plot_variant_comparison_draws_one_line_per_run():
    histories = {"a": [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}], "b": [{"step": 1, "reward": 0.3}]}
    fig = plot_variant_comparison(histories, ["reward", "kl"], title="t")
    reward_ax, kl_ax = fig.axes
    assert [line.get_label() for line in reward_ax.lines] == ["a", "b"]
    assert reward_ax.lines[0].get_ydata().tolist() == [0.1, 0.2]
    assert len(kl_ax.lines) == 0  # no run logged kl: an empty panel, not an error


def test_dynamic_sampling_trainer_needs_one_micro_batch(tiny, train_dataset, small_config):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="per_device_train_batch_size = N = 16"):
        DynamicSamplingGRPOTrainer(model, tokenizer, [correctness_reward], train_dataset, small_config)


def test_dynamic_sampling_trainer_skips_steps_without_signal(tiny, train_dataset, small_config):
    """A constant reward: every group is dropped, nothing is learned, no NaN."""
    model, tokenizer = tiny
    config = small_config.replace(per_device_train_batch_size=16, beta=0.0, max_steps=2, save_steps=0)
    before = [p.detach().clone() for p in model.parameters()]
    constant = lambda prompts, completions, **kw: [1.0] * len(completions)
    history = DynamicSamplingGRPOTrainer(model, tokenizer, [constant], train_dataset, config).train()
    assert [m["dynamic_sampling/kept_fraction"] for m in history] == [0.0, 0.0]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_train_short_run_with_dynamic_sampling_learns(train_dataset, eval_dataset, small_config):
    config = small_config.replace(per_device_train_batch_size=16, beta=0.0, max_steps=2, save_steps=0, eval_steps=2)
    trainer = train_short_run(
        config, [correctness_reward], train_dataset=train_dataset, eval_dataset=eval_dataset, dynamic_sampling=True
    )
    assert isinstance(trainer, DynamicSamplingGRPOTrainer)
    assert [m["step"] for m in trainer.history] == [1, 2]
    assert all(0.0 <= m["dynamic_sampling/kept_fraction"] <= 1.0 for m in trainer.history)
    assert 0.0 <= trainer.history[-1]["eval/accuracy"] <= 1.0


def test_interrupted_run_resumes_to_the_same_weights(tiny, train_dataset, small_config):
    """The lesson-06 demo: a disconnect in step 3, a fresh process resumes, the weights match an uninterrupted run."""
    model, tokenizer = tiny
    config = small_config.replace(max_steps=4, save_steps=0)
    GRPOTrainer(model, tokenizer, [correctness_reward], train_dataset, config).train()
    reference = [p.detach().clone() for p in model.parameters()]

    from minigrpo import load_model_and_tokenizer

    broken, tok = load_model_and_tokenizer("tiny", device="cpu")
    interrupted = config.replace(output_dir=config.output_dir + "-interrupted")
    trainer = GRPOTrainer(broken, tok, [simulate_disconnect(correctness_reward, 3)], train_dataset, interrupted)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.step == 2
    fresh, tok = load_model_and_tokenizer("tiny", device="cpu")
    resumed = GRPOTrainer(fresh, tok, [correctness_reward], train_dataset, interrupted)
    history = resumed.train(resume_from_checkpoint=True)
    assert [m["step"] for m in history] == [1, 2, 3, 4]
    assert all(torch.equal(a, b) for a, b in zip(reference, fresh.parameters(), strict=True))

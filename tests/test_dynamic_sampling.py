"""DAPO's dynamic sampling: the filter, the refill loop, rollouts cut and joined across rounds, the trainer."""

import pytest
import torch

from minigrpo import GRPOConfig, GRPOTrainer, group_relative_advantages, grpo_loss
from minigrpo.dynamic_sampling import fill_batch, informative_groups, kept_rows
from minigrpo.rollout import Rollout
from minigrpo.run.schedule import PromptSampler

# the worked example, all right, all wrong, one lucky success (G = 8)
FOUR_GROUPS = torch.tensor([[2.0, 1, 0, 2, 0, 1, 0, 1], [2.0] * 8, [0.0] * 8, [1.0] * 7 + [2.0]])


def scripted_rounds(*rounds):
    """generate_round for fill_batch that returns the given (B, G) rewards in turn, and counts its calls."""
    calls = []

    def generate_round():
        calls.append(len(calls))
        return torch.as_tensor(rounds[len(calls) - 1], dtype=torch.float32)

    return generate_round, calls


# --- the filter -----------------------------------------------------------------------
def test_informative_groups_drops_only_all_equal_groups():
    assert informative_groups(FOUR_GROUPS).tolist() == [True, False, False, True]
    # G = 2: a pair is informative exactly when its two rewards differ
    assert informative_groups(torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, -0.5]])).tolist() == [
        False,
        True,
        False,
        True,
    ]
    # two equal rewards among G = 3 do not make a group constant
    assert informative_groups(torch.tensor([[1.0, 1.0, 0.0]])).tolist() == [True]
    with pytest.raises(AssertionError):
        informative_groups(FOUR_GROUPS.flatten())


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
    rows = informative_groups(FOUR_GROUPS).repeat_interleave(G)  # (N,)

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


# --- the refill loop ------------------------------------------------------------------
def test_fill_batch_refills_then_keeps_exactly_the_wanted_number():
    generate, calls = scripted_rounds(
        FOUR_GROUPS,  # groups 0 and 3 carry signal
        [[0.0] * 8, [1.0] + [0.0] * 7, [0.0, 1] * 4, [1.0] * 8],  # groups 1 and 2 do
        [[0.0, 1] * 4] * 4,  # never generated: the batch is full after two rounds
    )
    kept, rounds = fill_batch(generate, num_groups_wanted=3, max_rounds=10)
    assert kept == [(0, 0), (0, 3), (1, 1)]  # the first three in the order generated; (1, 2) is the extra one
    assert rounds == 2 and len(calls) == 2


def test_fill_batch_stops_at_max_rounds_with_what_it_kept():
    generate, calls = scripted_rounds(*[FOUR_GROUPS] * 5)
    kept, rounds = fill_batch(generate, num_groups_wanted=4, max_rounds=1)
    assert kept == [(0, 0), (0, 3)] and rounds == 1 and len(calls) == 1
    generate, calls = scripted_rounds(*[FOUR_GROUPS] * 5)
    kept, rounds = fill_batch(generate, num_groups_wanted=4, max_rounds=2)
    assert kept == [(0, 0), (0, 3), (1, 0), (1, 3)] and rounds == 2


def test_fill_batch_with_only_constant_groups_keeps_nothing():
    generate, calls = scripted_rounds(*[[[1.0, 1.0], [0.0, 0.0]]] * 3)  # G = 2, every pair equal
    assert fill_batch(generate, num_groups_wanted=2, max_rounds=3) == ([], 3)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="max_rounds=0"):
        fill_batch(generate, num_groups_wanted=2, max_rounds=0)


def test_fill_batch_one_round_enough_for_g_2():
    generate, calls = scripted_rounds([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    assert fill_batch(generate, num_groups_wanted=2, max_rounds=5) == ([(0, 0), (0, 2)], 1)


def test_kept_rows_are_the_kept_groups_rows_in_the_rounds_joined():
    # rounds of B = 3 groups of G = 2: round 0's group 1 is rows 2-3, round 1's groups 0 and 2 are rows 6-7, 10-11
    rows = kept_rows([(0, 1), (1, 0), (1, 2)], num_groups=3, num_generations=2)
    assert rows.dtype == torch.long and rows.tolist() == [2, 3, 6, 7, 10, 11]
    assert kept_rows([], num_groups=2, num_generations=2).tolist() == []  # no group kept: no row


# --- the kept rows of a rollout, rollouts of several rounds as one --------------------
def _rollout(n, P, T, start, with_ref=True):
    prompt_mask = torch.ones(n, P, dtype=torch.long)
    prompt_mask[0, 0] = 0  # the first prompt is left-padded
    return Rollout(
        prompt_ids=torch.arange(n * P).view(n, P) + start,
        prompt_mask=prompt_mask,
        completion_ids=torch.arange(n * T).view(n, T) + start,
        completion_mask=torch.ones(n, T, dtype=torch.long),
        is_truncated=torch.tensor([True] + [False] * (n - 1)),
        completions=[f"{start}-{i}" for i in range(n)],
        ref_per_token_logps=torch.full((n, T), -1.0) if with_ref else None,
    )


def test_concat_rollouts_pads_prompts_left_and_completions_right():
    joined = Rollout.concat([_rollout(2, 2, 3, 100), _rollout(1, 3, 1, 200)], pad_token_id=7)
    assert joined.prompt_ids.tolist() == [[7, 100, 101], [7, 102, 103], [200, 201, 202]]
    assert joined.prompt_mask.tolist() == [[0, 0, 1], [0, 1, 1], [0, 1, 1]]
    assert joined.completion_ids.tolist() == [[100, 101, 102], [103, 104, 105], [200, 7, 7]]
    assert joined.completion_mask.tolist() == [[1, 1, 1], [1, 1, 1], [1, 0, 0]]
    assert joined.ref_per_token_logps.tolist() == [[-1.0] * 3, [-1.0] * 3, [-1.0, 0.0, 0.0]]
    assert joined.old_per_token_logps is None
    assert joined.is_truncated.tolist() == [True, False, True]
    assert joined.completions == ["100-0", "100-1", "200-0"]
    assert joined.completion_id_lists() == [[100, 101, 102], [103, 104, 105], [200]]


def _four_rows(N=4, P=3, T=2, with_logps=True):
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


def test_select_keeps_the_chosen_rows_in_order():
    picked = _four_rows().select(torch.tensor([1, 3]))
    assert picked.completions == ["c1", "c3"]
    assert picked.prompt_ids.tolist() == [[3, 4, 5], [9, 10, 11]]
    assert picked.completion_ids.tolist() == [[2, 3], [6, 7]]
    assert picked.old_per_token_logps.tolist() == [[2.0, 3.0], [6.0, 7.0]]
    assert picked.ref_per_token_logps is None
    assert picked.is_truncated.tolist() == [True, True]


# --- the config -----------------------------------------------------------------------
def test_config_checks_for_dynamic_sampling():
    config = GRPOConfig.tiny_cpu(dynamic_sampling=True)  # one micro-batch of N = 128
    assert config.max_num_gen_batches == 10
    assert GRPOConfig.qwen_t4(dynamic_sampling=True).per_device_train_batch_size == 8  # 8 divides G = 8
    with pytest.raises(ValueError, match="max_num_gen_batches=0: give at least 1"):
        GRPOConfig(max_num_gen_batches=0)
    with pytest.raises(ValueError, match="divisor of num_generations=4, or to N = 16"):
        GRPOConfig(prompts_per_step=4, num_generations=4, per_device_train_batch_size=8, dynamic_sampling=True)
    with pytest.raises(ValueError, match="steps_per_generation=4 != gradient_accumulation_steps=1"):
        GRPOConfig(
            prompts_per_step=4,
            num_generations=4,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            dynamic_sampling=True,
        )


# --- the trainer ----------------------------------------------------------------------
def even_answers_vary(prompts, completions, completion_ids, answer, **kwargs):
    """Rewards 0, 1, 0, 1, ... across a group whose answer is even (G even), all 1 when it is odd: exactly the
    groups of even answers carry signal, whatever the model writes."""
    return [float(i % 2) if int(a) % 2 == 0 else 1.0 for i, a in enumerate(answer)]


class RecordingTrainer(GRPOTrainer):
    """GRPOTrainer that records how many completions each update was given."""

    def update(self, rollout, rewards):
        self.trained_rows = getattr(self, "trained_rows", []) + [len(rewards)]
        return super().update(rollout, rewards)


def expected_rounds(dataset, config, steps):
    """Replay the prompt order: per step, rounds of B prompts until B even answers (or the rounds run out)."""
    sampler = PromptSampler(len(dataset), config.seed, config.shuffle_dataset)
    B, plan = config.prompts_per_step, []
    for _ in range(steps):
        even = rounds = 0
        while even < B and rounds < config.max_num_gen_batches:
            even += sum(int(dataset[i]["answer"]) % 2 == 0 for i in sampler.next_indices(B))
            rounds += 1
        plan.append((rounds, min(even, B), even))
    return plan


@pytest.fixture
def refill_config(small_config):
    # rewards here do not depend on what is written: 8 tokens are enough, and cheap
    return small_config.replace(
        per_device_train_batch_size=4,
        beta=0.0,
        max_steps=1,
        save_steps=0,
        max_completion_length=8,
        dynamic_sampling=True,
    )


def _sampler_after(dataset, config, plan):
    sampler = PromptSampler(len(dataset), config.seed, config.shuffle_dataset)
    for rounds, _, _ in plan:
        for _ in range(rounds):
            sampler.next_indices(config.prompts_per_step)
    return sampler.state_dict()


def test_trainer_trains_on_what_was_kept_when_rounds_run_out(tiny, train_dataset, refill_config):
    model, tokenizer = tiny
    config = refill_config.replace(max_num_gen_batches=1)
    trainer = RecordingTrainer(model, [even_answers_vary], config, train_dataset, processing_class=tokenizer)
    trainer.train()
    history = trainer.state.log_history
    plan = expected_rounds(train_dataset, config, steps=1)
    assert [m["dynamic_sampling/groups_kept"] for m in history] == [kept for _, kept, _ in plan]
    assert any(kept < config.prompts_per_step for _, kept, _ in plan), plan  # the rounds ran out
    assert trainer.trained_rows == [kept * config.num_generations for _, kept, _ in plan if kept]
    assert all(m["dynamic_sampling/rounds"] == 1 for m in history)

    before = [p.detach().clone() for p in model.parameters()]
    constant = lambda prompts, completions, **kw: [1.0] * len(completions)  # noqa: E731
    constant_config = config.replace(overwrite_output_dir=True)
    trained = GRPOTrainer(model, [constant], constant_config, train_dataset, processing_class=tokenizer)
    trained.train()
    history = trained.state.log_history
    assert [(m["dynamic_sampling/groups_kept"], m["grad_norm"]) for m in history] == [(0, 0.0)]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_trainer_refills_to_exactly_b_groups_logs_the_cost_and_resumes_exactly(
    tiny, train_dataset, refill_config, tmp_path
):
    model, tokenizer = tiny
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    config = refill_config.replace(max_steps=2, save_steps=1)
    straight = RecordingTrainer(model, [even_answers_vary], config, train_dataset, processing_class=tokenizer)
    straight.train()
    history = straight.state.log_history
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    plan = expected_rounds(train_dataset, config, steps=2)
    B, G = config.prompts_per_step, config.num_generations
    assert [(m["dynamic_sampling/rounds"], m["dynamic_sampling/groups_kept"]) for m in history] == [
        (rounds, kept) for rounds, kept, _ in plan
    ]
    assert any(rounds > 1 for rounds, _, _ in plan), plan  # the test exercises a refill
    assert any(even > B for _, _, even in plan), plan  # and a truncation
    assert straight.trained_rows == [B * G] * 2
    for m, (rounds, kept, even) in zip(history, plan, strict=True):
        assert m["dynamic_sampling/groups_generated"] == rounds * B
        assert m["dynamic_sampling/kept_fraction"] == kept / (rounds * B)
        assert m["dynamic_sampling/kept_reward"] == 0.5  # kept groups are the 0, 1, 0, 1 ones
        # reward is over every generated group: the constant ones (odd answers, all 1) included
        assert m["reward"] == pytest.approx((even * 0.5 + rounds * B - even) / (rounds * B), abs=1e-6)
    assert straight.sampler.state_dict() == _sampler_after(train_dataset, config, plan)

    # Refill rounds draw extra prompts: the sampler and RNG state in the checkpoint still give the same run.
    model.load_state_dict(initial)
    first_half = config.replace(output_dir=str(tmp_path / "halves"), max_steps=1)
    GRPOTrainer(model, [even_answers_vary], first_half, train_dataset, processing_class=tokenizer).train()
    model.load_state_dict(initial)  # a fresh start: the weights must come from the checkpoint
    resumed = GRPOTrainer(
        model, [even_answers_vary], first_half.replace(max_steps=2), train_dataset, processing_class=tokenizer
    )
    resumed.train(resume_from_checkpoint=True)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name], atol=0, rtol=0, msg=name)
    assert resumed.sampler.state_dict() == straight.sampler.state_dict()


def test_trainers_without_the_refill_refuse_it(tiny, train_dataset, refill_config, monkeypatch):
    model, tokenizer = tiny

    class NoRefill(GRPOTrainer):
        supports_dynamic_sampling = False

    with pytest.raises(ValueError, match="NoRefill does not implement DAPO's dynamic sampling"):
        NoRefill(model, [even_answers_vary], refill_config, train_dataset, processing_class=tokenizer)
    monkeypatch.setattr("minigrpo.trainer.distributed.is_distributed", lambda: True)
    monkeypatch.setattr("minigrpo.trainer.distributed.check_config", lambda config: None)
    monkeypatch.setattr("minigrpo.trainer.distributed.check_same_config", lambda config: None)
    with pytest.raises(NotImplementedError, match="does not run under torchrun"):
        GRPOTrainer(model, [even_answers_vary], refill_config, train_dataset, processing_class=tokenizer)


def test_what_reward_functions_log_survives_the_refill(tiny, train_dataset, refill_config):
    model, tokenizer = tiny

    def logging_reward(prompts, completions, completion_ids, log_metric, **columns):
        log_metric("calls", 1.0)
        return even_answers_vary(prompts, completions, completion_ids, **columns)

    logging_reward.__name__ = "even_answers_vary"
    trainer = GRPOTrainer(model, [logging_reward], refill_config, train_dataset, processing_class=tokenizer)
    trainer.train()
    assert all(row["calls"] == 1.0 for row in trainer.state.log_history)  # log_metric's mean over every round

"""Stage 1: group sampling, padding, EOS masks, old and reference log-probs."""

import pytest
import torch
import transformers
from transformers import (
    GenerationConfig,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minigrpo.config import GRPOConfig
from minigrpo.models import make_reference_model
from minigrpo.rollout import (
    GroupSeededSampling,
    RepetitionPenalty,
    completion_mask_from_eos,
    eos_token_ids,
    generate_completions,
    generation_config_for,
    repeat_for_group,
    sample_group_rollout,
    tokenize_prompts,
)


def test_repeat_is_group_major():
    assert repeat_for_group(["a", "b"], 3) == ["a", "a", "a", "b", "b", "b"]


def test_mask_stops_at_first_eos_and_keeps_it():
    ids = torch.tensor([[5, 6, 2, 0, 0], [2, 0, 0, 0, 0], [5, 6, 7, 8, 9], [5, 2, 6, 2, 0]])
    mask, truncated = completion_mask_from_eos(ids, eos_ids=[2, 0])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert truncated.tolist() == [False, False, True, False]  # only the one without EOS


def test_prompts_are_left_padded(tiny):
    model, tokenizer = tiny
    ids, mask = tokenize_prompts(tokenizer, ["12", "12345"], 32, "cpu")
    assert mask.tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 1, 1]]
    assert ids[0, :3].tolist() == [tokenizer.pad_token_id] * 3


def test_too_long_prompt_is_a_clear_error(tiny):
    _, tokenizer = tiny
    try:
        tokenize_prompts(tokenizer, ["x" * 40], 10, "cpu")
    except ValueError as error:
        assert "max_prompt_length=10" in str(error) and "at least 40" in str(error)
    else:
        raise AssertionError("expected a ValueError")


def test_sampling_ignores_the_models_own_top_k_and_penalties(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(num_generations=2, max_completion_length=12)
    ids, mask = group_prompts(tokenizer, train_dataset, config)
    before = generate_completions(model, tokenizer, ids, mask, config, num_generations=2, group_seeds=[1, 2])
    model.generation_config.update(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
    generation = generation_config_for(GRPOConfig(), model, tokenizer)
    # GroupSeededSampling samples: generate itself decodes greedily and applies no penalty
    assert not generation.do_sample and generation.repetition_penalty == 1.0
    after = generate_completions(model, tokenizer, ids, mask, config, num_generations=2, group_seeds=[1, 2])
    assert torch.equal(before, after)  # Qwen-style defaults on the model change nothing


def test_rollout_shapes_masks_and_logps(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(prompts_per_step=3, num_generations=4, per_device_train_batch_size=4, num_iterations=2)
    torch.manual_seed(0)
    rollout = sample_group_rollout(model, tokenizer, train_dataset["prompt"][:3], config, make_reference_model(model))
    N, T = 12, rollout.completion_ids.shape[1]
    assert rollout.prompt_ids.shape[0] == N and T <= config.max_completion_length
    assert len(rollout.completions) == N
    # group-major: rows 0-3 share prompt 0
    assert (rollout.prompt_ids[0] == rollout.prompt_ids[3]).all()
    assert not (rollout.prompt_ids[3] == rollout.prompt_ids[4]).all()
    # with no update yet, old == reference == current policy
    assert rollout.old_per_token_logps.shape == rollout.ref_per_token_logps.shape == (N, T)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.old_per_token_logps[mask], rollout.ref_per_token_logps[mask], atol=1e-5, rtol=0)
    # decoded text is the masked tokens only
    ids = rollout.completion_id_lists()
    assert [len(i) for i in ids] == rollout.completion_mask.sum(1).tolist()


def test_no_extra_forward_passes_when_on_policy_and_beta_zero(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(prompts_per_step=2, num_generations=2, per_device_train_batch_size=4, beta=0.0)
    rollout = sample_group_rollout(model, tokenizer, train_dataset["prompt"][:2], config)
    assert rollout.old_per_token_logps is None and rollout.ref_per_token_logps is None


def test_completions_that_hit_max_length_are_truncated(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(
        prompts_per_step=2, num_generations=2, per_device_train_batch_size=4, max_completion_length=3, beta=0.0
    )
    rollout = sample_group_rollout(model, tokenizer, train_dataset["prompt"][:2], config)
    assert rollout.completion_ids.shape[1] == 3
    assert rollout.is_truncated.all()  # "<answer>..." cannot end in 3 characters
    assert (rollout.completion_mask == 1).all()


# --- one sampling path: GroupSeededSampling applies every sampling option ------------------------
def group_prompts(tokenizer, dataset, config, num_prompts: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, P) left-padded ids and mask of the first `num_prompts` prompts, each G times."""
    prompts = repeat_for_group(list(dataset["prompt"][:num_prompts]), config.num_generations)
    return tokenize_prompts(tokenizer, prompts, config.max_prompt_length, "cpu")


def sampled(model, tokenizer, ids, mask, config, seeds=(1, 2)) -> torch.Tensor:
    return generate_completions(
        model, tokenizer, ids, mask, config, num_generations=config.num_generations, group_seeds=list(seeds)
    )  # (N, T)


def test_processor_warps_like_transformers_generate_with_every_option_on(tiny):
    model, tokenizer = tiny
    options = dict(repetition_penalty=1.3, temperature=0.7, top_k=50, top_p=0.9, min_p=0.05)
    config = GRPOConfig.tiny_cpu(num_generations=2, **options)
    generator = torch.Generator().manual_seed(0)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])  # (N, P)
    input_ids = torch.randint(0, 250, (4, 9), generator=generator)  # (N, P + 4 generated)
    input_ids[:, :5][prompt_mask == 0] = tokenizer.pad_token_id
    scores = torch.randn(4, model.config.vocab_size, generator=generator)  # (N, V)
    sampler = GroupSeededSampling(config, prompt_mask, group_seeds=[1, 2], num_generations=2)
    warped = sampler.warp(input_ids, scores.clone())  # (N, V)

    # transformers' own processors, in the order its sampling applies them
    left_padding = torch.tensor([2, 1, 0, 3])
    expected = RepetitionPenalty(1.3, left_padding)(input_ids, scores.clone())
    for step in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)):
        expected = step(input_ids, expected)
    assert torch.equal(warped, expected)
    assert 1 < torch.isfinite(warped).sum(1).max() < 50  # the filters really cut: the test is not vacuous
    if not repetition_penalty_skips_left_padding_in_transformers():
        pytest.skip(f"transformers {transformers.__version__} counts left padding as seen: generate differs there")
    # and the list generate builds itself from the same options (the order is transformers', not ours)
    generation = GenerationConfig(do_sample=True, **options)
    built = model._get_logits_processor(generation, 5, model_kwargs={"attention_mask": prompt_mask})  # P = 5
    assert torch.equal(warped, built(input_ids, scores.clone()))


def repetition_penalty_skips_left_padding_in_transformers() -> bool:
    """transformers 5's processor takes each row's padding length (a tensor); 4.x takes one int for all rows."""
    try:
        RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=torch.tensor([1, 0]))
    except ValueError:
        return False
    return True


def test_repetition_penalty_hand_values_and_transformers_processor():
    # row 0: two positions of padding (id 7, not counted), then tokens 1 and 3; row 1: no padding, tokens 7, 7, 2, 0
    input_ids = torch.tensor([[7, 7, 1, 3], [7, 7, 2, 0]])  # (N, L)
    scores = torch.tensor([[2.0, 4.0, -2.0, -4.0, 1.0, 0.0, 3.0, 6.0], [2.0, 4.0, -2.0, -4.0, 1.0, 0.0, 3.0, 6.0]])
    penalized = RepetitionPenalty(2.0, torch.tensor([2, 0]))(input_ids, scores.clone())
    assert penalized[0].tolist() == [2.0, 2.0, -2.0, -8.0, 1.0, 0.0, 3.0, 6.0]  # 1: 4 / 2; 3: -4 * 2; padding 7 kept
    assert penalized[1].tolist() == [1.0, 4.0, -4.0, -4.0, 1.0, 0.0, 3.0, 3.0]  # 7 counted once, though seen twice
    if repetition_penalty_skips_left_padding_in_transformers():
        processor = RepetitionPenaltyLogitsProcessor(2.0, prompt_ignore_length=torch.tensor([2, 0]))
        assert torch.equal(penalized, processor(input_ids, scores.clone()))


def test_repetition_penalty_rules_out_seen_tokens_but_not_the_left_padding(tiny):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(num_generations=2, repetition_penalty=1e6)
    prompt_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])  # (N, P)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad, pad, 10, 11, 12], [20, 21, 22, 23, 24]])  # (N, P + 1)
    sampler = GroupSeededSampling(config, prompt_mask, group_seeds=[0], num_generations=2)
    scores = torch.full((2, model.config.vocab_size), 1000.0)  # (N, V): every token equally likely before the penalty
    warped = sampler.warp(input_ids, scores)
    assert warped[0, pad] == 1000.0  # left padding is not text the model has seen
    assert (warped[0, [10, 11, 12]] < 1).all() and (warped[1, 20:25] < 1).all()
    for _ in range(20):  # exp(-999) is exactly 0 in float32: a seen token can never be drawn
        tokens = sampler(input_ids, scores).argmax(dim=1)  # (N,)
        assert tokens[0] not in (10, 11, 12) and not 20 <= tokens[1] < 25


def test_repetition_penalty_is_applied_once_as_in_transformers_greedy_decoding(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(num_generations=2, max_completion_length=12, top_k=1, repetition_penalty=1e6)
    ids, mask = group_prompts(tokenizer, train_dataset, config, num_prompts=1)  # no left padding: see RepetitionPenalty
    penalized = sampled(model, tokenizer, ids, mask, config, seeds=(1,))
    # greedy=True lets transformers apply the penalty itself; top_k=1 makes our sampling greedy too
    assert generation_config_for(config, model, tokenizer, greedy=True).repetition_penalty == 1e6
    assert torch.equal(penalized, generate_completions(model, tokenizer, ids, mask, config, greedy=True))
    unpenalized = sampled(model, tokenizer, ids, mask, config.replace(repetition_penalty=1.0), seeds=(1,))
    assert penalized.shape != unpenalized.shape or not torch.equal(penalized, unpenalized)
    # and when sampling, the same seeds give other completions with the penalty on
    with_penalty = sampled(model, tokenizer, ids, mask, config.replace(top_k=0), seeds=(1,))
    without = sampled(model, tokenizer, ids, mask, config.replace(top_k=0, repetition_penalty=1.0), seeds=(1,))
    assert with_penalty.shape != without.shape or not torch.equal(with_penalty, without)


def test_options_that_keep_only_the_top_token_give_the_greedy_completions(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(num_generations=2, max_completion_length=12)
    ids, mask = group_prompts(tokenizer, train_dataset, config)
    greedy = generate_completions(model, tokenizer, ids, mask, config, greedy=True)
    plain = sampled(model, tokenizer, ids, mask, config)
    assert plain.shape != greedy.shape or not torch.equal(plain, greedy)  # without them it does sample
    for option in (dict(top_k=1), dict(min_p=1.0), dict(top_p=1e-6), dict(temperature=1e-4)):
        assert torch.equal(sampled(model, tokenizer, ids, mask, config.replace(**option)), greedy), option


def test_a_groups_completions_depend_on_its_seed_alone_with_every_option_on(tiny, train_dataset):
    model, tokenizer = tiny
    options = dict(repetition_penalty=1.2, temperature=0.9, top_k=40, top_p=0.95, min_p=0.02)
    config = GRPOConfig.tiny_cpu(num_generations=2, max_completion_length=12, **options)
    ids, mask = group_prompts(tokenizer, train_dataset, config, num_prompts=3)  # (6, P)
    eos = eos_token_ids(model, tokenizer)

    def token_lists(completion_ids):  # without padding: the calls pad to different lengths
        completion_mask, _ = completion_mask_from_eos(completion_ids, eos)
        return [row[m.bool()].tolist() for row, m in zip(completion_ids, completion_mask, strict=True)]

    together = token_lists(sampled(model, tokenizer, ids, mask, config, seeds=(5, 6, 7)))
    first_ids, first_mask = group_prompts(tokenizer, train_dataset, config, num_prompts=1)
    alone = token_lists(sampled(model, tokenizer, first_ids, first_mask, config, seeds=(5,)))
    rest = token_lists(sampled(model, tokenizer, ids[2:], mask[2:], config, seeds=(6, 7)))
    assert alone + rest == together


def test_without_seeds_torch_manual_seed_reproduces_the_sampling(tiny, train_dataset):
    model, tokenizer = tiny
    config = GRPOConfig.tiny_cpu(num_generations=2, max_completion_length=12)
    ids, mask = group_prompts(tokenizer, train_dataset, config)

    def sample(seed):
        torch.manual_seed(seed)
        return generate_completions(model, tokenizer, ids, mask, config, num_generations=2)

    first = sample(0)
    assert torch.equal(first, sample(0))
    assert len({tuple(row.tolist()) for row in first}) > 1  # it samples: the completions are not all alike


@pytest.mark.parametrize("block_elements", [2**22, 3 * 6 * 11])  # every step's noise in one block; 3 steps a block
def test_the_draw_gives_the_tokens_torch_multinomial_gives_from_the_same_seeds(monkeypatch, block_elements):
    monkeypatch.setattr(GroupSeededSampling, "NOISE_BLOCK_ELEMENTS", block_elements)
    config = GRPOConfig.tiny_cpu(num_generations=2)
    seeds, steps = [3, 4, 5], 10
    sampler = GroupSeededSampling(config, torch.ones(6, 4, dtype=torch.long), seeds, num_generations=2)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    scores = torch.randn(steps, 6, 11, generator=torch.Generator().manual_seed(0))  # (steps, N, V)
    for t in range(steps):
        drawn = sampler(torch.zeros(6, 4 + t, dtype=torch.long), scores[t].clone())  # (N, V): 0 at the token
        assert (torch.isfinite(drawn).sum(dim=1) == 1).all()
        probs = scores[t].softmax(dim=-1).view(3, 2, 11)  # (B, G, V)
        expected = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators, strict=True)])
        assert torch.equal(drawn.argmax(dim=1, keepdim=True), expected), t


def test_the_draw_follows_the_softmax():
    config = GRPOConfig.tiny_cpu(num_generations=20_000)
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    sampler = GroupSeededSampling(config, torch.ones(20_000, 1, dtype=torch.long), [0], num_generations=20_000)
    tokens = sampler(torch.zeros(20_000, 1, dtype=torch.long), probs.log().expand(20_000, 4)).argmax(dim=1)
    frequencies = torch.bincount(tokens, minlength=4) / 20_000
    assert frequencies[3] == 0  # probability 0 is never drawn
    assert torch.allclose(frequencies[:3], probs[:3], atol=0.015)  # 4.5 standard errors of the largest

"""A sampler that is not the trainer: TRL's importance-sampling correction (vllm_importance_sampling_*), by hand, on
its edge cases, against a transcription of TRL's lines (pinned to TRL's source), and through TRL's own _compute_loss."""

import hashlib
import importlib.util
import inspect
import math
import textwrap
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from minigrpo.config import GRPOConfig
from minigrpo.logprobs import completion_logps
from minigrpo.losses import grpo_loss, sampler_importance_weights
from minigrpo.rollout import Rollout, with_sampler_logps
from minigrpo.tasks.arithmetic import correctness_reward
from minigrpo.trainer import GRPOTrainer

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
HAS_TRL = importlib.util.find_spec("trl") is not None
needs_trl = pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (the bench extra)")

# two completions: lengths 3 and 1 (the second's last tokens are padding, with garbage log-probs)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
LOG_W = torch.tensor([[math.log(2.0), math.log(4.0), math.log(0.25)], [math.log(0.1), 9.0, 9.0]])  # old - sampler
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -1.0]])
OLD = SAMPLER + LOG_W


@pytest.mark.parametrize(
    "mode, clip_min, want",
    [
        # token weights 2, 4, 0.25 | 0.1 (padding 1: its log-weight is masked to 0)
        ("token_truncate", None, [[2.0, 3.0, 0.25], [0.1, 1.0, 1.0]]),
        ("token_truncate", 0.5, [[2.0, 3.0, 0.5], [0.5, 1.0, 1.0]]),
        ("token_mask", None, [[2.0, 0.0, 0.25], [0.1, 1.0, 1.0]]),
        ("token_mask", 0.5, [[2.0, 0.0, 0.0], [0.0, 1.0, 1.0]]),
        # sequence weights: products 2 * 4 * 0.25 = 2 and 0.1
        ("sequence_truncate", None, [[2.0], [0.1]]),
        ("sequence_truncate", 0.5, [[2.0], [0.5]]),
        ("sequence_mask", None, [[2.0], [0.1]]),
        ("sequence_mask", 0.5, [[2.0], [0.0]]),
    ],
)
def test_weights_by_hand(mode, clip_min, want):
    weights = sampler_importance_weights(OLD, SAMPLER, MASK, mode, clip_min, 3.0)
    torch.testing.assert_close(weights, torch.tensor(want))


def test_sequence_weight_is_the_product_and_masks_a_long_drift():
    """Ten tokens each 1.2x likelier under pi_old: 1.2^10 = 6.2 > 3, masked, though no single token passes 3."""
    old, sampler, mask = torch.full((1, 10), math.log(1.2)), torch.zeros(1, 10), torch.ones(1, 10)
    truncated = sampler_importance_weights(old, sampler, mask, "sequence_truncate")
    torch.testing.assert_close(truncated, torch.tensor([[3.0]]))
    assert sampler_importance_weights(old, sampler, mask, "sequence_mask").item() == 0.0
    assert (sampler_importance_weights(old, sampler, mask, "token_mask") == 1.2).all()


@pytest.mark.parametrize("mode", MODES)
def test_same_sampler_gives_weight_one_and_the_uncorrected_loss(mode):
    """A sampler equal to the trainer changes nothing: every weight 1, loss and gradient as without correction,
    for an empty completion too (all-zero mask) and an all-equal group (advantages 0)."""
    torch.manual_seed(0)
    logps = torch.randn(4, 5).log_softmax(-1).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float)
    advantages = torch.tensor([1.0, -1.0, 0.0, 0.0])
    weights = sampler_importance_weights(logps.detach(), logps.detach(), mask, mode)
    assert (weights == 1).all()
    plain = GRPOConfig(beta=0.0, loss_type="grpo")
    corrected = plain.replace(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode)
    loss_a, _ = grpo_loss(logps, None, None, advantages, mask, plain)
    (grad_a,) = torch.autograd.grad(loss_a, logps)
    loss_b, metrics = grpo_loss(logps, None, None, advantages, mask, corrected, sampling_per_token_logps=logps.detach())
    (grad_b,) = torch.autograd.grad(loss_b, logps)
    assert torch.isfinite(loss_b) and metrics["sampling/importance_sampling_ratio/mean"] == 1.0
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)


def test_nan_sampler_logprob_gets_weight_one():
    """A token the sampler could not score (NaN) is not corrected, as in TRL, instead of turning the loss into NaN."""
    sampler = torch.tensor([[float("nan"), 0.0]])
    weights = sampler_importance_weights(torch.tensor([[-1.0, math.log(2.0)]]), sampler, torch.ones(1, 2), "token_mask")
    torch.testing.assert_close(weights, torch.tensor([[1.0, 2.0]]))


def test_grpo_loss_by_hand_with_a_masked_token():
    """G = 2, one token each, A = +1 / -1, ratio 1: loss = -(w_1 * 1 + w_2 * (-1)) / 2; w_2 > 3 is masked to 0."""
    logps = torch.log(torch.tensor([[0.5], [0.5]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.25], [0.1]]))  # weights 2 and 5
    config = GRPOConfig(beta=0.0, loss_type="grpo", vllm_importance_sampling_correction=True,
                        vllm_importance_sampling_mode="token_mask")  # fmt: skip
    loss, metrics = grpo_loss(logps, None, None, torch.tensor([1.0, -1.0]), torch.ones(2, 1), config, None, sampler)
    torch.testing.assert_close(loss, torch.tensor(-(2.0 * 1 + 0.0 * -1) / 2))
    (grad,) = torch.autograd.grad(loss, logps)
    torch.testing.assert_close(grad, torch.tensor([[-1.0], [0.0]]))  # d(-w A rho / 2)/d log pi = -w A / 2
    assert metrics["sampling/importance_sampling_ratio/mean"] == 1.0  # (2 + 0) / 2


def test_correction_off_ignores_sampler_logps():
    logps = torch.zeros(2, 1, requires_grad=True)
    config = GRPOConfig(beta=0.0, loss_type="grpo")
    assert not config.vllm_importance_sampling_correction  # off by default: minigrpo's sampler is its trainer
    loss, metrics = grpo_loss(logps, None, None, torch.tensor([1.0, -1.0]), torch.ones(2, 1), config, None,
                              torch.full((2, 1), -5.0))  # fmt: skip
    assert loss.item() == 0.0 and not any(key.startswith("sampling/") for key in metrics)


def test_config_checks_and_the_deprecated_cap():
    with pytest.raises(ValueError, match="clip_min=3.0 must be below"):
        GRPOConfig(vllm_importance_sampling_clip_min=3.0)
    with pytest.raises(ValueError, match="choose one of"):
        GRPOConfig(vllm_importance_sampling_mode="sequence")
    with pytest.raises(ValueError, match="set clip_max"):
        GRPOConfig(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=None)
    GRPOConfig(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=None)  # mask: no bound
    with pytest.warns(FutureWarning, match="clip_max"):
        assert GRPOConfig(vllm_importance_sampling_cap=2.0).vllm_importance_sampling_clip_max == 2.0


def test_rollout_select_and_concat_carry_sampler_logps():
    def rollout(n, T, sampling):
        return Rollout(
            prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.long),
            completion_ids=torch.ones(n, T, dtype=torch.long), completion_mask=torch.ones(n, T, dtype=torch.long),
            is_truncated=torch.zeros(n, dtype=torch.bool), completions=["x"] * n,
            sampling_per_token_logps=sampling,
        )  # fmt: skip

    a, b = rollout(2, 3, torch.full((2, 3), -1.0)), rollout(1, 2, torch.full((1, 2), -2.0))
    joined = Rollout.concat([a, b], pad_token_id=0)
    want = torch.tensor([[-1.0] * 3, [-1.0] * 3, [-2.0, -2.0, 0.0]])  # the shorter one right-padded with 0
    torch.testing.assert_close(joined.sampling_per_token_logps, want)
    torch.testing.assert_close(joined.select(torch.tensor([2, 0])).sampling_per_token_logps,
                               torch.tensor([[-2.0, -2.0, 0.0], [-1.0] * 3]))  # fmt: skip
    assert Rollout.concat([a, rollout(1, 2, None)], pad_token_id=0).sampling_per_token_logps is None


# --- TRL: its lines transcribed, pinned to its source, and its _compute_loss ------------------------------------------
TRL_IS_BLOCK_START = " " * 12 + "if self.use_vllm and self.vllm_importance_sampling_correction:\n" + " " * 16 + "mask ="
TRL_IS_BLOCK_END = "Possible values are 'token_truncate', 'token_mask', 'sequence_truncate', and 'sequence_mask'.\"\n"


def trl_is_block() -> str:
    """TRL 1.16's lines that compute vllm_importance_sampling_ratio (GRPOTrainer._generate_and_score_completions)."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = source.index(TRL_IS_BLOCK_START)
    return source[start : source.index(TRL_IS_BLOCK_END, start) + len(TRL_IS_BLOCK_END)]


def trl_is_ratio(old_per_token_logps, sampling_per_token_logps, completion_mask, mode, clip_min, clip_max):
    """A transcription of trl_is_block(): TRL's lines with `self.` and the tool mask taken out."""
    mask = completion_mask
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    if sequence_level_is:
        per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
        logps_diff = per_sequence_logps_diff
    else:
        logps_diff = per_token_logps_diff
    vllm_importance_sampling_ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        vllm_importance_sampling_ratio = torch.clamp(vllm_importance_sampling_ratio, min=clip_min, max=clip_max)
    elif mode in ["sequence_mask", "token_mask"]:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (vllm_importance_sampling_ratio > max_val)
        vllm_importance_sampling_ratio = vllm_importance_sampling_ratio.masked_fill(invalid_mis_mask, value=0.0)
    return vllm_importance_sampling_ratio


# sha256 of trl_is_block() in TRL 1.16: a change there fails this test, so that trl_is_ratio is re-read against it
TRL_IS_BLOCK_SHA256 = "ef9919bb2b5b4f21649da8d875f48f29b5c43a3a0c515dba5bfe8ef434252b44"


@needs_trl
def test_trl_source_is_the_transcribed_one():
    block = textwrap.dedent(trl_is_block())
    assert hashlib.sha256(block.encode()).hexdigest() == TRL_IS_BLOCK_SHA256, (
        "TRL's importance-sampling lines changed: compare them with trl_is_ratio, update the transcription and "
        f"minigrpo.losses.sampler_importance_weights, then the hash. The lines now:\n{block}"
    )


def shared_tensors(seed: int = 0, N: int = 6, T: int = 7):
    """Sampler and trainer log-probs about 1 apart (so every bound is hit), ragged masks, a NaN, an empty
    completion."""
    generator = torch.Generator().manual_seed(seed)
    old = torch.randn(N, T, generator=generator).log_softmax(-1)
    sampling = old + torch.randn(N, T, generator=generator)
    sampling[0, 1] = float("nan")
    lengths = torch.tensor([7, 5, 1, 0, 3, 6])[:N]
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return old, sampling, mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bounds", [(None, 3.0), (0.5, 2.0), (0.8, None)], ids=["max", "min_max", "min"])
def test_weights_equal_the_transcription_of_trls_lines(mode, bounds):
    if bounds[1] is None and mode.endswith("_truncate"):
        bounds = (bounds[0], 3.0)
    old, sampling, mask = shared_tensors()
    ours = sampler_importance_weights(old, sampling, mask, mode, *bounds)
    theirs = trl_is_ratio(old, sampling, mask, mode, *bounds)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert (ours == 0).any() or mode.endswith("_truncate")  # the bounds act on these tensors


def trl_compute_loss(per_token_logps, inputs, config):
    """TRL's own GRPOTrainer._compute_loss on given tensors: `self` is a stand-in holding the attributes it reads,
    whose model pass returns per_token_logps; the importance-sampling ratio is an input, as TRL passes it."""
    from trl import GRPOTrainer

    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (per_token_logps, torch.zeros_like(per_token_logps), None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=config.importance_sampling_level, beta=config.beta, loss_type=config.loss_type,
        epsilon_low=config.epsilon_low, epsilon_high=config.clip_epsilon_high,
        max_completion_length=config.max_completion_length, use_vllm=True,
        vllm_importance_sampling_correction=config.vllm_importance_sampling_correction,
        args=SimpleNamespace(use_bias_correction_kl=config.use_bias_correction_kl, delta=None, steps_per_generation=1),
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, _entropy_bonus_enabled=False,
        accelerator=SimpleNamespace(reduce=lambda t, reduction: t, gather=lambda t: t, num_processes=1),
        _metrics=defaultdict(lambda: defaultdict(list)),
    )  # fmt: skip
    return GRPOTrainer._compute_loss(fake, None, inputs)


@needs_trl
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_loss_and_gradient_equal_trls_compute_loss(mode, loss_type):
    """Shared tensors, off-policy (pi_old != pi_theta, so the clip acts) with the KL term: TRL's _compute_loss, given
    the ratio as its input (importance_sampling_ratio), and grpo_loss with the sampler's log-probs agree."""
    old, sampling, mask = shared_tensors(seed=1)
    N, T = mask.shape
    generator = torch.Generator().manual_seed(2)
    current = (old + 0.3 * torch.randn(N, T, generator=generator)).requires_grad_()
    ref = old + 0.1 * torch.randn(N, T, generator=generator)
    advantages = torch.randn(N, generator=generator)
    config = GRPOConfig(beta=0.04, loss_type=loss_type, max_completion_length=T,
                        vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode,
                        vllm_importance_sampling_clip_min=0.5)  # fmt: skip
    ratio = sampler_importance_weights(old, sampling, mask, mode, 0.5, 3.0)
    inputs = dict(
        prompt_ids=torch.zeros(N, 1, dtype=torch.long), prompt_mask=torch.ones(N, 1, dtype=torch.long),
        completion_ids=torch.zeros(N, T, dtype=torch.long), completion_mask=mask, advantages=advantages,
        old_per_token_logps=old, ref_per_token_logps=ref, importance_sampling_ratio=ratio,
        num_items_in_batch=mask.sum(),
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = trl_compute_loss(current, inputs, config)
    (grad_theirs,) = torch.autograd.grad(theirs, current)
    ours, _ = grpo_loss(current, old, ref, advantages, mask, config, mask.sum(), sampling)
    (grad_ours,) = torch.autograd.grad(ours, current)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-5, atol=1e-7)
    plain = config.replace(vllm_importance_sampling_correction=False)
    uncorrected, _ = grpo_loss(current, old, ref, advantages, mask, plain, mask.sum())
    assert not torch.isclose(uncorrected, ours)  # the correction changes the loss here


def test_grpo_step_applies_the_correction_to_a_rollout_that_carries_sampler_logps(tiny, train_dataset, small_config):
    """The trainer's update passes the rollout's sampler log-probs to the loss: a sampler equal to the policy
    (with_sampler_logps of the policy itself) changes nothing; one whose every completion is e^5 times less likely
    than the policy's is masked out whole (sequence_mask, C_max = 3), so the step leaves the weights as they were."""
    model, tokenizer = tiny
    config = small_config.replace(beta=0.0, max_steps=1, vllm_importance_sampling_correction=True)
    trainer = GRPOTrainer(model, [correctness_reward], config, train_dataset, processing_class=tokenizer)
    rollout, rewards, _ = trainer.collect_rollout()
    rollout = with_sampler_logps(rollout, model, config)
    with torch.no_grad():
        logps, _ = completion_logps(model, rollout, config)
    torch.testing.assert_close(rollout.sampling_per_token_logps, logps * rollout.completion_mask)
    equal_sampler = rollout.sampling_per_token_logps
    before = [p.detach().clone() for p in model.parameters()]
    rollout.sampling_per_token_logps = (logps - 5.0) * rollout.completion_mask
    metrics = trainer.update(rollout, rewards)  # the first step: AdamW has no momentum yet
    assert metrics["sampling/importance_sampling_ratio/mean"] == 0.0 and metrics["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    rollout.sampling_per_token_logps = equal_sampler
    metrics = trainer.update(rollout, rewards)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["grad_norm"] > 0

"""Stage 4: ratio, clipped surrogate, KL estimators and loss aggregation."""

import math

import pytest
import torch

from minigrpo.config import GRPOConfig
from minigrpo.losses import (
    aggregate_loss,
    clip_fractions,
    clipped_surrogate,
    grpo_loss,
    importance_ratio,
    kl_penalty,
    reinforce_loss,
)

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # lengths 3 and 1
LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])  # 100 = padding, must not count


def test_token_ratio_is_exp_of_logp_difference():
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    old = torch.log(torch.tensor([[0.25, 0.4]]))
    torch.testing.assert_close(importance_ratio(logp, old, torch.ones(1, 2)), torch.tensor([[2.0, 0.5]]))


def test_sequence_ratio_is_geometric_mean_over_real_tokens():
    logp = torch.tensor([[math.log(2.0), math.log(8.0), 50.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    ratio = importance_ratio(logp, torch.zeros(1, 3), mask, level="sequence")
    assert ratio.shape == (1, 1)
    torch.testing.assert_close(ratio, torch.tensor([[4.0]]))  # sqrt(2 * 8)


@pytest.mark.parametrize("advantage", [1.5, -0.7, 0.0])
def test_surrogate_at_ratio_one_equals_reinforce(advantage):
    ratio = torch.ones(2, 3)
    surrogate = clipped_surrogate(ratio, torch.full((2,), advantage), 0.2, 0.2)
    torch.testing.assert_close(surrogate, ratio * advantage)


def test_surrogate_gradient_at_ratio_one_is_reinforce_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    advantages = torch.tensor([0.8])
    ratio = importance_ratio(logp, logp.detach(), torch.ones(1, 2))
    clipped_surrogate(ratio, advantages, 0.2, 0.2).sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.8, 0.8]]))  # d(A * logp)/dlogp


def test_clipping_by_hand():
    ratio = torch.tensor([[0.5, 1.1, 1.5], [0.5, 0.9, 1.5]])
    advantages = torch.tensor([1.0, -1.0])
    surrogate = clipped_surrogate(ratio, advantages, 0.2, 0.28)
    # A > 0: min(r, clip(r)) -> 0.5 (not raised to 0.8), 1.1, 1.28 (capped)
    # A < 0: min(-r, -clip(r)) -> -0.8 (floored), -0.9, -1.5 (not capped)
    torch.testing.assert_close(surrogate, torch.tensor([[0.5, 1.1, 1.28], [-0.8, -0.9, -1.5]]))


def test_clipped_tokens_get_zero_gradient():
    log_ratio = torch.log(torch.tensor([[1.5, 1.0]])).requires_grad_()
    surrogate = clipped_surrogate(torch.exp(log_ratio), torch.tensor([1.0]), 0.2, 0.2)
    surrogate.sum().backward()
    assert log_ratio.grad[0, 0] == 0  # above 1 + eps with A > 0: clipped
    assert log_ratio.grad[0, 1] == 1  # inside the trust region: gradient A * ratio


def test_clip_fractions():
    ratio = torch.tensor([[0.5, 1.5, 1.0], [0.5, 1.5, 1.0]])
    fractions = clip_fractions(ratio, torch.tensor([-1.0, 1.0]), torch.ones(2, 3), 0.2, 0.2)
    assert fractions["clip_ratio/low_mean"] == pytest.approx(1 / 6)
    assert fractions["clip_ratio/high_mean"] == pytest.approx(1 / 6)
    assert fractions["clip_ratio/region_mean"] == pytest.approx(2 / 6)


def test_kl_estimators_by_hand():
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    log_r = math.log(0.5)  # log(pi_ref / pi_theta)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(-log_r)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * log_r**2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - log_r - 1)


def test_k3_is_unbiased_for_the_exact_kl_and_nonnegative():
    """E_{x ~ pi}[k3] = KL(pi || pi_ref) exactly, over a small distribution."""
    pi = torch.tensor([0.5, 0.3, 0.15, 0.05])
    pi_ref = torch.tensor([0.25, 0.25, 0.25, 0.25])
    exact = (pi * (pi / pi_ref).log()).sum()
    logp, ref = pi.log().unsqueeze(0), pi_ref.log().unsqueeze(0)
    for estimator in ("k1", "k3"):
        expectation = (pi * kl_penalty(logp, ref, estimator)[0]).sum()
        assert expectation.item() == pytest.approx(exact.item(), abs=1e-6)
    reverse = (pi_ref * (pi_ref / pi).log()).sum()
    assert abs(exact - reverse) > 0.05  # the direction matters, and k3 estimates KL(pi || pi_ref)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert (kl_penalty(logp, ref, "k1") < 0).any()


def test_kl_is_zero_when_policy_equals_reference():
    logp = torch.randn(3, 5)
    for estimator in ("k1", "k2", "k3"):
        assert kl_penalty(logp, logp.clone(), estimator).abs().max() == 0


def test_grpo_aggregation_is_per_sequence_mean():
    # (1 + 2 + 3) / 3 = 2 and 4 / 1 = 4 -> mean 3
    assert aggregate_loss(LOSS, MASK, "grpo").item() == pytest.approx(3.0)


def test_bnpo_aggregation_is_token_mean():
    assert aggregate_loss(LOSS, MASK, "bnpo").item() == pytest.approx(10 / 4)


def test_dapo_aggregation_uses_the_whole_step_token_count():
    assert aggregate_loss(LOSS, MASK, "dapo").item() == pytest.approx(10 / 4)
    assert aggregate_loss(LOSS, MASK, "dapo", num_items_in_batch=20).item() == pytest.approx(10 / 20)


def test_dr_grpo_aggregation_is_constant_normaliser():
    # sum 10 / (N=2 x max_completion_length=8)
    assert aggregate_loss(LOSS, MASK, "dr_grpo", max_completion_length=8).item() == pytest.approx(10 / 16)


def test_empty_completion_mask_gives_zero_not_nan():
    mask = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    loss = torch.tensor([[5.0, 5.0], [2.0, 7.0]])
    for loss_type in ("grpo", "bnpo", "dapo", "dr_grpo"):
        value = aggregate_loss(loss, mask, loss_type, max_completion_length=2)
        assert torch.isfinite(value)
    assert aggregate_loss(torch.ones(1, 2), torch.zeros(1, 2), "bnpo").item() == 0.0


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_masked_positions_receive_zero_gradient(loss_type):
    logp = torch.randn(2, 4, requires_grad=True)
    ref = torch.randn(2, 4)
    config = GRPOConfig(loss_type=loss_type, max_completion_length=4)
    loss, _ = grpo_loss(logp, None, ref, torch.tensor([1.0, -0.5]), MASK, config)
    loss.backward()
    assert (logp.grad[MASK == 0] == 0).all()
    assert (logp.grad[MASK == 1] != 0).all()


def test_loss_is_zero_at_start_but_gradient_is_not():
    """Ratio 1 and advantages summing to 0 per group: loss ~ 0, gradient != 0 (a classic confusion)."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0])  # one group of G = 2
    config = GRPOConfig(beta=0.0)
    loss, _ = grpo_loss(logp, None, None, advantages, torch.ones(2, 2), config)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    assert logp.grad.abs().sum() > 0


def test_grpo_loss_by_hand_with_kl():
    # one token each, ratio 1: loss = mean_i [-A_i + beta * k3_i]
    logp = torch.log(torch.tensor([[0.5], [0.5]]))
    ref = torch.log(torch.tensor([[0.25], [1.0]]))
    config = GRPOConfig(beta=0.1)
    loss, metrics = grpo_loss(logp, None, ref, torch.tensor([2.0, -1.0]), torch.ones(2, 1), config)
    k3 = [0.5 - math.log(0.5) - 1, 2.0 - math.log(2.0) - 1]
    assert loss.item() == pytest.approx(((-2.0 + 0.1 * k3[0]) + (1.0 + 0.1 * k3[1])) / 2, abs=1e-6)
    assert metrics["kl"] == pytest.approx(sum(k3) / 2, abs=1e-6)


def test_unknown_loss_type_is_clear():
    with pytest.raises(ValueError, match="loss_type"):
        aggregate_loss(LOSS, MASK, "mean")


# --- REINFORCE, and the surrogate reducing to it at ratio 1 --------------------------------
LOGPS = torch.tensor([[-1.0, -2.0, -3.0, 50.0], [-0.5, 50.0, 50.0, 50.0]])  # 50 = padding, must not count


@pytest.mark.parametrize(
    ("baseline", "loss_type", "want"),
    [
        (None, "grpo", (2.0 + 0.0) / 2),  # A = (1, 0): row 0 mean of (1, 2, 3) = 2, row 1 weighs 0
        ("mean", "grpo", (0.5 * 2.0 + -0.5 * 0.5) / 2),  # b = 0.5: A = (0.5, -0.5); -A log pi = (1, 2, 3) / 2 and -0.25
        ("mean", "bnpo", (0.5 * 6.0 - 0.25) / 4),  # token mean over the 4 real tokens
        ("mean", "dr_grpo", (0.5 * 6.0 - 0.25) / (2 * 4)),  # N = 2 x max_completion_length = 4
        (0.25, "grpo", (0.75 * 2.0 - 0.25 * 0.5) / 2),  # A = (0.75, -0.25)
        (torch.tensor([1.0, 0.0]), "grpo", 0.0),  # a per-completion baseline equal to the rewards: no signal
    ],
)
def test_reinforce_loss_by_hand(baseline, loss_type, want):
    rewards = torch.tensor([1.0, 0.0])
    loss = reinforce_loss(LOGPS, rewards, MASK, baseline, loss_type, max_completion_length=4)
    assert loss.item() == pytest.approx(want, abs=1e-6)


def test_reinforce_gradient_by_hand_and_nothing_flows_into_padding_or_rewards():
    logp = LOGPS.clone().requires_grad_()
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    reinforce_loss(logp, rewards, MASK, "mean").backward()
    # d/dlogp_it = -A_i / |o_i| / N: row 0 -0.5 / 3 / 2, row 1 +0.5 / 1 / 2; padding 0
    want = torch.tensor([[-1 / 12, -1 / 12, -1 / 12, 0.0], [0.25, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, want)
    assert rewards.grad is None  # the rewards weight the gradient; they are not differentiated


def test_reinforce_with_mean_baseline_is_zero_for_equal_rewards():
    logp = torch.randn(3, 4, requires_grad=True)
    loss = reinforce_loss(logp, torch.full((3,), 2.0), torch.ones(3, 4), "mean")
    loss.backward()
    assert loss.item() == 0.0 and (logp.grad == 0).all()


def test_reinforce_bad_baseline_is_clear():
    with pytest.raises(ValueError, match="baseline='median'"):
        reinforce_loss(LOGPS, torch.ones(2), MASK, "median")
    with pytest.raises(ValueError, match=r"shape \(2, 1\)"):
        reinforce_loss(LOGPS, torch.ones(2), MASK, torch.ones(2, 1))


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_clipped_surrogate_at_ratio_one_has_reinforces_gradient_not_its_value(loss_type, level):
    """grpo_loss with beta = 0 and pi_old = pi_theta.detach(): the gradient of reinforce_loss, for every loss_type,
    per-token or per-sequence (GSPO) ratio. The values differ: the surrogate reads -A, REINFORCE -A log pi."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]]).float()  # (4, 5)
    logp = (-3 * torch.rand(4, 5, generator=generator)).requires_grad_()
    advantages = torch.tensor([1.2, -0.4, 0.7, -1.5])
    config = GRPOConfig(beta=0.0, loss_type=loss_type, importance_sampling_level=level, max_completion_length=5)
    surrogate_loss, _ = grpo_loss(logp, None, None, advantages, mask, config)
    reinforce = reinforce_loss(logp, advantages, mask, None, loss_type, max_completion_length=5)
    (surrogate_grad,) = torch.autograd.grad(surrogate_loss, logp)
    (reinforce_grad,) = torch.autograd.grad(reinforce, logp)
    torch.testing.assert_close(surrogate_grad, reinforce_grad, rtol=0, atol=1e-7)
    assert (reinforce_grad[mask == 1] != 0).all() and (reinforce_grad[mask == 0] == 0).all()
    minus_advantage = -advantages.unsqueeze(1).expand(4, 5)  # (N, T): -A on every token, the value at ratio 1
    torch.testing.assert_close(surrogate_loss, aggregate_loss(minus_advantage, mask, loss_type, 5))
    torch.testing.assert_close(reinforce, aggregate_loss(minus_advantage * logp.detach(), mask, loss_type, 5))
    assert abs(surrogate_loss.item() - reinforce.item()) > 0.01  # so the two value checks above are not one

"""The KL estimators as losses: each one's expected gradient, against hand-computed values and the exact KLs."""

import math

import pytest
import torch

from minigrpo.config import GRPOConfig
from minigrpo.course.kl_gradients import (
    KL_DIRECTIONS,
    KL_LOSSES,
    exact_kl_gradients,
    expected_kl_loss_gradient,
    kl_gradient_comparison,
    per_sample_kl_losses,
)
from minigrpo.course.plots import shifted_distributions
from minigrpo.losses import grpo_loss

# pi_theta = (1/2, 1/2), pi_ref = (1/4, 3/4): every gradient by hand (softmax: d log pi(x) / d logits = onehot(x) - pi)
HALVES = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
QUARTERS = torch.log(torch.tensor([0.25, 0.75], dtype=torch.float64))
REVERSE = 0.25 * math.log(3.0)  # pi_0 (log(pi_0 / q_0) - KL) = 0.5 (log 2 - 0.5 log(4/3)) = 0.25 log 3 = 0.274653
FORWARD = 0.25  # pi_0 - q_0


def test_exact_kl_gradients_by_hand():
    exact = exact_kl_gradients(HALVES, QUARTERS)
    assert exact["reverse"].tolist() == pytest.approx([REVERSE, -REVERSE], abs=1e-12)
    assert exact["forward"].tolist() == pytest.approx([FORWARD, -FORWARD], abs=1e-12)


@pytest.mark.parametrize(
    "estimator, want",
    [("k1", 0.0), ("k2", REVERSE), ("k3", FORWARD), ("rho_k3", REVERSE)],
)
def test_expected_gradient_of_each_kl_loss_by_hand(estimator, want):
    gradient = expected_kl_loss_gradient(estimator, HALVES, QUARTERS)
    assert gradient.tolist() == pytest.approx([want, -want], abs=1e-12)


def test_per_sample_losses_by_hand():
    # x = 0: log r = log(1/2); x = 1: log r = log(3/2); rho = 1 in value, so rho_k3's values are k3's
    log_r = torch.tensor([math.log(0.5), math.log(1.5)], dtype=torch.float64)
    want = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - log_r - 1, "rho_k3": log_r.exp() - log_r - 1}
    for estimator, values in want.items():
        got = per_sample_kl_losses(estimator, HALVES, QUARTERS)
        assert got.tolist() == pytest.approx(values.tolist(), abs=1e-12), estimator


def test_per_sample_gradients_follow_the_score_function():
    """One sampled token x: grad k1 = g, grad k3 = (1 - r) g, grad k2 = grad(rho k3) = -log r g, g = onehot(x) - pi."""
    logits = torch.tensor([0.3, -0.2, 0.9], dtype=torch.float64, requires_grad=True)
    ref_logits = torch.tensor([-0.5, 0.4, 0.1], dtype=torch.float64)
    pi = logits.detach().softmax(0)
    log_r = ref_logits.log_softmax(0) - logits.detach().log_softmax(0)
    coefficient = {"k1": torch.ones(3), "k2": -log_r, "k3": 1 - log_r.exp(), "rho_k3": -log_r}
    for estimator, c in coefficient.items():
        losses = per_sample_kl_losses(estimator, logits, ref_logits)  # (3,)
        for x in range(3):
            (gradient,) = torch.autograd.grad(losses[x], logits, retain_graph=True)
            score = torch.nn.functional.one_hot(torch.tensor(x), 3).double() - pi
            assert gradient.tolist() == pytest.approx((c[x] * score).tolist(), abs=1e-12), (estimator, x)


@pytest.mark.parametrize("shift", [0.3, 1.0, 2.5])
def test_each_loss_follows_its_direction_on_the_lessons_distributions(shift):
    probs, ref_probs = shifted_distributions(shift)
    logits, ref_logits = probs.log(), ref_probs.log()
    exact = exact_kl_gradients(logits, ref_logits)
    for estimator, direction in KL_DIRECTIONS.items():
        gradient = expected_kl_loss_gradient(estimator, logits, ref_logits)
        want = torch.zeros_like(gradient) if direction == "none" else exact[direction]
        assert torch.allclose(gradient, want, atol=1e-12), (estimator, direction)
    assert (exact["reverse"] - exact["forward"]).norm() > 1e-3  # the two directions really differ here


def test_the_two_kl_gradients_agree_to_first_order_near_the_reference():
    """Their difference is second order in the shift: halving the shift halves it relative to the gradients."""
    distance = [
        kl_gradient_comparison(*(p.log() for p in shifted_distributions(s)))["k3"]["reverse"] for s in (0.1, 0.05)
    ]
    assert distance[0] == pytest.approx(0.0279, abs=5e-4)
    assert distance[1] / distance[0] == pytest.approx(0.5, abs=0.02)


def test_comparison_table_distances():
    table = kl_gradient_comparison(*(p.log() for p in shifted_distributions(1.0)))
    assert set(table) == set(KL_LOSSES)
    assert table["k1"] == pytest.approx({"reverse": 1.0, "forward": 1.0}, abs=1e-12)  # a zero vector
    assert table["k2"]["reverse"] == pytest.approx(0.0, abs=1e-12)
    assert table["rho_k3"]["reverse"] == pytest.approx(0.0, abs=1e-12)
    assert table["k3"]["forward"] == pytest.approx(0.0, abs=1e-12)
    assert table["k3"]["reverse"] == pytest.approx(0.2756, abs=1e-4)


def test_rho_k3_is_grpo_loss_with_use_bias_correction_kl():
    """The per-sample loss is the trainer's: grpo_loss of a one-token completion, advantage 0, beta 1."""
    logits = torch.tensor([0.2, -1.0, 0.5], dtype=torch.float64, requires_grad=True)
    ref_logits = torch.tensor([0.0, 0.3, -0.4], dtype=torch.float64)
    logp = logits.log_softmax(0)[2].view(1, 1)
    ref = ref_logits.log_softmax(0)[2].view(1, 1)
    config = GRPOConfig(beta=1.0, use_bias_correction_kl=True, max_steps=1)
    loss, _ = grpo_loss(logp, None, ref, torch.zeros(1), torch.ones(1, 1), config)
    (want,) = torch.autograd.grad(loss, logits)
    (got,) = torch.autograd.grad(per_sample_kl_losses("rho_k3", logits, ref_logits)[2], logits)
    assert torch.allclose(got, want, atol=1e-15)


def test_bad_input_says_what_to_change():
    with pytest.raises(ValueError, match="must both be \\(V,\\)"):
        expected_kl_loss_gradient("k3", torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="must both be \\(V,\\)"):
        exact_kl_gradients(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="use one of"):
        expected_kl_loss_gradient("k4", torch.zeros(3), torch.zeros(3))

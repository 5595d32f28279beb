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
    sequence_kl_gradients,
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


# Two-token completions (x1, x2) over V = 2: logits are (V + V*V,) = x1's, then x2's given x1 = 0 and given x1 = 1.
def test_a_per_token_loss_misses_the_first_tokens_share_of_the_later_kl():
    """pi(x1) = pi_ref(x1) = (1/2, 1/2); after x1 = 0, pi = (1/2, 1/2) against pi_ref = (1/4, 3/4); after x1 = 1 equal.
    KL(sequences) = 1/2 KL_0 with KL_0 = 1/2 log(4/3). By hand, d/d x1's logits = pi(x1) (KL_2(x1) - E KL_2) =
    (KL_0 / 4, -KL_0 / 4): making x1 = 1 likelier avoids the KL at position 2. A per-token loss holds the prefix
    fixed: x1's logits get 0, x2's (after x1 = 0) get pi(x1 = 0) * the one-token reverse gradient
    (REVERSE, -REVERSE)."""
    uniform = torch.zeros(2, dtype=torch.float64)
    logits = torch.cat([uniform, HALVES, uniform])
    ref_logits = torch.cat([uniform, QUARTERS, uniform])
    kl_0 = 0.5 * math.log(4 / 3)
    gradients = sequence_kl_gradients(logits, ref_logits, V=2)
    sequence = [kl_0 / 4, -kl_0 / 4, REVERSE / 2, -REVERSE / 2, 0.0, 0.0]
    per_position = [0.0, 0.0, REVERSE / 2, -REVERSE / 2, 0.0, 0.0]
    for name, want in [("sequence", sequence), ("k1_reward_to_go", sequence)] + [
        (name, per_position) for name in ("prefix_fixed", "k2_per_token", "rho_k3_per_token")
    ]:
        assert gradients[name].tolist() == pytest.approx(want, abs=1e-12), name


def test_one_moved_token_gives_the_one_token_gradients():
    """When the second token's distributions equal the reference's, only x1 carries KL: every gradient is the
    one-token reverse KL's on x1's logits, (REVERSE, -REVERSE), and 0 on x2's."""
    uniform = torch.zeros(4, dtype=torch.float64)
    gradients = sequence_kl_gradients(torch.cat([HALVES, uniform]), torch.cat([QUARTERS, uniform]), V=2)
    for name, gradient in gradients.items():
        assert gradient.tolist() == pytest.approx([REVERSE, -REVERSE, 0, 0, 0, 0], abs=1e-12), name


def test_per_token_losses_follow_each_position_and_k1_in_the_reward_the_sequence():
    generator = torch.Generator().manual_seed(3)
    V = 3
    ref_logits = torch.randn(V + V * V, generator=generator, dtype=torch.float64)
    logits = ref_logits + torch.randn(V + V * V, generator=generator, dtype=torch.float64)
    gradients = sequence_kl_gradients(logits, ref_logits, V)
    for name in ("k2_per_token", "rho_k3_per_token"):
        assert torch.allclose(gradients[name], gradients["prefix_fixed"], atol=1e-12)
    assert torch.allclose(gradients["k1_reward_to_go"], gradients["sequence"], atol=1e-12)
    assert (gradients["sequence"] - gradients["prefix_fixed"]).norm() > 1e-2  # far from the reference they differ


def test_bad_input_says_what_to_change():
    with pytest.raises(ValueError, match=r"give \(V \+ V\*V,\)"):
        sequence_kl_gradients(torch.zeros(3), torch.zeros(3), V=2)
    with pytest.raises(ValueError, match="must both be \\(V,\\)"):
        expected_kl_loss_gradient("k3", torch.zeros(2, 3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="must both be \\(V,\\)"):
        exact_kl_gradients(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="use one of"):
        expected_kl_loss_gradient("k4", torch.zeros(3), torch.zeros(3))

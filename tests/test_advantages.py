"""Stage 3: group-relative advantages against hand-computed values and invariants."""

import pytest
import torch

from minigrpo.advantages import (
    group_baseline,
    group_relative_advantages,
    group_rewards,
    reward_scale,
    zero_std_groups,
)

# The course's worked example: 8 answers scored 2 / 1 / 0 (see minigrpo.tasks.arithmetic).
WORKED = torch.tensor([[2.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0, 1.0]])
# By hand: mean 0.875, squared deviations sum to 4.875,
# Bessel std sqrt(4.875 / 7) = 0.8345230, population std sqrt(4.875 / 8) = 0.7806247.
BESSEL_A = {2.0: 1.347914, 1.0: 0.149768, 0.0: -1.048378}
POPULATION_A = {2.0: 1.440969, 1.0: 0.160108, 0.0: -1.120754}


def expected(table):
    return torch.tensor([[table[r.item()] for r in WORKED[0]]])


def test_worked_example_mean_is_0875():
    assert group_baseline(WORKED)[0, 0].item() == pytest.approx(0.875, abs=1e-7)


def test_worked_example_bessel_std_and_advantages():
    assert reward_scale(WORKED, "group", ddof=1).item() == pytest.approx(0.8345230, abs=1e-6)
    advantages = group_relative_advantages(WORKED, eps=1e-4)
    torch.testing.assert_close(advantages, expected(BESSEL_A), atol=1e-5, rtol=0)


def test_worked_example_population_std():
    assert reward_scale(WORKED, "group", ddof=0).item() == pytest.approx(0.7806247, abs=1e-6)
    advantages = group_relative_advantages(WORKED, ddof=0, eps=1e-4)
    torch.testing.assert_close(advantages, expected(POPULATION_A), atol=1e-5, rtol=0)


def test_bessel_and_population_differ_by_sqrt_g_over_g_minus_1():
    bessel = group_relative_advantages(WORKED, eps=0.0)
    population = group_relative_advantages(WORKED, ddof=0, eps=0.0)
    torch.testing.assert_close(population / bessel, torch.full_like(bessel, (8 / 7) ** 0.5))


def test_rloo_is_leave_one_out_mean():
    advantages = group_relative_advantages(WORKED, scale_rewards="none", baseline="rloo")
    # r_i - mean of the other 7, e.g. 2 - (7 - 2) / 7 = 1.285714
    by_hand = {2.0: 2 - 5 / 7, 1.0: 1 - 6 / 7, 0.0: 0 - 7 / 7}
    torch.testing.assert_close(advantages, expected(by_hand), atol=1e-6, rtol=0)
    # RLOO = G / (G - 1) x the mean-baseline advantage
    dr_grpo = group_relative_advantages(WORKED, scale_rewards="none")
    torch.testing.assert_close(advantages, dr_grpo * 8 / 7)


def test_no_scaling_is_dr_grpo():
    advantages = group_relative_advantages(WORKED, scale_rewards="none")
    torch.testing.assert_close(advantages, WORKED - 0.875)


def test_batch_scaling_uses_one_std_for_all_groups():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    advantages = group_relative_advantages(rewards, scale_rewards="batch", eps=0.0)
    batch_std = torch.tensor([0.0, 1.0, 0.0, 3.0]).std()
    torch.testing.assert_close(advantages, torch.tensor([[-0.5, 0.5], [-1.5, 1.5]]) / batch_std)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 2.0, -3.7])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("baseline", ["mean", "rloo"])
def test_all_equal_rewards_give_exact_zero_never_nan(value, scale, baseline):
    rewards = torch.full((3, 8), value)
    advantages = group_relative_advantages(rewards, scale, baseline, eps=0.0)
    assert not advantages.isnan().any()
    assert (advantages == 0).all()
    assert zero_std_groups(rewards).all()


def test_mixed_batch_zero_std_group_is_zero_others_are_not():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
    advantages = group_relative_advantages(rewards)
    assert (advantages[0] == 0).all()
    assert advantages[1].abs().min() > 0.8
    assert zero_std_groups(rewards).tolist() == [True, False]


def test_g_equals_2():
    advantages = group_relative_advantages(torch.tensor([[0.0, 1.0]]), eps=0.0)
    # mean 0.5, Bessel std of two points = |a - b| / sqrt(2)
    torch.testing.assert_close(advantages, torch.tensor([[-(2**-0.5), 2**-0.5]]))


def test_group_advantages_sum_to_zero():
    rewards = torch.rand(16, 8, generator=torch.Generator().manual_seed(0))
    advantages = group_relative_advantages(rewards)
    torch.testing.assert_close(advantages.sum(1), torch.zeros(16), atol=1e-5, rtol=0)


def test_group_rewards_is_group_major():
    rewards = torch.arange(6.0)
    assert group_rewards(rewards, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="multiple of num_generations"):
        group_rewards(torch.arange(7.0), 3)


def test_unknown_options_are_clear_errors():
    with pytest.raises(ValueError, match="baseline"):
        group_baseline(WORKED, "median")
    with pytest.raises(ValueError, match="scale_rewards"):
        reward_scale(WORKED, "global")

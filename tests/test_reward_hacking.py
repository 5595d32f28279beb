"""minigrpo.tasks.reward_hacking: each gameable reward pays for the wrong thing, by hand."""

import pytest

from minigrpo import correctness_reward
from minigrpo.tasks.reward_hacking import at_least_reward, make_length_bonus, number_anywhere_reward


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

"""Stage 2: calling reward functions, checking what they return, weighting."""

import math
import threading
import time

import pytest
import torch

from minigrpo.rewards import RewardFunctionError, compute_rewards

PROMPTS, COMPLETIONS, IDS = ["p", "p", "q", "q"], ["a", "bb", "ccc", ""], [[1], [2, 2], [3, 3, 3], []]


def length_reward(prompts, completions, completion_ids, **kwargs):
    return [float(len(c)) for c in completions]


def column_reward(prompts, completions, completion_ids, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer, strict=False)]


def test_weighted_sum_and_per_function_columns():
    per_func, rewards = compute_rewards(
        [length_reward, column_reward], PROMPTS, COMPLETIONS, IDS, {"answer": ["a", "x", "ccc", "y"]}, [0.5, 2.0]
    )
    assert per_func.shape == (4, 2)
    torch.testing.assert_close(per_func[:, 0], torch.tensor([1.0, 2.0, 3.0, 0.0]))
    torch.testing.assert_close(rewards, torch.tensor([0.5 + 2.0, 1.0, 1.5 + 2.0, 0.0]))


def test_none_means_not_applicable():
    def partial(prompts, completions, completion_ids, **kwargs):
        return [None, 1.0, None, 2.0]

    per_func, rewards = compute_rewards([partial, length_reward], PROMPTS, COMPLETIONS, IDS, {})
    assert math.isnan(per_func[0, 0].item())
    torch.testing.assert_close(rewards, torch.tensor([1.0, 3.0, 3.0, 2.0]))


def test_a_raising_function_is_named_in_the_error():
    def broken_reward(prompts, completions, completion_ids, **kwargs):
        raise KeyError("solution")

    with pytest.raises(RewardFunctionError, match="'broken_reward' raised KeyError") as info:
        compute_rewards([broken_reward], PROMPTS, COMPLETIONS, IDS, {"answer": ["1"] * 4})
    assert "['answer']" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)


def test_wrong_length_is_an_error_that_says_what_to_return():
    def short_reward(prompts, completions, completion_ids, **kwargs):
        return [1.0]

    with pytest.raises(RewardFunctionError, match="returned 1 values for 4 completions"):
        compute_rewards([short_reward], PROMPTS, COMPLETIONS, IDS, {})


def test_non_numbers_are_errors():
    def text_reward(prompts, completions, completion_ids, **kwargs):
        return ["good"] * 4

    with pytest.raises(RewardFunctionError, match="returned 'good' for completion 0"):
        compute_rewards([text_reward], PROMPTS, COMPLETIONS, IDS, {})
    with pytest.raises(RewardFunctionError, match="not a list"):
        compute_rewards([lambda **kw: 3.0], PROMPTS, COMPLETIONS, IDS, {})


def test_weights_must_match_functions():
    with pytest.raises(ValueError, match="one per function"):
        compute_rewards([length_reward], PROMPTS, COMPLETIONS, IDS, {}, [1.0, 2.0])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "nan"])
def test_nan_and_inf_are_errors_naming_function_and_completion(bad):
    def unstable_reward(prompts, completions, completion_ids, **kwargs):
        return [1.0, None, bad, 0.0]

    with pytest.raises(
        RewardFunctionError, match=r"'unstable_reward' returned '?-?(nan|inf)'? for completion 2\b.*None"
    ):
        compute_rewards([unstable_reward], PROMPTS, COMPLETIONS, IDS, {})


def test_a_slow_function_times_out_with_its_name():
    release = threading.Event()

    def slow_reward(prompts, completions, completion_ids, **kwargs):
        release.wait(10)  # the worker thread cannot be killed: let it finish when the test ends
        return [0.0] * len(completions)

    started = time.perf_counter()
    try:
        with pytest.raises(RewardFunctionError, match=r"'slow_reward' did not return within reward_timeout=0.2s"):
            compute_rewards([slow_reward], PROMPTS, COMPLETIONS, IDS, {}, reward_timeout=0.2)
    finally:
        release.set()
    assert time.perf_counter() - started < 5


def test_within_the_timeout_results_and_errors_are_unchanged():
    def broken_reward(prompts, completions, completion_ids, **kwargs):
        raise KeyError("solution")

    per_func, rewards = compute_rewards([length_reward], PROMPTS, COMPLETIONS, IDS, {}, reward_timeout=5.0)
    torch.testing.assert_close(rewards, torch.tensor([1.0, 2.0, 3.0, 0.0]))
    with pytest.raises(RewardFunctionError, match="'broken_reward' raised KeyError") as info:
        compute_rewards([broken_reward], PROMPTS, COMPLETIONS, IDS, {}, reward_timeout=5.0)
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_reward_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="reward_timeout"):
        compute_rewards([length_reward], PROMPTS, COMPLETIONS, IDS, {}, reward_timeout=timeout)


# --- DAPO's soft overlong punishment ----------------------------------------------------
def test_soft_overlong_punishment_by_hand():
    from minigrpo.rewards import get_soft_overlong_punishment

    punish = get_soft_overlong_punishment(max_completion_len=20, soft_punish_cache=4)  # ramp over lengths 17..20
    lengths = [0, 1, 15, 16, 17, 18, 19, 20, 21, 40]
    expected = [0.0, 0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert punish(completion_ids=[[5] * n for n in lengths]) == expected
    assert punish.__name__ == "soft_overlong_punishment_reward"  # TRL's, so the logged metric has TRL's name
    hard = get_soft_overlong_punishment(max_completion_len=20, soft_punish_cache=0)  # L_cache = 0: a step at L_max
    assert hard(completion_ids=[[5] * 20, [5] * 21]) == [0.0, -1.0]
    # through the trainer's own call, with TRL's keyword arguments
    _, rewards = compute_rewards([punish], ["p"] * 2, ["a", "b"], [[1] * 16, [1] * 18], {})
    assert rewards.tolist() == [0.0, -0.5]
    for bad in ((0, 0), (20, -1), (20, 21)):
        with pytest.raises(ValueError, match="0 <= soft_punish_cache <= max_completion_len"):
            get_soft_overlong_punishment(*bad)


@pytest.mark.parametrize(("max_len", "cache"), [(20, 4), (64, 16), (7, 7), (10, 0), (1, 1)])
def test_soft_overlong_punishment_matches_trl(max_len, cache):
    from trl.rewards import get_soft_overlong_punishment as trl_punishment

    from minigrpo.rewards import get_soft_overlong_punishment

    ids = [[3] * n for n in range(0, 2 * max_len + 2)]
    ours = get_soft_overlong_punishment(max_len, cache)(completion_ids=ids)
    theirs = trl_punishment(max_len, cache)(completion_ids=ids)
    assert ours == pytest.approx(theirs, abs=1e-12)


# --- what a reward function returns, checked for type and order ------------------------------------------
@pytest.mark.parametrize(
    "returned, says",
    [
        ({"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}, "returned dict, not a list"),  # would score its keys
        ("1001", "returned str, not a list"),  # would score its characters
        ({1.0, 0.0, 0.5, 0.25}, "returned set, not a list"),  # would score in set order
        (["1", "0", "1", "0"], "'1' for completion 0, a string"),
        (iter([1.0, 0.0, 1.0, 0.0]), "returned list_iterator, not a list"),
    ],
)
def test_a_reward_of_the_wrong_type_is_named(returned, says):
    with pytest.raises(RewardFunctionError, match=says):
        compute_rewards([lambda **kw: returned], PROMPTS, COMPLETIONS, IDS, {})


def test_numpy_and_tensor_rewards_are_numbers_in_order():
    import numpy as np

    for returned in (np.array([1.0, 0.0, 0.5, 0.25]), torch.tensor([1.0, 0.0, 0.5, 0.25]), (1.0, 0.0, 0.5, 0.25)):
        per_func, rewards = compute_rewards([lambda r=returned, **kw: r], PROMPTS, COMPLETIONS, IDS, {})
        assert rewards.tolist() == [1.0, 0.0, 0.5, 0.25]


def test_each_reward_function_gets_its_own_completions():
    seen = []

    def mutates(completions, **kwargs):
        completions[0] = "tampered"
        completions.pop()
        return [0.0] * 4 if len(completions) == 3 else [0.0] * len(completions)

    def reads(completions, **kwargs):
        seen.extend(completions)
        return [1.0] * len(completions)

    per_func, _ = compute_rewards([mutates, reads], PROMPTS, list(COMPLETIONS), IDS, {})
    assert seen == list(COMPLETIONS) and per_func.shape == (4, 2)


def test_a_reward_beyond_float32_is_named_not_blamed_on_the_learning_rate():
    def huge(**kwargs):
        return [1e39, 0.0, 0.0, 0.0]  # finite in float64, inf in float32

    with pytest.raises(RewardFunctionError, match="'huge' returned 1e\\+39, beyond float32's range"):
        compute_rewards([huge], PROMPTS, COMPLETIONS, IDS, {})
    with pytest.raises(RewardFunctionError, match="use smaller reward_weights"):
        compute_rewards([lambda **kw: [1.0] * 4], PROMPTS, COMPLETIONS, IDS, {}, reward_weights=[1e39])
    per_func, rewards = compute_rewards([lambda **kw: [3e38] * 4] * 2, PROMPTS, COMPLETIONS, IDS, {}, [1.0, -1.0])
    assert rewards.tolist() == [0.0] * 4  # summed in float64: 3e38 - 3e38 is 0, not inf - inf

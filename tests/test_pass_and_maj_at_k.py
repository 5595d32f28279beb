"""pass@k (Chen et al. 2021's unbiased estimator) and maj@k (majority voting, exact over subsets): hand-computed
values, a brute-force count over every subset, and the sampler that feeds them."""

import itertools
import math
import random
from collections import Counter

import pytest

from minigrpo import GRPOConfig
from minigrpo.run.evaluation import maj_at_k, maj_at_k_curve, pass_and_maj_at_k, pass_at_k, sample_answers


@pytest.mark.parametrize(
    "n, c, k, want",
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3, 2) / C(5, 2)
        (4, 1, 1, 0.25),  # pass@1 is the share of correct samples
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7, 5) / C(10, 5)
        (4, 1, 4, 1.0),  # every subset of size n holds the correct one
        (6, 0, 3, 0.0),
        (6, 6, 1, 1.0),
        (200, 1, 100, 0.5),  # 1 - C(199, 100) / C(200, 100) = 1 - 100 / 200: binomials past float32, no overflow
    ],
)
def test_pass_at_k_by_hand(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_is_one_minus_the_binomial_ratio():
    for n, c, k in [(64, 5, 8), (64, 20, 1), (64, 1, 63), (30, 29, 2)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="need 0 <= c <= n and 1 <= k <= n"):
        pass_at_k(n, c, k)


@pytest.mark.parametrize(
    "answers, k, want",
    [
        (["a", "a", "b"], 1, 2 / 3),
        (["a", "a", "b"], 2, (1 + 0.5 + 0.5) / 3),  # {a, a} wins; {a, b} twice: a tie, half a win each
        (["a", "a", "b"], 3, 1.0),
        (["a", "b", "b"], 2, (0.5 + 0.5 + 0) / 3),
        (["a", "b", "b"], 3, 0.0),  # b outvotes a
        (["a", None, "b"], 2, (1 + 0.5 + 0) / 3),  # None casts no vote: {a, None} wins, {None, b} loses
        (["a", None, "b"], 3, 0.5),
        ([None, None], 2, 0.0),  # no votes at all
        (["a", "b", "c", "a", "b", "c"], 6, 1 / 3),  # a three-way tie
    ],
)
def test_maj_at_k_by_hand(answers, k, want):
    assert maj_at_k(answers, "a", k) == pytest.approx(want, abs=1e-12)


def brute_force_maj_at_k(answers, truth, k):
    """The definition: every size-k subset, its vote, ties broken uniformly."""
    scores = []
    for subset in itertools.combinations(answers, k):
        votes = Counter(a for a in subset if a is not None)
        top = max(votes.values(), default=0)
        tied = [a for a, v in votes.items() if v == top]
        scores.append(1 / len(tied) if truth in tied else 0.0)
    return sum(scores) / len(scores)


def test_maj_at_k_equals_every_subset_counted():
    rng = random.Random(0)
    for _ in range(60):
        answers = [rng.choice([1, 2, 3, None]) for _ in range(rng.randint(1, 9))]
        curve = maj_at_k_curve(answers, 1)  # (n,)
        for k in range(1, len(answers) + 1):
            assert curve[k - 1] == pytest.approx(brute_force_maj_at_k(answers, 1, k), abs=1e-12)


def test_maj_at_1_is_pass_at_1_and_bad_k_is_refused():
    answers = [19, 18, 19, None, 17, 19]
    assert maj_at_k(answers, 19, 1) == pytest.approx(pass_at_k(6, 3, 1))
    with pytest.raises(ValueError, match="need 1 <= k <= n"):
        maj_at_k(answers, 19, 7)


def test_averages_over_problems():
    answers = [["a", "a", "b"], ["b", "b", "b"]]  # problem 1: 2 of 3 right; problem 2 (truth "a"): none
    got = pass_and_maj_at_k(answers, ["a", "a"], ks=[1, 2, 3])
    assert got["pass@k"] == pytest.approx([(2 / 3 + 0) / 2, (1 + 0) / 2, (1 + 0) / 2])
    assert got["maj@k"] == pytest.approx([(2 / 3) / 2, (2 / 3) / 2, 1 / 2])
    with pytest.raises(ValueError, match="one list per problem"):
        pass_and_maj_at_k(answers, ["a"], ks=[1])


def test_sample_answers_are_seeded_per_prompt(tiny):
    model, tokenizer = tiny
    prompts = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in ((12, 7), (40, 35), (3, 9))]
    config = GRPOConfig.tiny_cpu(eval_batch_size=8)  # 8 // n = 2 prompts per generate call
    answers = sample_answers(model, tokenizer, prompts, n=4, config=config, seed=1)
    assert [len(a) for a in answers] == [4, 4, 4]
    assert all(a is None or isinstance(a, int) for row in answers for a in row)
    alone = sample_answers(model, tokenizer, prompts[:1], n=4, config=config, seed=1)  # the same, in another batch
    assert alone == answers[:1]

"""Replay-proof judging: the random cases draw their inputs from a secret the judge draws at every grading.

A notebook can record a check's answers (run the check's cases with the package's functions, in the notebook or
in another grading) and hand the check a function that plays them back in order. These tests build that replayer
in this process, as strong as it can be (it plays back values and gradients), and show that under another secret
it earns only the hand-made cases' points, a minority of every check's; and that the package's own functions earn
full marks under ten different secrets.
"""

import copy
import hashlib
import hmac
import secrets

import pytest
import torch
from test_grading import CHECKS  # the package's reference for every check but the capstone's

from minigrpo import grading
from minigrpo.grading.framework import case_seed, drawn_from, evaluate, seeded

QUESTIONS = {"check_reward_hacking", "check_kl_directions", "check_failure_modes", "check_worked_example_step_one_loss"}
"""Checks that ask a question whose answer is a fact (which KL a loss follows, which bug a run has): nothing to
draw at random, so a recorded answer is simply the answer."""
SLOW = {"check_grpo_step", "check_step_one_loss"}
"""Checks that train the tiny Qwen: drawn like the others, run under two secrets only (below), not ten."""
CHEAP = sorted(set(CHECKS) - QUESTIONS - SLOW)


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_case_seed_is_the_seed_in_a_notebook_and_an_hmac_of_the_secret_when_judged():
    secret = bytes(range(32))
    want = int.from_bytes(hmac.new(secret, b"11", hashlib.sha256).digest()[:4], "big") >> 1
    assert case_seed(11) == 11  # a notebook's feedback: the seed its case names
    with drawn_from(secret):
        assert case_seed(11) == want and 0 <= want < 2**31
        drawn = torch.rand(3, generator=seeded(11))
        assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(want)))
        with drawn_from(bytes(32)):
            assert case_seed(11) != want  # another secret, another seed
        assert case_seed(11) == want  # the outer secret is back
    assert case_seed(11) == 11


@pytest.mark.parametrize("secret", [b"", b"short", "a string of 32 characters......."])
def test_drawn_from_refuses_a_secret_that_is_not_16_random_bytes(secret):
    with pytest.raises(ValueError, match="at least 16 random bytes"), drawn_from(secret):
        pass


def test_the_judge_draws_a_new_secret_at_every_grading(monkeypatch):
    """judge() draws its own secret (secrets.token_bytes) when none is given: two gradings, two secrets."""
    from minigrpo.grading import judge

    drawn = []
    monkeypatch.setattr(judge.secrets, "token_bytes", lambda n: drawn.append(n) or bytes([len(drawn)]) * n)
    seen = []
    monkeypatch.setattr(judge, "Kernel", lambda *args: type("K", (), {"close": lambda self: None})())
    monkeypatch.setattr(judge, "judge_check", lambda *args: seen.append(case_seed(0)) or {"check": "x", "not_run": ""})
    request = {"cells": [], "connection": {}, "kernel_pid": 0, "workdir": "/nonexistent", "checks": ["check_kl_k3"]}
    for _ in range(2):
        judge.judge({**request, "calls": {}})
    assert drawn == [32, 32] and len(set(seen)) == 2 and 0 not in seen


@pytest.mark.parametrize("name", CHEAP)
def test_the_references_earn_full_marks_under_ten_secrets(name):
    reference = CHECKS[name][0]
    for _ in range(10):
        with drawn_from(secrets.token_bytes(32)):
            result = evaluate(name, reference)
        assert result.points == result.max_points, [(c.name, c.message) for c in result.cases if not c.passed]


@pytest.mark.parametrize("name", sorted(SLOW))
def test_the_checks_that_train_earn_full_marks_under_a_drawn_secret(name):
    with drawn_from(secrets.token_bytes(32)):
        result = evaluate(name, CHECKS[name][0])
    assert result.points == result.max_points, [(c.name, c.message) for c in result.cases if not c.passed]


# --- the replayer -----------------------------------------------------------------------------------
def _fingerprint(value) -> str:
    """A digest of a call's arguments: tensors by their values, containers by their items, anything else by type."""
    digest = hashlib.sha256()

    def feed(item):
        if isinstance(item, torch.Tensor):
            digest.update(str((item.dtype, tuple(item.shape))).encode() + item.detach().contiguous().numpy().tobytes())
        elif isinstance(item, (list, tuple)):
            digest.update(b"[")
            for inner in item:
                feed(inner)
            digest.update(b"]")
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                digest.update(str(key).encode())
                feed(item[key])
        elif isinstance(item, (str, int, float, bool, type(None))):
            digest.update(repr(item).encode())
        elif hasattr(item, "__dict__") and not callable(getattr(item, "__func__", None)):  # a scripted input
            digest.update(type(item).__name__.encode())
            feed(vars(item))
        else:
            digest.update(type(item).__name__.encode())

    feed(value)
    return digest.hexdigest()


class Recorder:
    """Wraps the reference: keeps, per call in order, the arguments' fingerprint, the answer, and the gradient of
    answer.sum() with respect to every argument that requires grad (what a case's value_and_gradient reads)."""

    def __init__(self, reference):
        self.reference, self.calls = reference, []

    def __call__(self, *args, **kwargs):
        fingerprint = _fingerprint((args, kwargs))  # before the call, which may consume its inputs
        value = self.reference(*args, **kwargs)
        gradients = {}
        if isinstance(value, torch.Tensor) and value.requires_grad:
            wrt = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
            grads = torch.autograd.grad(value.sum(), [args[i] for i in wrt], retain_graph=True, allow_unused=True)
            gradients = {i: g for i, g in zip(wrt, grads, strict=True) if g is not None}
        answer = value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
        self.calls.append((fingerprint, answer, gradients))
        return value


class Replayer:
    """Plays a recording back in order: the recorded answer, carrying the recorded gradients (the strongest replay:
    d answer.sum() / d args[i] is what was recorded, whatever the arguments are now)."""

    def __init__(self, calls):
        self.calls, self.next, self.fingerprints = calls, 0, []

    def __call__(self, *args, **kwargs):
        self.fingerprints.append(_fingerprint((args, kwargs)))
        _, answer, gradients = self.calls[self.next % len(self.calls)]
        self.next += 1
        if not isinstance(answer, torch.Tensor):
            return copy.deepcopy(answer)
        answer = answer.clone()
        for i, gradient in gradients.items():
            if i < len(args) and isinstance(args[i], torch.Tensor) and args[i].shape == gradient.shape:
                pull = (args[i] * gradient).sum()  # its gradient with respect to args[i] is `gradient`
                answer = answer + (pull - pull.detach()) / answer.numel()
        return answer


def _per_case(name: str, secret: bytes, learner) -> list:
    """[(case result, fingerprints of the calls it made)] of check `name` under `secret`."""
    results = []
    with drawn_from(secret):
        for case in grading.CASES[name]():
            before = len(learner.calls if isinstance(learner, Recorder) else learner.fingerprints)
            result = grading.run_case(case, learner)
            calls = learner.calls if isinstance(learner, Recorder) else [(f,) for f in learner.fingerprints]
            results.append((result, [c[0] for c in calls[before:]]))
    return results


@pytest.mark.parametrize("name", CHEAP)
def test_a_replay_of_another_grading_earns_only_the_hand_made_points(name):
    """Recorded under one secret, played back under another: every case whose answers the secret changes earns 0,
    and the cases whose answers it does not change (hand-made ones, invariants) hold under half of the points."""
    first, second = secrets.token_bytes(32), secrets.token_bytes(32)
    recorder = Recorder(CHECKS[name][0])
    recorded = _per_case(name, first, recorder)
    assert all(result.passed for result, _ in recorded), [r.message for r, _ in recorded if not r.passed]
    answers_then = _answers_per_case(recorded, recorder)
    again = Recorder(CHECKS[name][0])
    answers_now = _answers_per_case(_per_case(name, second, again), again)
    replayed = _per_case(name, second, Replayer(recorder.calls))
    same = [then == now for then, now in zip(answers_then, answers_now, strict=True)]
    fixed_points = sum(r.max_points for (r, _), fixed in zip(replayed, same, strict=True) if fixed)
    drawn = [r for (r, _), fixed in zip(replayed, same, strict=True) if not fixed]
    assert fixed_points < grading.max_points(name) / 2, f"{name}: fixed answers hold {fixed_points:g} points"
    assert drawn and all(r.points == 0 for r in drawn), [(r.name, r.points) for r in drawn if r.points]
    assert sum(r.points for r, _ in replayed) <= fixed_points


def _answers_per_case(per_case: list, recorder: Recorder) -> list[str]:
    """A digest of the reference's answers (values and gradients) in each case, in order."""
    digests, start = [], 0
    for _, fingerprints in per_case:
        calls = recorder.calls[start : start + len(fingerprints)]
        start += len(fingerprints)
        digests.append(_fingerprint([(answer, sorted(gradients.items())) for _, answer, gradients in calls]))
    return digests

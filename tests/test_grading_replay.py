"""Replay-proof judging: the random cases draw their inputs from a secret the judge draws at every grading.

A notebook can record a check's answers (run the check's cases with the package's functions, in the notebook or
in another grading) and hand the check a function that plays them back in order. These tests build that replayer
in this process, as strong as it can be (it plays back values and gradients), and show that under another secret
it earns only the hand-made cases' points, a minority of every check's; and that the package's own functions earn
full marks under ten different secrets.
"""

import contextlib
import copy
import hashlib
import hmac
import secrets
from pathlib import Path

import nbformat
import pytest
import torch
from test_grading import CHECKS  # the package's reference for every check but the capstone's

from minigrpo import grading
from minigrpo.grading.framework import case_seed, drawn_from, evaluate, seeded

CAPSTONE_CHECKS = grading.EXERCISES["12_grpo_from_scratch"].checks
QUESTIONS = {"check_reward_hacking", "check_kl_directions", "check_failure_modes", "check_worked_example_step_one_loss"}
"""Checks that ask a question whose answer is a fact (which KL a loss follows, which bug a run has): nothing to
draw at random, so a recorded answer is simply the answer."""
SLOW = {"check_grpo_step", "check_step_one_loss"}
"""Checks that train the tiny Qwen: drawn like the others, run under two secrets only (below), not ten."""
CHEAP = sorted(set(CHECKS) - QUESTIONS - SLOW)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


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


# --- graded notebooks: a replay of exercise 06, and checks called by other names -----------------------
SOLVED_KL = """import torch


def kl_k3(per_token_logps, ref_per_token_logps):
    log_r = ref_per_token_logps - per_token_logps  # (N, T)
    return torch.exp(log_r) - log_r - 1
"""
REPLAY_KL = """import importlib

import torch

losses = importlib.import_module("minigrpo." + "loss" + "es")  # names built from strings: no import to read
framework = importlib.import_module("minigrpo.grading.framework")
reference = getattr(losses, "kl_" + "penalty")
answers = []


def recorder(logps, ref):
    value = reference(logps, ref, "k3")
    gradient = torch.autograd.grad(value.sum(), logps, retain_graph=True)[0] if logps.requires_grad else None
    answers.append((value.detach().clone(), gradient))
    return value


for case in framework.CASES["check_kl_k3"]():  # the check's own cases, run now, while nothing watches
    case.run(recorder)
played = []


def kl_k3(per_token_logps, ref_per_token_logps):
    value, gradient = answers[len(played) % len(answers)]
    played.append(1)
    value = value.clone()
    if gradient is not None and per_token_logps.requires_grad and gradient.shape == per_token_logps.shape:
        pull = (per_token_logps * gradient).sum()  # carries the recorded gradient
        value = value + (pull - pull.detach()) / value.numel()
    return value
"""
STAMP = nbformat.read(Path(__file__).parents[1] / "solutions" / "06_kl_k3_estimator.ipynb", as_version=4).metadata[
    "minigrpo"
]
"""The handout's stamp: which exercise, which version."""
NOTEBOOKS = {
    "replays": (REPLAY_KL, "from minigrpo.grading import check_kl_k3\n\ncheck_kl_k3(kl_k3)"),
    "aliased": (SOLVED_KL, "from minigrpo.grading import check_kl_k3 as check\n\ncheck(kl_k3)"),
    "by_getattr": (SOLVED_KL, 'import minigrpo.grading as g\n\ngetattr(g, "check_" + "kl_k3")(kl_k3)'),
}


def write_notebooks(folder) -> list:
    """The notebooks above, each stamped as exercise 06 (as its handout is), in `folder`: their paths."""
    paths = []
    for name, cells in NOTEBOOKS.items():
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
        nb.metadata["minigrpo"] = STAMP
        nbformat.write(nb, folder / f"{name}.ipynb")
        paths.append(folder / f"{name}.ipynb")
    return paths


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    paths = write_notebooks(tmp_path_factory.mktemp("replay"))
    return {report.name: report for report in grading.grade_notebooks(paths, timeout=120, jobs=2)}


def test_a_notebook_that_replays_exercise_05_earns_only_the_hand_made_point(graded):
    report = graded["replays"]
    (check,) = report.checks
    assert report.status == "ok" and check["max_points"] == 3, report.to_dict()
    earned = [(case["name"].split(":")[0].split(" (")[0], case["points"]) for case in check["cases"]]
    assert earned == [("hand-made", 1), ("random", 0), ("gradient 1 - pi_ref / pi_theta", 0)]
    assert report.points == 1 < report.max_points / 2


@pytest.mark.parametrize("name", ["aliased", "by_getattr"])
def test_a_check_called_by_another_name_is_graded(graded, name):
    report = graded[name]
    assert (report.status, report.points, report.max_points) == ("ok", 3, 3), report.to_dict()


def test_the_calls_by_an_alias_are_found_in_the_source():
    cells = [nbformat.v4.new_code_cell(source) for source in (SOLVED_KL, *NOTEBOOKS["aliased"][1:])]
    cells.append(nbformat.v4.new_code_cell("%%capture\nfrom minigrpo.grading import check_masked_mean as m\nm(f)"))
    assigned = "from minigrpo import grading\n\nsame = grading.check_rloo_advantages\nsame(g)"
    cells.append(nbformat.v4.new_code_cell(assigned))
    nb = nbformat.v4.new_notebook(cells=cells)
    assert grading.expected_checks(nb) == ["check_kl_k3", "check_masked_mean", "check_rloo_advantages"]
    assert grading.check_calls(nb) == {
        "check_kl_k3": {"cell": 1, "argument": "kl_k3"},
        "check_masked_mean": {"cell": 2, "argument": "f"},  # in a cell magic's body
        "check_rloo_advantages": {"cell": 3, "argument": "g"},  # bound by an assignment
    }


# --- the capstone: a replay of its functions' answers and of what they do to the model ---------------------
class ModelRecorder(Recorder):
    """Records, per call, the answer and the state it leaves in every model argument (weights and gradients)."""

    def __call__(self, *args, **kwargs):
        fingerprint = _fingerprint((args, kwargs))
        value = self.reference(*args, **kwargs)
        models = {i: _state(a) for i, a in enumerate(args) if isinstance(a, torch.nn.Module)}
        answer = {k: v.detach().clone() for k, v in value.items()} if isinstance(value, dict) else value
        answer = answer.detach().clone() if isinstance(answer, torch.Tensor) else copy.deepcopy(answer)
        self.calls.append((fingerprint, answer, models))
        return value


def _state(model: torch.nn.Module) -> dict:
    return {
        name: (p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
        for name, p in model.named_parameters()
    }


class ModelReplayer(Replayer):
    """Plays back the answers and the models' weights and gradients, in order."""

    def __call__(self, *args, **kwargs):
        self.fingerprints.append(_fingerprint((args, kwargs)))
        _, answer, models = self.calls[self.next % len(self.calls)]
        self.next += 1
        for i, state in models.items():
            if i < len(args) and isinstance(args[i], torch.nn.Module):
                with torch.no_grad():
                    for name, p in args[i].named_parameters():
                        weight, gradient = state[name]
                        p.copy_(weight)
                        p.grad = None if gradient is None else gradient.clone()
        return copy.deepcopy(answer)


CAPSTONE_REPLAYED = [
    "check_capstone_completion_mask",
    "check_capstone_sampler",
    "check_capstone_logps",
    "check_capstone_advantages",
    "check_capstone_loss",
    "check_capstone_gradients",
    "check_capstone_update",
]
"""The capstone's checks of functions (its learning run, 4 points, and the reading of its cells, 2, are not replayed
here: the learning run takes minutes, and the cells of a replaying notebook are its own)."""


def test_a_replay_of_the_capstone_earns_only_its_fixed_points():
    from test_capstone import FUNCTIONS, solution

    functions = solution()
    first, second = secrets.token_bytes(32), secrets.token_bytes(32)
    fixed = earned = 0.0
    for name in CAPSTONE_REPLAYED:
        recorder, again = ModelRecorder(functions[FUNCTIONS[name]]), ModelRecorder(functions[FUNCTIONS[name]])
        with torch.no_grad() if name == "check_capstone_sampler" else contextlib.nullcontext():
            recorded = _per_case(name, first, recorder)
            answers_now = _answers_per_case(_per_case(name, second, again), again)
            replayed = _per_case(name, second, ModelReplayer(recorder.calls))
        assert all(r.passed for r, _ in recorded), [(r.name, r.message) for r, _ in recorded if not r.passed]
        for (result, _), then, now in zip(replayed, _answers_per_case(recorded, recorder), answers_now, strict=True):
            if then == now or name == "check_capstone_sampler":  # the sampler's cases check guarantees, which a
                # recorded answer can meet for other prompts: counted with the fixed points
                fixed += result.max_points
            else:
                assert result.points == 0, f"{name}: {result.name} earned {result.points} replayed"
            earned += result.points
    most = sum(grading.max_points(name) for name in CAPSTONE_CHECKS)
    unreplayed = most - sum(grading.max_points(name) for name in CAPSTONE_REPLAYED)  # learning, own code: 6
    assert unreplayed == 6
    assert earned <= fixed and fixed + unreplayed < most / 2, (fixed, unreplayed, most)

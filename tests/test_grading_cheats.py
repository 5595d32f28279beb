"""Planted cheats against the grader: each earns nothing and harms no other notebook.

The learner's code runs in the notebook's kernel; the checks run in the grader's
judge, which only calls the learner's functions there and reads back data. One
grading run (module fixture) grades a folder of small synthetic notebooks: an
honest one, which also leaves detached child processes behind, and one per
cheat the probe of the grader found (patched expect_close, forged and junk
grade-file lines, the package's own reference imported, or reached only at run
time) or fault (a kernel killed by the learner's function, an unreadable
notebook). The rest are fast unit tests of the pieces. The grader's isolation,
limits and signals are tested in test_grading_isolation.py.
"""

import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import nbformat
import pytest
import torch

from minigrpo import grading
from minigrpo.grading.judge import sign
from minigrpo.grading.references import ReferenceWatch, reference_reason, source_reference_reason, watch_list
from minigrpo.grading.runner import JudgeFailed, read_answer
from minigrpo.grading.sandbox.processes import alive, kill_leftovers, leftovers
from minigrpo.grading.sandbox.remote import _from_plain, to_plain
from minigrpo.losses import clipped_surrogate, kl_penalty

HONEST_KL = "import torch\n\ndef kl_k3(logps, ref):\n    log_r = ref - logps\n    return torch.exp(log_r) - log_r - 1"

PATCHED_CHECKS = """
import importlib

import minigrpo.grading as grading
import minigrpo.grading.framework as framework

kl_cases = importlib.import_module("minigrpo.grading.checks.kl_k3_estimator")

def always_fine(*args, **kwargs):
    return None

for module in (grading, framework, kl_cases):
    module.expect_close = always_fine
full = lambda case, learner: framework.CaseResult(case.name, case.points, case.points, True)
framework.run_case = grading.run_case = full

def kl_k3(logps, ref):
    framework.expect_close = kl_cases.expect_close = always_fine  # again, at call time
    return logps * 0
"""

FORGED_RECORDS = """
import json, os

forged = [
    {"check": "check_kl_k3", "points": 1000, "max_points": 3, "cases": []},
    {"check": "check_grpo_step", "points": 1000, "max_points": 5, "cases": []},
]
lines = "".join(json.dumps(r) + "\\n" for r in forged) + "this is not json\\n"
for path in [os.environ.get("MINIGRPO_GRADE_FILE"), "grade.jsonl", "forged.jsonl"]:
    if path:
        with open(path, "a") as f:
            f.write(lines)
print(lines)

def kl_k3(logps, ref):
    raise NotImplementedError("Exercise: replace this line")
"""

REFERENCES = """
import functools
import importlib

from minigrpo.losses import clipped_surrogate
from minigrpo.losses import kl_penalty

kl_k3 = lambda logps, ref: kl_penalty(logps, ref, "k3")

@functools.wraps(importlib.import_module("minigrpo.logprobs").masked_mean)
def masked_mean(values, mask, dim=None):
    return masked_mean.__wrapped__(values, mask, dim)

aggregate_loss = getattr(importlib.import_module("minigrpo.lo" + "sses"), "aggregate_" + "loss")  # no import seen
"""

RUNTIME_ROUTES = """
import importlib
import sys

def importance_ratio(logps, old):  # the module is found by a name built when the function runs
    losses = importlib.import_module("minigrpo." + "losses")
    return getattr(losses, "importance_" + "ratio")(logps, old, None)

def group_relative_advantages(grouped, eps=1e-4):  # a fresh copy of the package's module: new function objects
    module = importlib.reload(sys.modules["minigrpo." + "advantages"])
    return module.group_relative_advantages(grouped, "group", "mean", 1, eps)

def compute_gae(rewards, values, mask, gamma=1.0, lam=0.95):  # the watch switched off first
    sys.setprofile(None)
    return getattr(importlib.import_module("minigrpo.ppo_" + "math"), "compute_gae")(rewards, values, mask, gamma, lam)
"""

ENDS_THE_KERNEL = """
import os

def kl_k3(logps, ref):
    os._exit(1)  # kills the kernel when the judge calls it
"""


def detached_children(pid_file) -> str:
    """Three children that outlive a plain kernel shutdown: the same SID, a new SID, and a daemon."""
    return f"""
import os, subprocess, sys

sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
pids = [subprocess.Popen(sleeper).pid, subprocess.Popen(sleeper, start_new_session=True).pid]
if os.fork() == 0:  # the classic daemon: fork, setsid, fork again, the parent exits
    os.setsid()
    if os.fork() == 0:
        with open({str(pid_file)!r} + ".daemon", "w") as f:
            f.write(str(os.getpid()))
        os.execv(sys.executable, sleeper)
    os._exit(0)
with open({str(pid_file)!r}, "w") as f:
    f.write(" ".join(map(str, pids)))
"""


def notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return nb


def check(name: str, argument: str) -> str:
    return f"from minigrpo.grading import {name}\n\n{name}({argument})"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the folder of planted cheats once: {notebook name: NotebookReport}, and the children's pid file."""
    folder = tmp_path_factory.mktemp("cheats")
    pid_file = folder / "children.pid"
    notebooks = {
        "patched_checks": notebook(PATCHED_CHECKS, check("check_kl_k3", "kl_k3")),
        "forged_records": notebook(FORGED_RECORDS, check("check_kl_k3", "kl_k3")),
        "references": notebook(
            REFERENCES,
            check("check_clipped_surrogate", "clipped_surrogate"),
            check("check_kl_k3", "kl_k3"),
            check("check_masked_mean", "masked_mean"),
            check("check_aggregate_loss", "aggregate_loss"),
            RUNTIME_ROUTES,  # in the same notebook: one kernel fewer to start
            check("check_importance_ratio", "importance_ratio"),
            check("check_group_relative_advantages", "group_relative_advantages"),
            check("check_compute_gae", "compute_gae"),
        ),
        "ends_the_kernel": notebook(ENDS_THE_KERNEL, check("check_kl_k3", "kl_k3")),
        "honest": notebook(detached_children(pid_file), HONEST_KL, check("check_kl_k3", "kl_k3")),
    }
    for name, nb in notebooks.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    (folder / "unreadable.ipynb").write_text('{"cells": [ this is not a notebook')
    paths = sorted(folder.glob("*.ipynb"))
    # without the sandbox: every cheat here must earn nothing, and every child be killed, where none can run too
    # (the honest notebook writes its children's pids beside it, which a sandbox would not let it see)
    reports = grading.grade_notebooks(paths, timeout=120, jobs=2, sandboxed=False)
    return {report.name: report for report in reports}, pid_file


def messages(report) -> list[str]:
    return [case["message"] for c in report.checks for case in c["cases"]] + [
        c.get("not_run", "") for c in report.checks
    ]


def test_the_honest_notebook_gets_full_marks_beside_the_cheats(graded):
    reports, _ = graded
    honest = reports["honest"]
    assert (honest.points, honest.max_points, honest.status) == (3, 3, "ok")


def test_patching_the_checks_in_the_kernel_earns_nothing(graded):
    reports, _ = graded
    patched = reports["patched_checks"]
    assert patched.errors == []  # every patch ran
    assert (patched.points, patched.max_points) == (0, 3)
    assert any("k3 of the hand-made tokens" in m for m in messages(patched))  # the judge's real comparison


def test_forged_and_junk_grade_lines_earn_nothing_and_harm_nothing(graded):
    reports, _ = graded
    forged = reports["forged_records"]
    assert [c["check"] for c in forged.checks] == ["check_kl_k3"]  # no record for a check it does not call
    assert (forged.points, forged.max_points) == (0, 3)
    assert all(m.startswith("not implemented yet") for m in messages(forged) if m)
    assert reports["honest"].points == 3  # graded in the same run


def test_the_packages_reference_earns_zero_with_the_reason(graded):
    reports, _ = graded
    report = reports["references"]
    by_check = {c["check"]: c for c in report.checks}
    assert set(by_check) >= {"check_clipped_surrogate", "check_kl_k3", "check_masked_mean", "check_aggregate_loss"}
    assert report.points == 0 and report.max_points == sum(grading.max_points(name) for name in by_check)
    for name, how in [
        ("check_clipped_surrogate", "minigrpo.losses.clipped_surrogate"),  # imported and passed as is
        ("check_kl_k3", "minigrpo.losses.kl_penalty"),  # a lambda that calls it
        ("check_masked_mean", "minigrpo.logprobs.masked_mean"),  # functools.wraps around it
        ("check_aggregate_loss", "minigrpo.losses.aggregate_loss"),  # found by name at run time
    ]:
        cases = by_check[name]["cases"]
        assert cases and all(not c["passed"] and how in c["message"] for c in cases), (name, cases)
        assert "package's own" in cases[0]["message"] and "write your own" in cases[0]["message"]


def test_the_reference_reached_only_at_run_time_earns_zero_with_the_reason(graded):
    """Routes no look at the source or the object sees: the watch in the kernel sees the reference's code run."""
    reports, _ = graded
    report = reports["references"]  # the same notebook as the imports above
    by_check = {c["check"]: c for c in report.checks}
    assert report.errors == [] and report.points == 0
    for name, message in [
        ("check_importance_ratio", "ran the package's own minigrpo.losses.importance_ratio"),
        ("check_group_relative_advantages", "ran the package's own minigrpo.advantages.group_relative_advantages"),
        ("check_compute_gae", "switched off the grader's watch"),
    ]:
        cases = by_check[name]["cases"]
        assert by_check[name]["max_points"] > 0 and len(cases) > 1, name
        assert all(not c["passed"] and message in c["message"] for c in cases), (name, cases)


def test_a_notebook_that_kills_its_kernel_or_cannot_be_read_scores_zero_alone(graded):
    reports, _ = graded
    ended = reports["ends_the_kernel"]
    assert ended.points == 0 and ended.max_points == 3
    first, *rest = messages(ended)[:3]
    assert first.startswith("your code ended the kernel")
    assert rest and all(m.startswith("not run: the kernel died during an earlier case") for m in rest)
    unreadable = reports["unreadable"]
    assert unreadable.status == "unreadable" and unreadable.points == 0 and "cannot read" in unreadable.errors[0]
    assert reports["honest"].points == 3


def test_grading_kills_every_process_the_kernel_started(graded):
    reports, pid_file = graded
    assert reports["honest"].status == "ok"  # the honest notebook also starts the children
    pids = [int(p) for p in pid_file.read_text().split()]
    daemon = pid_file.with_name(pid_file.name + ".daemon")
    for _ in range(50):  # the daemon writes its pid just after its parent exits
        if daemon.exists() and daemon.read_text():
            break
        time.sleep(0.1)
    pids.append(int(daemon.read_text()))
    assert len(pids) == 3
    assert [pid for pid in pids if alive(pid)] == []


# --- the pieces, without a kernel ---------------------------------------------------------------
def record(check, points, max_points=3.0, case_points=None):
    case_points = [points / 3] * 3 if case_points is None else case_points
    cases = [
        {"name": f"case {i}", "points": p, "max_points": max_points / 3, "passed": p > 0, "message": ""}
        for i, p in enumerate(case_points)
    ]
    return {"check": check, "points": points, "max_points": max_points, "cases": cases}


def test_records_the_notebook_does_not_call_or_that_exceed_the_maximum_are_rejected():
    expected = ["check_kl_k3", "check_masked_mean", "check_compute_gae"]
    records = [
        "junk",
        {"no": "check"},
        record("check_grpo_step", 5, 5),  # a check the notebook does not call
        record("check_kl_k3", 1000, 3, [1000, 0, 0]),  # more than the case's maximum
        record("check_kl_k3", 3),  # a second record for the same check
        record("check_masked_mean", 3),  # an honest record
        record("check_compute_gae", 4, 3, [1, 1, 1]),  # the total does not add up
    ]
    accepted, problems = grading.accept_records(records, expected)
    assert accepted["check_masked_mean"]["points"] == 3
    assert "not_run" in accepted["check_kl_k3"] and "more points than its maximum" in accepted["check_kl_k3"]["not_run"]
    assert "not_run" in accepted["check_compute_gae"]
    assert "check_grpo_step" not in accepted
    assert len(problems) == 6
    assert any("does not call" in p for p in problems)
    assert grading.accept_records("not a list", expected) == ({}, [])


def test_only_an_authenticated_judge_answer_counts():
    key, records = b"k" * 32, [record("check_kl_k3", 3)]
    genuine = json.dumps({"records": records, "mac": sign(key, records)})
    forged = [record("check_kl_k3", 1000, 3, [1000, 0, 0])]
    forgery = json.dumps({"records": forged, "mac": sign(b"x" * 32, forged)})
    assert read_answer(f"{genuine}\n{forgery}\njunk\n".encode(), key) == records  # lines written by others
    with pytest.raises(JudgeFailed, match="authentication"):
        read_answer(f"{forgery}\n".encode(), key)
    with pytest.raises(JudgeFailed):
        read_answer(b"", key)


def test_the_live_object_look_finds_the_reference_through_wrappers():
    refs = [clipped_surrogate]

    def own(ratio, advantages, low, high):
        advantages = advantages.unsqueeze(1)
        return torch.min(ratio * advantages, torch.clamp(ratio, 1 - low, 1 + high) * advantages)

    def helper(*args):
        return clipped_surrogate(*args)

    @functools.wraps(clipped_surrogate)
    def wrapped(*args):
        return own(*args)

    assert reference_reason(own, refs) is None
    assert "is the package's own minigrpo.losses.clipped_surrogate" in reference_reason(clipped_surrogate, refs)
    assert "wraps" in reference_reason(wrapped, refs)
    assert "wraps" in reference_reason(functools.partial(clipped_surrogate, epsilon_low=0.2), refs)
    assert "calls" in reference_reason(lambda *a: helper(*a), refs)  # through a helper in a closure
    assert reference_reason(own, []) is None


def test_the_source_look_follows_bindings_and_ignores_shadowing_and_other_cells():
    refs = [kl_penalty]
    cells = [
        "import minigrpo.losses as L\nfrom minigrpo.losses import kl_penalty as k",
        "def mine(a, b):\n    return (b - a).exp() - (b - a) - 1\n%time 1",
        "def cheat(a, b):\n    return helper(a, b)\ndef helper(a, b):\n    return L.kl_penalty(a, b)",
        "def shadow(k, b):\n    return k * b",  # a parameter named like the import
        "print(k)",  # uses the reference, but not inside a checked function
    ]
    assert source_reference_reason(cells, 4, "mine", refs) is None
    assert source_reference_reason(cells, 4, "shadow", refs) is None
    assert "L.kl_penalty" in source_reference_reason(cells, 4, "cheat", refs)
    assert "`k`" in source_reference_reason(cells, 4, "lambda a, b: k(a, b)", refs)
    assert source_reference_reason(cells, 1, "cheat", refs) is None  # not defined yet at that cell


def test_the_run_time_look_sees_the_reference_run_by_any_route():
    from minigrpo import losses
    from minigrpo.trainer import GRPOTrainer

    watched = watch_list([kl_penalty, GRPOTrainer, {"an answer key": "data, not run"}])
    assert [w["name"] for w in watched] == ["minigrpo.losses.kl_penalty", "minigrpo.trainer.GRPOTrainer"]
    assert ["grpo_step" in [code[2] for code in w["codes"]] for w in watched] == [False, True]
    fresh = {}  # the module's source run again, as importlib.reload does: new code objects, same file and lines
    exec(compile(Path(losses.__file__).read_text(), losses.__file__, "exec"), fresh)
    copy = types.FunctionType(kl_penalty.__code__, {**kl_penalty.__globals__}, "mine")
    logps, ref = torch.randn(2, 3), torch.randn(2, 3)

    def by_a_string(a, b):
        return getattr(importlib.import_module("minigrpo." + "losses"), "kl_" + "penalty")(a, b, "k3")

    def switched_off(a, b):
        sys.setprofile(None)
        return kl_penalty(a, b, "k3")

    routes = {
        "own": lambda a, b: torch.exp(b - a) - (b - a) - 1,
        "by a string": by_a_string,
        "a copy of its code": lambda a, b: copy(a, b, "k3"),
        "a fresh copy of its module": lambda a, b: fresh["kl_penalty"](a, b, "k3"),
        "switched off": switched_off,
    }
    seen = {}
    for name, function in routes.items():
        with ReferenceWatch(watched) as watch:
            function(logps, ref)
        seen[name] = (watch.ran, watch.intact)
    ran = ("minigrpo.losses.kl_penalty", True)
    assert seen == {
        "own": (None, True),
        "by a string": ran,
        "a copy of its code": ran,
        "a fresh copy of its module": ran,
        "switched off": (None, False),
    }
    assert sys.getprofile() is None  # the hook is gone after each block


def test_a_decorated_reference_is_watched_by_its_own_code_not_its_wrappers():
    from minigrpo.logprobs import batched_per_token_logps
    from minigrpo.models import load_model_and_tokenizer
    from minigrpo.trainer import GRPOTrainer

    (watched,) = watch_list([GRPOTrainer])
    assert "evaluation_loss" in [code[2] for code in watched["codes"]]  # a @torch.no_grad() method, unwrapped
    assert "decorate_context" not in [code[2] for code in watched["codes"]]  # torch's wrapper, which every such runs
    model, _ = load_model_and_tokenizer("tiny")
    ids = torch.tensor([[5, 6, 7, 8]])
    with ReferenceWatch([watched]) as watch:  # another @torch.no_grad() function of the package, which a learner calls
        batched_per_token_logps(model, ids, torch.ones_like(ids), 2, batch_size=1)
    assert (watch.ran, watch.intact) == (None, True)


def test_answers_cross_as_plain_data_only():
    import numpy

    class Sneaky(torch.Tensor):
        pass

    value = {
        "t": torch.ones(2).as_subclass(Sneaky),
        "n": numpy.float64(0.5),
        "a": numpy.arange(3),
        "g": (x for x in [1.0, 2.0]),
        "o": object(),
    }
    plain = to_plain(value)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"plain-{os.getpid()}.pt")
    torch.save(plain, path)
    try:
        loaded = _from_plain(torch.load(path, weights_only=True))
    finally:
        os.unlink(path)
    assert type(loaded["t"]) is torch.Tensor and loaded["n"] == 0.5 and type(loaded["n"]) is float
    assert loaded["a"].tolist() == [0, 1, 2] and loaded["g"] == [1.0, 2.0]
    assert type(loaded["o"]).__name__ == "object" and isinstance(loaded["o"], grading.sandbox.remote.Opaque)
    with pytest.raises(TypeError):
        float(loaded["o"])


def test_kill_leftovers_finds_children_by_sid_and_by_token():
    token = "test-token-" + str(os.getpid())
    env = {**os.environ, grading.GRADING_RUN_ENV: token}
    sleeper = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"]
    marked = subprocess.Popen(sleeper, env=env, start_new_session=True, stdout=subprocess.PIPE)
    unmarked = subprocess.Popen(sleeper, start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert marked.stdout.readline() == unmarked.stdout.readline() == b"ready\n"  # past exec and setsid
        assert marked.pid in leftovers(None, grading.GRADING_RUN_ENV, token)
        assert leftovers(unmarked.pid, grading.GRADING_RUN_ENV, "no such token") == [unmarked.pid]
        killed = kill_leftovers(None, grading.GRADING_RUN_ENV, token)
        assert killed == [marked.pid] and marked.wait(timeout=10) == -signal.SIGKILL
        assert unmarked.poll() is None  # not marked, not under the SID asked for
    finally:
        for child in (marked, unmarked):
            child.kill()
            child.wait()
            child.stdout.close()


def test_a_learner_error_in_the_kernel_reads_like_a_local_one():
    case = grading.Case("raises", 1, lambda learner: learner())

    def raises():
        raise grading.LearnerError("ValueError: boom")

    def stub():
        raise grading.LearnerError("NotImplementedError: Exercise", not_implemented=True)

    assert grading.run_case(case, raises).message == "your code raised ValueError: boom"
    assert grading.run_case(case, stub).message.startswith("not implemented yet (NotImplementedError: Exercise)")
    assert json.dumps(grading.evaluate("check_kl_k3", raises, "refused").to_dict())  # records are JSON

"""The judge's time: its checks' cases' own limits, whatever is left of the notebook's; a slow case costs its points.

A solved capstone whose training is slow in the graded run used to lose every point: the judge's time ended with
the notebook's limit, before the learning case's own limit, and took the records with it. Now the runner gives the
judge at least the sum of its checks' own limits (`runner.judge_budget`), each check gets at least its own
(`judge.check_deadline`), and the judge's records are kept check by check.
"""

import time

import pytest
import torch

from minigrpo.advantages import group_baseline, group_relative_advantages
from minigrpo.grading import CASES, EXERCISES, judge
from minigrpo.grading.checks.labs import CAPSTONE_LEARNING
from minigrpo.grading.framework import CASE_TIMEOUT_S, DESCRIBE_S, Case, time_needed
from minigrpo.grading.runner import JUDGE_MARGIN_S, JUDGE_START_S, judge_budget


def test_time_needed_is_the_cases_own_limits_and_the_first_answer():
    assert time_needed("check_kl_k3") == DESCRIBE_S + 3 * CASE_TIMEOUT_S == 70
    assert time_needed("check_capstone_learns") == DESCRIBE_S + CAPSTONE_LEARNING["timeout"] == 910


def test_the_judge_gets_its_checks_own_limits_however_little_of_the_notebook_s_is_left():
    assert judge_budget(["check_kl_k3"], 5.0) == 70 + JUDGE_START_S + JUDGE_MARGIN_S
    assert judge_budget(["check_kl_k3"], 500.0) == 500.0  # more left: all of it
    capstone = EXERCISES["12_grpo_from_scratch"].checks
    own = sum(time_needed(name) for name in capstone)
    assert judge_budget(capstone, 0.0) == own + JUDGE_START_S + JUDGE_MARGIN_S > CAPSTONE_LEARNING["timeout"]


def test_each_check_gets_its_own_limits_when_its_equal_share_is_less():
    now = time.monotonic()
    learning = judge.check_deadline("check_capstone_learns", now + 1000, checks_left=2) - now
    assert 909 < learning < 911  # its equal share would be 500 s
    assert 499 < judge.check_deadline("check_kl_k3", now + 1000, checks_left=2) - now < 501  # the share is more
    assert judge.check_deadline("check_capstone_learns", now + 100, checks_left=1) <= now + 100  # never past the end


class Local:
    """A stand-in for the judge's KernelFunction: calls a function of this process."""

    def __init__(self, function):
        self.function, self.refusal = function, None

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)


@pytest.fixture
def quick_cases(monkeypatch):
    """Exercise 04's cases, each with a 1 s limit (a slow case is then one that sleeps 3 s)."""
    for name in ("check_group_relative_advantages", "check_rloo_advantages"):
        builder = CASES[name]

        def quick(builder=builder):
            return [Case(c.name, c.points, c.run, timeout=1.0) for c in builder()]

        monkeypatch.setitem(CASES, name, quick)


def in_process_request(monkeypatch, learners: dict, cells: list) -> dict:
    """The judge's request for `learners` ({check name: function}), judged in this process (no kernel: each check
    calls its function here), with the notebook's limit spent (0.1 s left)."""
    monkeypatch.setattr(judge, "Kernel", lambda *args: type("Kernel", (), {"close": lambda self: None})())
    monkeypatch.setattr(judge, "describe", lambda *args, **kwargs: {"registered": True})
    monkeypatch.setattr(judge, "KernelFunction", lambda kernel, check, watched: Local(learners[check]))
    checks = list(learners)
    return {
        "cells": cells,
        "connection": {},
        "kernel_pid": 0,
        "workdir": "/nonexistent",
        "checks": checks,
        "calls": {},
        "deadline": time.time() + judge_budget(checks, 0.1) - JUDGE_MARGIN_S,
    }


def test_a_slow_case_costs_its_own_points_and_the_next_check_is_still_judged(quick_cases, monkeypatch):
    """The notebook's limit is spent (0.1 s left): the runner's budget still gives each check its own time; the
    slow case (3 s on G = 2 groups, its limit 1 s) loses its point, every other case is judged and kept."""

    def slow_on_pairs(grouped, eps=1e-4):
        if grouped.shape[1] == 2:
            time.sleep(3)
        return group_relative_advantages(grouped, eps=eps)

    learners = {
        "check_group_relative_advantages": slow_on_pairs,
        "check_rloo_advantages": lambda r: r - group_baseline(r, "rloo"),
    }
    request = in_process_request(monkeypatch, learners, cells=[])
    checks, seen = request["checks"], []
    with torch.no_grad():
        records = judge.judge(request, done=lambda records: seen.append([r["check"] for r in records]))
    slow, fast = records
    assert [(c["name"].split(" (")[0], c["points"]) for c in slow["cases"]] == [
        ("the worked example", 1),
        ("random groups, B=6 G=8", 1.5),
        ("groups whose rewards are all equal get 0, not NaN", 0.5),
        ("G=2, eps=1e-2", 0),
    ]
    assert slow["cases"][-1]["message"].startswith("timed out")
    assert (fast["points"], fast["max_points"]) == (2, 2)
    assert seen == [checks[:1], checks]  # each check's record sent as it finished


def test_a_slow_capstone_loses_only_its_learning_points(monkeypatch):
    """A solved capstone whose loop trains too slowly for the learning case's limit (here 2 s; graded, 900 s) loses
    that case's 4 points; the checks before and after it are judged and kept, the notebook's limit already spent."""
    from test_capstone import CELLS, solution

    functions = solution()

    def slow_train_grpo(*args):
        time.sleep(30)

    learners = {
        "check_capstone_advantages": functions["group_advantages"],
        "check_capstone_learns": slow_train_grpo,
        "check_capstone_own_code": functions["train_grpo"],
    }
    monkeypatch.setitem(CAPSTONE_LEARNING, "timeout", 2.0)
    request = in_process_request(monkeypatch, learners, cells=CELLS)
    started = time.monotonic()
    advantages, learns, own_code = judge.judge(request)
    assert time.monotonic() - started < 20  # the sleeping loop was stopped at its limit
    assert (advantages["points"], own_code["points"]) == (advantages["max_points"], own_code["max_points"]) == (3, 2)
    assert (learns["points"], learns["max_points"]) == (0, 4)
    assert learns["cases"][0]["message"].startswith("timed out")

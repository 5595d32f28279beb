"""time_limits.time_limit on every platform: SIGALRM in a POSIX main thread, a watchdog thread elsewhere (Windows,
worker threads, Jupyter's threads), with the same contract: error() inside the block once `seconds` have passed,
nothing after a block that ended in time."""

import signal
import threading
import time

import pytest

import minigrpo.rollout
from minigrpo.rollout import render_prompts
from minigrpo.time_limits import time_limit


class Late(Exception):
    pass


def busy(seconds: float) -> int:
    """Python bytecode for `seconds` (what an async exception can interrupt, unlike one long C call)."""
    end, turns = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        turns += 1
    return turns


def in_thread(func):
    """func() in a worker thread; returns what it returned or raised."""
    outcome = {}

    def run():
        try:
            outcome["value"] = func()
        except BaseException as error:  # noqa: BLE001 - the test reads it
            outcome["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    return outcome


@pytest.fixture(params=["main thread", "worker thread", "no SIGALRM (Windows)"])
def where(request, monkeypatch):
    """Runs a function where time_limit must work: a POSIX main thread, a worker thread, a platform without
    setitimer (signal.setitimer removed, as on Windows)."""
    if request.param == "no SIGALRM (Windows)":
        monkeypatch.delattr(signal, "setitimer")
    if request.param == "worker thread":
        return in_thread
    return lambda func: _outcome(func)


def _outcome(func):
    try:
        return {"value": func()}
    except BaseException as error:  # noqa: BLE001
        return {"error": error}


def test_a_block_that_runs_too_long_gets_the_error(where):
    def timed():
        started = time.perf_counter()
        with time_limit(0.2, lambda: Late("took too long")):
            busy(10)
        return time.perf_counter() - started

    outcome = where(timed)
    assert isinstance(outcome.get("error"), Late), outcome
    assert str(outcome["error"]) == "took too long"


def test_a_block_that_ends_in_time_is_never_interrupted_later(where):
    def timed():
        with time_limit(0.2, lambda: Late("took too long")):
            value = 41 + 1
        busy(0.5)  # well past the limit, outside the block
        return value

    assert where(timed) == {"value": 42}


def test_the_errors_of_the_block_pass_through(where):
    def timed():
        with time_limit(5, lambda: Late("took too long")):
            raise KeyError("the block's own")

    assert isinstance(where(timed)["error"], KeyError)


def test_no_limit_for_zero_seconds():
    with time_limit(0, lambda: Late("never")):
        busy(0.05)


def test_the_chat_template_bound_holds_in_a_worker_thread(tiny, monkeypatch):
    """A chat template that would loop for hours, rendered off the main thread (where no signal handler runs)."""
    _, tokenizer = tiny
    tokenizer.chat_template = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    monkeypatch.setattr(minigrpo.rollout, "CHAT_TEMPLATE_SECONDS", 0.2)
    started = time.perf_counter()
    outcome = in_thread(lambda: render_prompts(tokenizer, [[{"role": "user", "content": "What is 1 + 1?"}]]))
    assert isinstance(outcome.get("error"), TimeoutError), outcome
    assert "chat template took more than 0.2 s to render prompt 0" in str(outcome["error"])
    assert time.perf_counter() - started < 5

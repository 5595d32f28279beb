"""A time limit on a block of code: `with time_limit(seconds, error): ...` raises error() inside the block.

It bounds the chat template's rendering of each prompt (`rollout.render_prompts`, CHAT_TEMPLATE_SECONDS) and a
learner's function in each case of a check (`grading.framework.run_case`), on any platform and in any thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import threading
from collections.abc import Callable


@contextlib.contextmanager
def time_limit(seconds: float, error: Callable[[], BaseException]):
    """Raise error() inside the block if it runs longer than `seconds`; seconds <= 0: no limit.

    In the main thread of a POSIX process, a SIGALRM timer: its handler raises between two bytecodes, and a sleep
    or a blocking read is interrupted too. Elsewhere (Windows, which has no SIGALRM; a worker thread, where no
    signal handler runs; Jupyter's kernel threads) a watchdog thread raises the error in the block's thread at its
    next bytecode (CPython's PyThreadState_SetAsyncExc). A thread cannot be killed, so there a block stuck in one
    long C call (a sleep, a regex, a lock) is stopped only when that call returns, and a block that catches
    BaseException can swallow the error."""
    if seconds <= 0:
        yield
    elif hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        with _alarm_limit(seconds, error):
            yield
    else:
        with _watchdog_limit(seconds, error):
            yield


@contextlib.contextmanager
def _alarm_limit(seconds: float, error: Callable[[], BaseException]):
    def expire(signum, frame):
        raise error()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Expired(BaseException):
    """What the watchdog raises in the timed thread; time_limit turns it into the caller's error()."""


@contextlib.contextmanager
def _watchdog_limit(seconds: float, error: Callable[[], BaseException]):
    """time_limit without signals: a threading.Timer raises _Expired in this thread unless the block ended first
    (the lock makes "ended" and "fire" exclusive, so a block that ended in time is never interrupted after)."""
    target, lock, state = threading.get_ident(), threading.Lock(), {"running": True, "fired": False}

    def fire():
        with lock:
            if state["running"]:
                state["fired"] = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(_Expired))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        try:
            yield
        finally:
            with lock:
                state["running"] = False
            timer.cancel()
            if state["fired"]:  # fired as the block ended and not delivered yet: it must not surface after the block
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), None)
    except _Expired:
        raise error() from None
    if state["fired"]:  # the block ran past its time and ended before the exception reached it
        raise error()

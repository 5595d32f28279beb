"""The learner's function, called in its own kernel by the grader's judge: arguments in, plain data out.

The judge (`minigrpo.grading.judge`) runs a check's cases in its own process.
Where a case calls the learner's function, it calls a `KernelFunction`
instead, which asks the notebook's kernel to run `serve`:

    judge                                      kernel (the learner's process)
    -----                                      ------------------------------
    pickle (args, kwargs, RNG state) -> file   serve(check, request, response):
    execute `serve(...)` in the kernel  ---->    GRADED[check](*args, **kwargs)
    torch.load(response, weights_only=True) <-   torch.save(plain data) -> file

Nothing crosses back but data: tensors, numbers, strings, lists, tuples and
dicts, read with `weights_only=True`, which builds no other object and runs no
code. Whatever the kernel sends is therefore only ever the learner's *answer*
(the judge computes the expected one and the points), and a learner who
reprograms `serve` can only choose that answer. What a case needs besides the
return value comes back as data too: the state of the modules, optimizers and
tensors it passed (a GRPO step updates the model's weights and the optimizer),
torch's RNG state (so seeded sampling matches the reference; Python's and numpy's go in, not back), and for
`value_and_gradient` the gradient, computed in the kernel because an autograd
graph cannot cross processes.
"""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import time
from pathlib import Path

import torch

from minigrpo.grading.framework import GRADED, LearnerError, NoAnswer, RemoteCallable, last_traceback_line

INTERRUPT_WAIT_S = 3.0
"""How long an interrupted learner's function has to stop before its kernel is given up on (the grader's judge
keeps this much of a notebook's time limit in hand: `runner.JUDGE_MARGIN_S`)."""
MAX_RESPONSE_BYTES = 256 * 2**20
"""A bigger answer is refused (the judge would have to hold it in memory): no exercise returns more than a few MB."""


# --- the kernel side --------------------------------------------------------------------------
def serve(check: str, request_path: str, response_path: str) -> None:
    """Run one request of the judge on the function the notebook passed to `check`; save the answer as plain data."""
    with open(request_path, "rb") as f:
        request = pickle.load(f)  # written by the judge: trusted here
    if request["kind"] == "describe":
        response = _describe(check)
    else:
        response = _call(GRADED[check], request)
    torch.save(response, response_path)


def _describe(check: str) -> dict:
    if check not in GRADED:
        return {"registered": False}
    from minigrpo.grading.framework import refusal_reason

    learner = GRADED[check]
    return {"registered": True, "type": type(learner).__name__, "refusal": refusal_reason(check, learner)}


def _call(learner, request: dict) -> dict:
    from minigrpo.grading.references import ReferenceWatch  # it imports framework, as this module does

    args, kwargs = request["args"], request["kwargs"]
    torch.set_rng_state(request["rng"])
    set_host_random_states(request.get("host_random"))
    threads = torch.get_num_threads()
    torch.set_num_threads(request["threads"])
    watch = ReferenceWatch(request.get("watch", []))
    try:
        with watch:
            if request["gradient_wrt"] is None:
                value, gradient = learner(*args, **kwargs), None
            else:
                from minigrpo.grading.framework import value_and_gradient

                value, gradient = value_and_gradient(learner, request["gradient_wrt"], *args)
    except KeyboardInterrupt:  # the judge's time limit: let the kernel stop
        raise
    except BaseException as error:  # SystemExit too: a learner's exit() is a failed case
        response = {"raised": last_traceback_line(error), "not_implemented": isinstance(error, NotImplementedError)}
        return {**response, "reference_ran": watch.ran, "watch_intact": watch.intact, "process": watch.process}
    finally:
        torch.set_num_threads(threads)
    return {
        "value": to_plain(value),
        "gradient": to_plain(gradient),
        "state": {key: _state(arg) for key, arg in _arguments(args, kwargs) if _state(arg) is not None},
        "rng": torch.get_rng_state(),
        "reference_ran": watch.ran,
        "watch_intact": watch.intact,
        "process": watch.process,
    }


def host_random_states() -> dict:
    """The states of Python's `random` and numpy's global generator (when numpy is installed): a learner's loop may
    shuffle with either, and a case that calls it twice from the same states expects the same draws."""
    import random

    states = {"random": random.getstate()}
    try:
        import numpy
    except ImportError:
        return states
    return {**states, "numpy": numpy.random.get_state()}


def set_host_random_states(states: dict | None) -> None:
    """Set what `host_random_states` returned (None: leave both generators as they are)."""
    import random

    if states is None:
        return
    random.setstate(states["random"])
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])


def _arguments(args: tuple, kwargs: dict):
    return itertools.chain(enumerate(args), kwargs.items())


def _state(arg):
    """What the learner's function may have changed in an argument, as plain data (None: nothing to send back)."""
    if isinstance(arg, torch.nn.Module):
        return {
            "parameters": {n: p.detach().clone() for n, p in arg.named_parameters()},
            "gradients": {n: p.grad.detach().clone() for n, p in arg.named_parameters() if p.grad is not None},
            # every name, shared ones too: a buffer that the kernel's forward made one tensor with another (LongRoPE's
            # inv_freq and original_inv_freq) is still a buffer of its own in the judge's copy
            "buffers": {n: b.detach().clone() for n, b in arg.named_buffers(remove_duplicate=False)},
        }
    if isinstance(arg, torch.optim.Optimizer):
        return {"optimizer": to_plain(arg.state_dict())}
    if isinstance(arg, torch.Tensor):
        return {"tensor": arg.detach().clone()}
    return None


def to_plain(value, depth: int = 0):
    """`value` as data that `torch.load(weights_only=True)` reads: tensors, numbers, strings, lists, tuples, dicts.

    numpy scalars become Python numbers and arrays tensors, other iterables lists; anything else is sent as its
    type's name and repr (the case then fails, as it would on that object, with a message naming the type).
    """
    if depth > 20:
        return _opaque(value)
    if value is None or type(value) in (bool, int, float, str, complex):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone().as_subclass(torch.Tensor)
    for plain in (bool, int, float, str):  # subclasses, numpy.float64 among them
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, dict):
        return {to_plain(k, depth + 1): to_plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [to_plain(v, depth + 1) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if type(value).__module__ == "numpy":
        import numpy

        array = numpy.asarray(value)
        if array.dtype.kind in "biuf":
            return array.item() if array.ndim == 0 else torch.from_numpy(array.copy())
    if hasattr(value, "__iter__") and not isinstance(value, (bytes, torch.nn.Module)):
        return [to_plain(v, depth + 1) for v in value]
    return _opaque(value)


def _opaque(value) -> dict:
    return {"__opaque__": type(value).__name__, "repr": repr(value)[:200]}


# --- the judge side ---------------------------------------------------------------------------
class Opaque:
    """Something the learner returned that is not data (its type and repr): every comparison with it fails."""

    def __repr__(self) -> str:
        return self._repr


def _from_plain(value):
    if isinstance(value, dict):
        if "__opaque__" in value:
            opaque = type(str(value["__opaque__"]), (Opaque,), {})()  # type(x).__name__ reads as the learner's
            opaque._repr = str(value.get("repr", ""))
            return opaque
        return {k: _from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_from_plain(v) for v in value)
    return value


class KernelGone(NoAnswer):
    """The kernel can no longer answer (it died, or an earlier call never returned): the case fails with this."""


class Kernel:
    """A connection to the notebook's kernel, after the notebook ran: it answers `serve` requests.

    connection: the kernel's connection info (jupyter_client); pid: its process, watched for death;
    workdir: a folder for request and response files; interrupt_mode: "signal" (SIGINT to `pid`) or "message"
    (an interrupt_request on the control channel: a sandboxed kernel's pid is its sandbox's, which passes no signal on).
    """

    def __init__(self, connection: dict, pid: int, workdir: Path, interrupt_mode: str = "signal"):
        from jupyter_client.blocking import BlockingKernelClient

        from minigrpo.grading.sandbox.limits import capped_context

        self.client = BlockingKernelClient(context=capped_context())  # a reply over MAX_MESSAGE_BYTES is dropped
        self.client.load_connection_info(connection)
        by_message = interrupt_mode == "message"
        self.client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=by_message)
        self.pid, self.workdir, self.broken, self.by_message = pid, workdir, None, by_message
        self._ids = itertools.count()

    def close(self) -> None:
        self.client.stop_channels()
        self.client.context.destroy(linger=0)

    def request(self, check: str, payload: dict, timeout: float | None = None):
        """Send one request to `serve` and return its response (plain data); raise NoAnswer or LearnerError."""
        if self.broken:
            raise KernelGone(self.broken)
        number = next(self._ids)
        request_path, response_path = self.workdir / f"request-{number}", self.workdir / f"response-{number}"
        with open(request_path, "wb") as f:
            pickle.dump(payload, f)
        code = (
            f"__import__('minigrpo.grading.sandbox.remote', fromlist=['serve']).serve("
            f"{check!r}, {str(request_path)!r}, {str(response_path)!r})"
        )
        message_id = self.client.execute(code, silent=True, store_history=False, allow_stdin=False)
        try:
            reply = self._wait(message_id, timeout)
        except KernelGone:  # dead, or not answering: nothing to stop
            raise
        except BaseException:  # the case's time limit (CheckTimeout): stop the learner's function
            self._interrupt(message_id)
            raise
        finally:
            request_path.unlink(missing_ok=True)
        if reply["content"]["status"] != "ok":
            content = reply["content"]
            response_path.unlink(missing_ok=True)
            raise NoAnswer(f"your function did not complete: {content.get('ename')}: {content.get('evalue')}")
        return self._read(response_path)

    def _wait(self, message_id: str, timeout: float | None) -> dict:
        from minigrpo.grading.sandbox.processes import alive

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is not None and time.monotonic() > deadline:
                self.broken = f"not run: the kernel did not answer within {timeout:g} s (still busy?)"
                raise KernelGone(self.broken)
            try:
                reply = self.client.get_shell_msg(timeout=0.2)
            except Exception:  # queue.Empty: nothing yet
                if not alive(self.pid):
                    self.broken = (
                        "not run: the kernel died during an earlier case (os._exit, a crash, or out of memory)"
                    )
                    raise KernelGone("your code ended the kernel (os._exit, a crash, or out of memory)") from None
                continue
            if reply.get("parent_header", {}).get("msg_id") == message_id:
                return reply

    def _interrupt(self, message_id: str) -> None:
        """Interrupt the kernel (KeyboardInterrupt in the learner's function); if it stays busy, give up on it."""
        try:
            if self.by_message:
                self.client.control_channel.send(self.client.session.msg("interrupt_request", content={}))
            else:
                os.kill(self.pid, signal.SIGINT)
            self._wait(message_id, timeout=INTERRUPT_WAIT_S)
        except (OSError, KernelGone):
            self.broken = "not run: an earlier case never returned (the kernel is still running your function)"

    def _read(self, path: Path):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise NoAnswer("the kernel sent no answer (was minigrpo.grading.sandbox.remote changed?)") from None
        try:
            if size > MAX_RESPONSE_BYTES:
                raise NoAnswer(f"your function's answer is {size / 2**20:.0f} MB: too large to grade")
            try:
                return torch.load(path, weights_only=True)
            except Exception as error:
                message = f"your function's answer cannot be read as data ({last_traceback_line(error)})"
                raise NoAnswer(message) from None
        finally:
            path.unlink(missing_ok=True)


class KernelFunction(RemoteCallable):
    """Stands in the judge for the function the notebook passed to `check`; each call runs it in the kernel.

    watch: `references.watch_list(...)` of the check's references, watched while each call runs. Once a call ran
    one (or switched the watch off), `refusal` says so and later calls fail at once with it.
    """

    def __init__(self, kernel: Kernel, check: str, watch: list[dict] = ()):
        self.kernel, self.check, self.watch = kernel, check, list(watch)
        self.refusal: str | None = None

    def __call__(self, *args, **kwargs):
        return self._call(args, kwargs, None)[0]

    def value_and_gradient(self, wrt: int, *args):
        return self._call(args, {}, wrt)

    def _call(self, args: tuple, kwargs: dict, gradient_wrt: int | None):
        from minigrpo.grading.references import WATCH_OFF_MESSAGE, process_message, runtime_message

        if self.refusal:
            raise NoAnswer(self.refusal)
        payload = {
            "kind": "call",
            "args": args,
            "kwargs": kwargs,
            "rng": torch.get_rng_state(),
            "host_random": host_random_states(),
            "threads": torch.get_num_threads(),
            "gradient_wrt": gradient_wrt,
            "watch": self.watch,
        }
        response = self.kernel.request(self.check, payload)
        if not isinstance(response, dict):
            raise NoAnswer("the kernel's answer is not a response (was minigrpo.grading.sandbox.remote changed?)")
        if response.get("reference_ran"):
            self.refusal = runtime_message(str(response["reference_ran"]))
        elif self.watch and response.get("process"):
            self.refusal = process_message(str(response["process"]))
        elif self.watch and response.get("watch_intact") is not True:
            self.refusal = WATCH_OFF_MESSAGE
        if self.refusal:
            raise NoAnswer(self.refusal)
        if "raised" in response:
            raise LearnerError(str(response["raised"]), bool(response.get("not_implemented")))
        try:
            torch.set_rng_state(response["rng"])
            for key, state in response["state"].items():
                _apply_state(args[key] if isinstance(key, int) else kwargs[key], state)
        except Exception as error:
            message = f"the kernel's answer does not fit the arguments ({last_traceback_line(error)})"
            raise NoAnswer(message) from None
        return _from_plain(response.get("value")), _from_plain(response.get("gradient"))


def _apply_state(arg, state: dict) -> None:
    """Make the judge's copy of an argument what the learner's function left in the kernel's copy."""
    with torch.no_grad():
        if isinstance(arg, torch.nn.Module):
            for name, parameter in arg.named_parameters():
                parameter.copy_(state["parameters"][name])
                gradient = state["gradients"].get(name)
                parameter.grad = None if gradient is None else gradient.to(parameter.dtype).reshape(parameter.shape)
            for name, buffer in arg.named_buffers(remove_duplicate=False):
                buffer.copy_(state["buffers"][name])
        elif isinstance(arg, torch.optim.Optimizer):
            arg.load_state_dict(state["optimizer"])
        elif isinstance(arg, torch.Tensor):
            arg.copy_(state["tensor"])


def describe(kernel: Kernel, check: str, timeout: float = 60) -> dict:
    """What the notebook passed to `check`, seen in the kernel: {"registered", "type", "refusal" (str | None)}."""
    response = kernel.request(check, {"kind": "describe"}, timeout=timeout)
    if not isinstance(response, dict):
        raise NoAnswer("the kernel's answer is not a response (was minigrpo.grading.sandbox.remote changed?)")
    return response

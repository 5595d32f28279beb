"""The notebook's kernel as the grader runs it: files of its own, capped messages, no frontend.

- The kernel's stdin, stdout and stderr are /dev/null, never the grader's: what a
  cell writes to file descriptor 1 or 2 (`os.write(1, ...)`, `os.system("echo
  ...")`, `sys.__stdout__`) reaches the grader only as the kernel's output
  messages (ipykernel captures those descriptors), counted against the caps of
  `minigrpo.grading.sandbox.limits`, and never reaches the grader's own output.
- Its kernel spec, its connection file (which holds the kernel's key) and its
  TMPDIR are in a folder the runner makes for the notebook inside the grader's
  temporary folder, and removes however grading ends.
- The grader's connection refuses a message over MAX_MESSAGE_BYTES
  (ZMQ_MAXMSGSIZE): a cell that prints a gigabyte at once is dropped before the
  grader holds it.
- Widgets' messages (comms) are ignored: the grader saves no notebook.
- The kernel is started and stopped here, not by nbclient's `async_setup_kernel`,
  whose SIGINT and SIGTERM handlers stop the kernel and let grading go on
  (`minigrpo.grading.sandbox.processes.Interrupts` stops grading instead). A cell
  that a signal cancels leaves no task of nbclient's running: `stop_kernel` ends
  its poll of the kernel, which would fail once the kernel is gone.

Imported only when a notebook is graded: jupyter_client, nbclient and zmq come
with the package's `notebooks` / `test` extras, and a learner's
`from minigrpo.grading import check_x` must not need them.
"""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import zmq.asyncio
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from minigrpo.grading.sandbox import limits
from minigrpo.grading.sandbox.limits import MAX_MESSAGE_BYTES, OutputBudget, capped_context, output_size, trim_error


class _CappedKernelManager(AsyncKernelManager):
    """A kernel manager whose clients share its capped context (jupyter_client would give each a new one)."""

    def client(self, **kwargs):
        return super().client(context=self.context, **kwargs)


def kernel_manager(folder: Path, sandbox: Callable[[list[str]], list[str]] | None = None) -> AsyncKernelManager:
    """A kernel of the Python running the grader (not whatever 'python' is on PATH), its files in `folder`.

    sandbox: turns the kernel's command into the sandboxed one (`bubblewrap.sandboxed`); the kernel then talks over
    IPC sockets in `folder` (TCP does not cross its network namespace) and is interrupted by a message (the
    sandbox does not pass SIGINT on)."""
    spec_dir = folder / "kernels" / "minigrpo-grader"
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "minigrpo grader", "language": "python"}
    sockets = {}
    if sandbox is not None:
        spec = {**spec, "argv": sandbox(argv), "interrupt_mode": "message"}
        sockets = {"transport": "ipc", "ip": str(folder / "k")}  # k-1, k-2, ...: a short path (108 bytes at most)
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return _CappedKernelManager(
        kernel_name="minigrpo-grader",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder / "kernels")]),
        connection_file=str(folder / "connection.json"),
        context=capped_context(zmq.asyncio.Context),
        **sockets,
    )


class GradingClient(NotebookClient):
    """nbclient's executor, keeping at most `budget` of the cells' output and ignoring widgets.

    `finished` lists the cells whose end (the kernel's "idle" status) came through the output connection;
    `timed_out` the cells that ran past the client's timeout: nbclient interrupted them (KeyboardInterrupt) and
    went on (`responsive` tells whether the kernel stopped them).
    """

    budget: OutputBudget
    finished: set[int]
    timed_out: list[int]
    polls: set[asyncio.Task]

    async def _async_poll_kernel_alive(self) -> None:
        """nbclient's poll of the kernel while a cell runs, kept in `polls` for `stop_kernel` to end: nbclient leaves
        it running when the cell is cancelled (SIGINT, SIGTERM), and its next look at the stopped client fails, which
        asyncio prints as "Task exception was never retrieved ... AssertionError"."""
        task = asyncio.current_task()
        self.polls.add(task)
        try:
            await super()._async_poll_kernel_alive()
        finally:
            self.polls.discard(task)

    def note_timeout(self, cell, cell_index, execute_reply) -> None:
        """nbclient's on_cell_executed hook: a cell whose reply is the timeout's stand-in ran out of time."""
        if execute_reply["content"].get("ename") == CELL_TIMED_OUT:
            self.timed_out.append(cell_index)

    def process_message(self, msg, cell, cell_index):
        if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            self.finished.add(cell_index)
        return super().process_message(msg, cell, cell_index)

    def lost_output_note(self) -> str | None:
        """A line for the report when a cell ran but its output did not all arrive (the connection closed)."""
        cells = [
            index
            for index, cell in enumerate(self.nb.cells)
            if cell.cell_type == "code"
            and cell.get("execution_count")
            and index not in self.finished
            and index not in self.timed_out  # the report says it ran out of time
        ]
        if not cells:
            return None
        return (
            f"the output of cells {', '.join(map(str, cells))} (counted from 0) did not all reach the grader: "
            f"the kernel sent a message over {MAX_MESSAGE_BYTES / 2**20:g} MiB, which closes its output "
            "connection, or the machine was too slow"
        )

    def output(self, outs, msg, display_id, cell_index):
        if msg["msg_type"] == "error":  # kept whatever the budget: the report names the error
            msg = {**msg, "content": trim_error(msg["content"])}
        elif not self.budget.keep(cell_index, output_size(msg["content"])):
            return None
        return super().output(outs, msg, display_id, cell_index)

    def handle_comm_msg(self, outs, msg, cell_index) -> None:
        return None


CELL_TIMED_OUT = "CellTimedOut"
"""The error name of the reply nbclient makes up for a cell that ran past its timeout (`error_on_timeout`)."""


# limits.py alone (it imports only the standard library), not the package: a kernel starts in a second, not ten
_CUT_OUTPUT = f"__import__('runpy').run_path({limits.__file__!r})['limit_kernel_output']()"


async def responsive(client: GradingClient, timeout: float) -> bool:
    """Does the kernel answer a request within `timeout` seconds (after an interrupt: did the cell stop)?"""
    probe = client.kc.execute("", silent=True, store_history=False)
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply = await client.kc.shell_channel.get_msg(timeout=left)
        except queue.Empty:
            return False
        if reply["parent_header"].get("msg_id") == probe:  # the interrupted cell's late reply comes first
            return True
    return False


def grading_client(nb, folder: Path, cwd: Path, timeout: float, sandbox=None) -> GradingClient:
    """The executor of one notebook: its kernel's files in `folder`, run in `cwd`, sandboxed by `sandbox`
    (`kernel_manager`); a cell running past `timeout` seconds is interrupted and the next one runs (`timed_out`)."""
    client = GradingClient(
        nb,
        timeout=max(1, int(timeout)),
        interrupt_on_timeout=True,
        error_on_timeout={"ename": CELL_TIMED_OUT, "evalue": f"over {timeout:g} s", "traceback": []},
        allow_errors=True,
        km=kernel_manager(folder, sandbox),
        resources={"metadata": {"path": str(cwd)}},
        extra_arguments=[
            "--IPKernelApp.log_level=ERROR",  # no start-up warnings
            f"--IPKernelApp.exec_lines={_CUT_OUTPUT}",  # small messages, however much a cell prints
        ],
    )
    client.budget, client.finished, client.timed_out, client.polls = OutputBudget(), set(), [], set()
    client.on_cell_executed = client.note_timeout
    return client


async def start_kernel(client: GradingClient, env: dict) -> int:
    """Start the notebook's kernel, its stdin, stdout and stderr /dev/null; its pid (the SID of all it starts).

    Then connect with `client.async_start_new_kernel_client()`.
    """
    devnull = subprocess.DEVNULL
    await client.async_start_new_kernel(env=env, stdin=devnull, stdout=devnull, stderr=devnull)
    return client.km.provisioner.pid


async def stop_kernel(client: GradingClient) -> None:
    """End nbclient's polls of the kernel, disconnect, reap the kernel (the runner has killed it) and remove its
    connection file; never raises."""
    for poll in client.polls:
        poll.cancel()
    km = client.km
    if client.kc is not None:
        client.kc.stop_channels()
        client.kc = None
    if km is None:  # nbclient shut the kernel down and dropped its manager when the kernel did not answer at start
        return
    try:
        if km.has_kernel:
            await asyncio.wait_for(km.shutdown_kernel(now=True), 10)
        else:
            await km.cleanup_resources()
    except Exception:  # the kernel is dead already; its folder is removed by the runner in any case
        pass
    km.context.destroy(linger=0)

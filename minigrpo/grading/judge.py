"""The grader's judge: one process per notebook, running only the package's code.

The runner starts it after the notebook has run, isolated from the folders a
learner writes (`python -I`, the path set by the grader, the root folder as its
working folder: `processes.judge_command`), and writes one JSON line on its stdin:
a secret key, the checks the notebook's code cells call (with the cell and the
expression passed to each), the code cells, how to reach the kernel and a
folder for the files it exchanges with the kernel. For each check the judge

1. asks the kernel what the notebook passed to it (`remote.describe`): nothing
   (the check never ran), something that is not a function, or the package's
   own solution (the kernel's look, `references.reference_reason`);
2. reads the notebook's source for the same (`references.source_reference_reason`),
   here, where no learner code runs;
3. runs every case (`framework.evaluate`) with a `remote.KernelFunction`:
   the expected answers, the comparisons and the points are computed here;
   the kernel runs each call under a watch for the check's references
   (`references.ReferenceWatch`), and a check whose function ran one scores 0.

Its random cases draw their inputs from a secret it draws itself at every grading (`framework.drawn_from`):
the kernel never sees it, so a notebook that recorded a check's answers (in its own run, or in another grading)
holds the answers to other questions. Only the hand-made cases are the same every time.

It does all of this by the request's deadline, which the runner sets to leave every check
its cases' own time limits (`runner.judge_budget`): each check gets an equal share of the
time left when it starts, or its cases' own limits if that is more (`check_deadline`), and a
case gets what is left of its check's share (`framework.run_case`), so a learner's function
that loops or trains slowly costs its own case's points, not the next check's.

It prints a JSON line after each check, and at the end: the records so far (the runner keeps
the last line it got, so a judge stopped at the notebook's deadline loses only the checks
it had not finished), and their HMAC-SHA256 under the key,
which only the runner and this process know (the key never passes through the
kernel's environment, files or arguments), so a line written into this
process's stdout by anyone else is rejected.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

from minigrpo.grading.framework import (
    CASES,
    DESCRIBE_S,
    REFERENCES,
    NoAnswer,
    drawn_from,
    evaluate,
    judged_cells,
    time_needed,
)
from minigrpo.grading.references import source_reference_reason, watch_list
from minigrpo.grading.sandbox.remote import Kernel, KernelFunction, describe


def sign(key: bytes, records: list[dict]) -> str:
    """The records' HMAC-SHA256 under `key`, over their canonical JSON."""
    return hmac.new(key, json.dumps(records, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def judge_check(kernel: Kernel, check: str, call: dict | None, cells: list[str], deadline: float | None = None) -> dict:
    """One check's record: CheckResult.to_dict(), or {"check", "not_run": reason} ("" when the runner knows why).

    deadline: time.monotonic() by which its cases end (None: each case's own time limit only)."""
    try:
        wait = DESCRIBE_S if deadline is None else min(DESCRIBE_S, max(1.0, deadline - time.monotonic()))
        seen = describe(kernel, check, timeout=wait)
    except NoAnswer as gone:
        return {"check": check, "not_run": str(gone)}
    if not seen.get("registered"):
        return {"check": check, "not_run": ""}
    refusal = None
    if call is not None and call.get("argument"):
        refusal = source_reference_reason(cells, call["cell"], call["argument"], REFERENCES.get(check, ()))
    refusal = refusal or seen.get("refusal")
    function = KernelFunction(kernel, check, watch_list(REFERENCES.get(check, ())))
    with judged_cells(cells):  # a check that reads the notebook's source reads the file's, not the kernel's
        result = evaluate(check, function, str(refusal) if refusal else None, deadline)
        if function.refusal:  # a reference ran, seen at run time: every case earns 0 with the reason
            result = evaluate(check, function, function.refusal)
    return result.to_dict()


def check_deadline(check: str, deadline: float, checks_left: int) -> float:
    """When `check`'s cases must end (time.monotonic()): its equal share of the time left before `deadline`, or its
    cases' own limits (`framework.time_needed`) if that is more, never past `deadline`."""
    now = time.monotonic()
    return min(deadline, now + max((deadline - now) / checks_left, time_needed(check)))


def judge(request: dict, done=None, secret: bytes | None = None) -> list[dict]:
    """Every requested check of one notebook, judged against its kernel; done(records so far) after each check.

    secret: what the random cases draw from (`framework.drawn_from`); None, the default, draws a new one here."""
    cells = request["cells"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(drawn_from(secret or secrets.token_bytes(32)))
        workdir = request.get("workdir") or stack.enter_context(tempfile.TemporaryDirectory(prefix="minigrpo-judge-"))
        kernel = Kernel(
            request["connection"], request["kernel_pid"], Path(workdir), request.get("interrupt_mode", "signal")
        )
        checks = [check for check in request["checks"] if check in CASES]
        deadline = None
        if request.get("deadline") is not None:  # wall clock from the runner: this process's start-up counted
            deadline = time.monotonic() + (request["deadline"] - time.time())
        try:
            records = []
            for number, check in enumerate(checks):
                share = None if deadline is None else check_deadline(check, deadline, len(checks) - number)
                records.append(judge_check(kernel, check, request["calls"].get(check), cells, share))
                (done or (lambda records: None))(records)
            return records
        finally:
            kernel.close()


def main() -> int:
    request = json.loads(sys.stdin.readline())
    key = bytes.fromhex(request.pop("key"))
    out, sys.stdout = sys.stdout, sys.stderr  # only the result lines go to stdout

    def send(records: list[dict]) -> None:  # after every check: what is judged counts if the runner stops us later
        out.write(json.dumps({"records": records, "mac": sign(key, records)}) + "\n")
        out.flush()

    send(judge(request, done=send))
    return 0


if __name__ == "__main__":
    sys.exit(main())

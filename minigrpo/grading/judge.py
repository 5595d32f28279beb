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

It prints one JSON line: the records, and their HMAC-SHA256 under the key,
which only the runner and this process know (the key never passes through the
kernel's environment, files or arguments), so a line written into this
process's stdout by anyone else is rejected.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import sys
import tempfile
from pathlib import Path

from minigrpo.grading.framework import CASES, REFERENCES, NoAnswer, evaluate, judged_cells
from minigrpo.grading.references import source_reference_reason, watch_list
from minigrpo.grading.remote import Kernel, KernelFunction, describe


def sign(key: bytes, records: list[dict]) -> str:
    """The records' HMAC-SHA256 under `key`, over their canonical JSON."""
    return hmac.new(key, json.dumps(records, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def judge_check(kernel: Kernel, check: str, call: dict | None, cells: list[str]) -> dict:
    """One check's record: CheckResult.to_dict(), or {"check", "not_run": reason} ("" when the runner knows why)."""
    try:
        seen = describe(kernel, check)
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
        result = evaluate(check, function, str(refusal) if refusal else None)
        if function.refusal:  # a reference ran, seen at run time: every case earns 0 with the reason
            result = evaluate(check, function, function.refusal)
    return result.to_dict()


def judge(request: dict) -> list[dict]:
    """Every requested check of one notebook, judged against its kernel."""
    cells = request["cells"]
    with contextlib.ExitStack() as stack:
        workdir = request.get("workdir") or stack.enter_context(tempfile.TemporaryDirectory(prefix="minigrpo-judge-"))
        kernel = Kernel(request["connection"], request["kernel_pid"], Path(workdir))
        try:
            return [
                judge_check(kernel, check, request["calls"].get(check), cells)
                for check in request["checks"]
                if check in CASES
            ]
        finally:
            kernel.close()


def main() -> int:
    request = json.loads(sys.stdin.readline())
    key = bytes.fromhex(request.pop("key"))
    out, sys.stdout = sys.stdout, sys.stderr  # only the result line goes to stdout
    records = judge(request)
    out.write(json.dumps({"records": records, "mac": sign(key, records)}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

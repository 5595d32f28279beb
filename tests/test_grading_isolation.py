"""The grader against a learner who turns on the grader itself: isolation, output, signals and limits.

One run of `python -m minigrpo grade FOLDER --json` (module fixture), started in
a working folder of its own, under a strict UTF-8 stdout, with TMPDIR and the
Jupyter runtime folder of the test's own, one notebook at a time, grades:

- a notebook that writes a package named `minigrpo` (with a judge that gives
  full marks) and one named `IPython` into the grader's working folder, then
  hands in a wrong answer;
- a notebook that writes to file descriptors 1 and 2, from Python and from a
  shell, and prints 3 MB in a loop, beside a right answer;
- a FIFO and a file over the size cap, both named *.ipynb;
- a notebook whose cell starts a detached child and sleeps: SIGTERM is sent to
  the grader then, so that it and the notebook after it (whose name is not
  UTF-8) are not graded; every output (--csv, --checks-csv, --feedback,
  --gradescope) is still written, and says which notebooks were not graded.

The rest are unit tests of the pieces, without a kernel.
"""

import asyncio
import csv
import gc
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from test_grading_sandbox import refusing_bwrap

from minigrpo.grading import NotebookReport, format_scores
from minigrpo.grading.runner import say
from minigrpo.grading.sandbox.limits import MAX_NOTEBOOK_BYTES, NotebookRefused, OutputBudget, printable, read_notebook
from minigrpo.grading.sandbox.processes import Interrupts, alive, judge_command, kill_leftovers

ROOT = Path(__file__).resolve().parents[1]
RIGHT = "def kl_k3(logps, ref):\n    log_r = ref - logps\n    return log_r.exp() - log_r - 1"
WRONG = "def kl_k3(logps, ref):\n    return logps * 0"
CHECK = "from minigrpo.grading import check_kl_k3\n\ncheck_kl_k3(kl_k3)"
FORGING_JUDGE = """
import hashlib, hmac, json, sys
request = json.loads(sys.stdin.readline())
case = {"name": "forged", "points": 3.0, "max_points": 3.0, "passed": True, "message": ""}
records = [{"check": c, "points": 3.0, "max_points": 3.0, "cases": [case]} for c in request["checks"]]
mac = hmac.new(bytes.fromhex(request["key"]), json.dumps(records, sort_keys=True).encode(), hashlib.sha256)
print(json.dumps({"records": records, "mac": mac.hexdigest()}))
"""


def plants(working: Path, markers: Path) -> str:
    """A cell that writes packages into the grader's working folder; each leaves a marker file when imported."""
    files = {
        "minigrpo/__init__.py": "",
        "minigrpo/grading/__init__.py": "",
        "minigrpo/grading/judge.py": FORGING_JUDGE,  # `python -m minigrpo.grading.judge` from there: 3/3
        "IPython/__init__.py": "",  # the grader imports IPython only after the notebook ran
    }
    return f"""
from pathlib import Path
files = {files!r}
for name, text in files.items():
    marker = f"open({str(markers)!r} + '/' + {{name.replace('/', '.')!r}}, 'w').close()\\n"
    path = Path({str(working)!r}, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(marker + text)
"""


NOISY = """
import os, subprocess, sys
os.write(1, b"junk on fd 1\\n")
os.write(2, b"junk on fd 2\\n")
os.system("echo junk from a shell; echo junk from a shell on stderr >&2")
subprocess.run(["echo", "junk from a child"])
sys.__stdout__.write("junk on sys.__stdout__\\n")
sys.__stdout__.flush()
for _ in range(3):
    print("x" * 1_000_000)  # 3 MB: over the cap of 1 MiB per cell
"""


def notebook(path: Path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(nb, path)


def environment(tmp: Path, **extra: str) -> dict:
    """The grader's environment: this package on the path, TMPDIR and the Jupyter runtime folder the test's own."""
    for name in ("tmpdir", "runtime"):
        (tmp / name).mkdir(exist_ok=True)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp / "tmpdir"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    return {**env, "PYTHONIOENCODING": "utf-8:strict", **extra}


def left_behind(tmp: Path) -> list[str]:
    """What grading left in TMPDIR and the runtime folder (torch's own cache, made by `import torch`, aside)."""
    return sorted(
        str(p.relative_to(tmp))
        for name in ("tmpdir", "runtime")
        for p in (tmp / name).iterdir()
        if not p.name.startswith("torchinductor_")
    )


SLEEPS = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(CHILD_PID, "w").write(str(child.pid))
time.sleep(600)
"""


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """Grade the folder once from the command line, stopped by SIGTERM in its last but one notebook.

    (exit code, stdout, stderr, the JSON report, {notebook: its report}, tmp, the child's pid, the paths not graded).
    """
    tmp = tmp_path_factory.mktemp("isolation")
    working, folder, markers = tmp / "working", tmp / "notebooks", tmp / "markers"
    for path in (working, folder, markers):
        path.mkdir()
    notebook(folder / "plants.ipynb", plants(working, markers), WRONG, CHECK)
    notebook(folder / "noisy.ipynb", NOISY, RIGHT, CHECK)
    os.mkfifo(folder / "fifo.ipynb")
    with open(folder / "huge.ipynb", "wb") as f:
        f.truncate(MAX_NOTEBOOK_BYTES + 1)  # sparse: costs no disk
    pid_file = tmp / "child.pid"
    notebook(folder / "sleeps.ipynb", f"CHILD_PID = {str(pid_file)!r}\n" + SLEEPS, RIGHT, CHECK)
    waits = os.fsdecode(os.path.join(os.fsencode(folder), b"waits_caf\xe9\nforged line.ipynb"))  # not UTF-8
    notebook(Path(waits), RIGHT, CHECK)
    command = [sys.executable, "-m", "minigrpo", "grade", str(folder), "--json", "--timeout", "300"]
    out = tmp / "out"  # every output, written though grading was interrupted
    command += ["--csv", str(out / "grades.csv"), "--checks-csv", str(out / "checks.csv")]
    command += ["--feedback", str(out / "feedback"), "--gradescope", str(out / "results.json")]
    env = environment(tmp, MINIGRPO_GRADE_JOBS="1")
    # where no sandbox can run (a bwrap the kernel refuses): what this file tests holds there too, and the notebooks
    # here write beside them and into the grader's working folder, which a sandbox would not let them see
    env["PYTHONPATH"] = os.pathsep.join([refusing_bwrap(tmp), env["PYTHONPATH"]])
    grader = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=working, env=env)
    try:
        deadline = time.monotonic() + 600
        while not (pid_file.exists() and pid_file.read_text()) and grader.poll() is None:
            assert time.monotonic() < deadline, "the sleeping notebook never started its child"
            time.sleep(0.1)
        grader.send_signal(signal.SIGTERM)
        out, err = grader.communicate(timeout=120)
    finally:
        if grader.poll() is None:
            grader.kill()
            grader.communicate()
    out, err = out.decode(), err.decode()
    report = json.loads(out)  # the test of the --json output: it parses
    by_name = {Path(n["path"]).stem: n for n in report["notebooks"]}
    child = int(pid_file.read_text())
    return grader.returncode, out, err, report, by_name, tmp, child, [str(folder / "sleeps.ipynb"), waits]


def test_a_package_planted_in_the_graders_working_folder_is_never_imported(cli_run):
    _, _, _, _, notebooks, tmp, _, _ = cli_run
    assert sorted(p.name for p in (tmp / "working").iterdir()) == ["IPython", "minigrpo"]  # the planting ran
    assert list((tmp / "markers").iterdir()) == []  # by neither the grader nor the judge
    planted = notebooks["plants"]
    assert (planted["points"], planted["max_points"], planted["status"]) == (0, 3, "ok")
    assert all(not c["passed"] for c in planted["checks"][0]["cases"])


def test_the_kernels_output_never_reaches_the_graders_output(cli_run):
    _, out, err, _, notebooks, _, _, _ = cli_run
    noisy = notebooks["noisy"]
    assert (noisy["points"], noisy["max_points"], noisy["errors"]) == (3, 3, [])
    assert "junk" not in out and "junk" not in err
    assert out.isascii()  # any stdout can print it


def test_output_over_the_cap_is_dropped_and_the_report_states_the_caps(cli_run):
    _, _, _, report, notebooks, _, _, _ = cli_run
    assert report["limits"] == {
        "notebook_bytes": 16 * 2**20,
        "cell_output_bytes": 2**20,
        "notebook_output_bytes": 8 * 2**20,
        "kernel_message_bytes": 64 * 2**20,
    }
    (note,) = notebooks["noisy"]["notes"]
    assert "beyond 1 MiB per cell or 8 MiB per notebook was not kept (cells 0," in note
    assert notebooks["plants"]["notes"] == []


def test_only_regular_files_of_at_most_16_mib_are_read_as_notebooks(cli_run):
    _, _, _, _, notebooks, _, _, _ = cli_run
    fifo, huge = notebooks["fifo"], notebooks["huge"]
    assert (fifo["status"], fifo["points"], huge["status"], huge["points"]) == ("unreadable", 0, "unreadable", 0)
    assert "not a regular file (a FIFO, a device or a socket)" in fifo["errors"][0]
    assert "larger than 16 MiB" in huge["errors"][0]


def test_an_interrupt_stops_grading_says_what_was_not_graded_and_records_no_score(cli_run):
    code, _, err, report, notebooks, _, _, not_graded = cli_run
    assert code == 128 + signal.SIGTERM, err
    assert sorted(notebooks) == ["fifo", "huge", "noisy", "plants"]  # graded before the signal, with their scores
    assert report["interrupted"] == "SIGTERM" and report["not_graded"] == not_graded
    assert report["points"] == 3 and report["max_points"] == 6  # noisy's 3 of 3, plants' 0 of 3: no more
    escaped = printable(not_graded[1])
    assert "\\xe9\\n" in escaped  # the name's byte that is not UTF-8, and its newline, escaped on one line
    assert err.rstrip().endswith(f"not graded (no score recorded): {not_graded[0]}, {escaped}")


def test_an_interrupt_prints_no_traceback_and_every_output_says_what_was_not_graded(cli_run):
    _, _, err, _, _, tmp, _, _ = cli_run
    assert "Traceback" not in err and "never retrieved" not in err
    with open(tmp / "out" / "grades.csv", newline="") as f:
        totals = {row["student"]: row["total"] for row in csv.DictReader(f)}
    assert totals["noisy"] == "3" and totals["sleeps"] == "not graded (interrupted)"
    assert totals["waits_caf\\xe9\\nforged line"] == "not graded (interrupted)"  # escaped, as every learner's name
    with open(tmp / "out" / "checks.csv", newline="") as f:
        statuses = {row["student"]: row["status"] for row in csv.DictReader(f)}
    assert statuses["plants"] == "ok" and statuses["sleeps"] == "not graded (interrupted)"
    assert "sleeps.md" not in [p.name for p in (tmp / "out" / "feedback").iterdir()]
    results = json.loads((tmp / "out" / "results.json").read_text())
    assert results["output"].splitlines()[1].startswith("grading was interrupted before sleeps.ipynb, waits_caf")


def test_every_exit_kills_the_detached_children_and_removes_the_temporary_files(cli_run):
    _, _, _, _, _, tmp, child, _ = cli_run
    assert not alive(child)  # killed on SIGTERM, as on a normal exit
    assert left_behind(tmp) == []  # connection files, kernel specs, the kernels' and judges' TMPDIR


# --- the pieces, without a kernel -----------------------------------------------------------------
def test_read_notebook_reads_regular_files_only_and_never_blocks(tmp_path):
    regular = tmp_path / "ok.ipynb"
    regular.write_text('{"cells": []}')
    assert read_notebook(regular) == '{"cells": []}'
    os.mkfifo(tmp_path / "fifo.ipynb")
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_refusal(tmp_path / "fifo.ipynb")), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert outcome and "not a regular file" in outcome[0]  # and it did not wait for a writer
    with open(tmp_path / "huge.ipynb", "wb") as f:
        f.truncate(MAX_NOTEBOOK_BYTES + 1)
    assert "larger than 16 MiB" in _refusal(tmp_path / "huge.ipynb")
    (tmp_path / "latin1.ipynb").write_bytes(b'{"cells": "caf\xe9"}')
    assert "not UTF-8" in _refusal(tmp_path / "latin1.ipynb")


def _refusal(path: Path) -> str:
    with pytest.raises(NotebookRefused) as refused:
        read_notebook(path)
    return str(refused.value)


def test_names_and_messages_print_escaped_on_any_stdout():
    assert printable("caf\udce9\nx\x1b[31m\u202e.ipynb") == "caf\\xe9\\nx\\x1b[31m\\u202e.ipynb"
    assert printable("été 12 + 7.ipynb") == "été 12 + 7.ipynb"  # printable text is left alone
    report = NotebookReport("/class/caf\udce9\n  total 99 99.ipynb", status="unreadable", errors=["a\nb"])
    table = format_scores([report])
    strict = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    say(table, strict)  # the table printed under a strict UTF-8 stdout: a name that is not UTF-8 crashed it
    ascii_only = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
    say("été", ascii_only)
    ascii_only.seek(0)
    assert ascii_only.read() == "\\xe9t\\xe9\n"
    lines = table.splitlines()
    name = "caf\\xe9\\n  total 99 99"  # the student (the file's stem), and the exercise: none, so the stem again
    assert lines[2].startswith(f"{name}  ({name})  (no checks)")  # one row, not a forged total
    assert lines[3].startswith("---") and lines[4].startswith("total ")
    assert f"  {name} / ({name}) ({name}.ipynb): unreadable (a\\nb)" in lines


def test_the_output_budget_caps_each_cell_and_the_notebook():
    budget = OutputBudget(per_cell=10, per_notebook=25)
    assert [budget.keep(0, 6), budget.keep(0, 4), budget.keep(0, 1), budget.keep(1, 10)] == [True, True, False, True]
    assert [budget.keep(2, 5), budget.keep(2, 1), budget.keep(3, 0)] == [True, False, True]  # the notebook: 25
    assert budget.capped == [0, 2]
    assert "(cells 0, 2," in budget.note() and OutputBudget().note() is None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupts_cancel_the_grading_task_and_restore_the_handlers(signum):
    before = signal.getsignal(signum)
    cleaned_up = []

    async def grading(interrupts: Interrupts) -> str:
        interrupts.watch(asyncio.current_task())
        try:
            os.kill(os.getpid(), signum)
            await asyncio.sleep(30)
            return "not stopped"
        finally:
            cleaned_up.append(True)

    with Interrupts() as interrupts:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(grading(interrupts))
    assert (interrupts.signal, interrupts.name, cleaned_up) == (signum, signal.Signals(signum).name, [True])
    assert signal.getsignal(signum) is before


def test_a_cell_cancelled_by_an_interrupt_leaves_no_task_that_fails_once_its_kernel_is_stopped(tmp_path):
    """nbclient leaves its poll of the kernel running when the cell it watches is cancelled (the grader's answer to
    SIGINT and SIGTERM); its next look at the stopped client failed, and asyncio printed "Task exception was never
    retrieved ... AssertionError" under the command's last lines. One kernel, one cell cancelled as it runs."""
    from minigrpo.grading.sandbox import kernels

    async def cancel_a_running_cell() -> list[str]:
        loop_errors = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context["message"]))
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(60)")])
        client = kernels.grading_client(nb, tmp_path, tmp_path, 120)
        kernel_pid = await kernels.start_kernel(client, dict(os.environ))
        try:
            await client.async_start_new_kernel_client()
            cell = asyncio.create_task(client.async_execute_cell(nb.cells[0], 0, execution_count=1))
            await asyncio.sleep(1.5)  # the cell runs, and nbclient polls the kernel every second
            cell.cancel()
            await asyncio.gather(cell, return_exceptions=True)  # nbclient says DeadKernelError
            del cell  # its error's traceback holds nbclient's frames, and so the poll
        finally:  # as the runner cleans up after a signal
            kill_leftovers(kernel_pid, "MINIGRPO_TEST_UNUSED", "none")
            await kernels.stop_kernel(client)
        await asyncio.sleep(1.5)  # the poll's next look, had it been left running
        gc.collect()  # a task is reported as it is collected
        await asyncio.sleep(0)
        return loop_errors

    assert asyncio.run(cancel_a_running_cell()) == []


def test_a_judge_read_cancelled_by_an_interrupt_leaves_no_error_unread():
    """The runner reads its judge's output until the judge exits; a signal cancels that read. asyncio printed
    "_GatheringFuture exception was never retrieved" for it (a cancelled gather ends with an error no one reads)."""
    from minigrpo.grading.runner import _read_until

    async def cancel_a_read() -> list[str]:
        loop_errors = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: loop_errors.append(context["message"]))
        pipe = asyncio.subprocess.PIPE
        judge = await asyncio.create_subprocess_exec("sleep", "60", stdout=pipe, stderr=pipe, start_new_session=True)
        read = asyncio.create_task(_read_until(judge, 60))
        await asyncio.sleep(0.5)
        read.cancel()
        await asyncio.gather(read, return_exceptions=True)
        del read
        gc.collect()  # an error no one read is reported as its future is collected
        await asyncio.sleep(0)
        return loop_errors if judge.returncode == -signal.SIGKILL else ["the judge was not killed"]

    assert asyncio.run(cancel_a_read()) == []


def test_an_interrupted_run_prints_the_graded_and_the_not_graded(monkeypatch, capsys):
    """What the command prints when SIGINT stopped grading: no kernel here, grade_notebooks is replaced."""
    from minigrpo.grading import runner
    from minigrpo.grading.reports import gradebook, layouts

    graded = NotebookReport("ex/01.ipynb", checks=[{"check": "check_kl_k3", "points": 3, "max_points": 3}])

    def interrupted(*args, **kwargs):
        raise runner.GradingInterrupted(signal.SIGINT, [graded], [Path("ex/02.ipynb")])

    monkeypatch.setattr(layouts, "find_notebooks", lambda path: [Path("ex/01.ipynb"), Path("ex/02.ipynb")])
    monkeypatch.setattr(gradebook, "grade_notebooks", interrupted)
    assert gradebook.grade_command("ex") == 130
    out, err = capsys.readouterr()
    assert out.rstrip().endswith("not graded (grading was interrupted; no score recorded):\n  ex/02.ipynb")
    assert "interrupted by SIGINT" in err and "02" not in out.split("what lost points")[0].split("total")[0]


def test_an_interrupted_run_marks_what_it_did_not_grade_in_every_output(monkeypatch, capsys, tmp_path):
    """SIGTERM stopped grading after ann's notebook, before bob's (no kernel here: grade_notebooks is replaced). The
    gradebook's total and the per-check CSV say bob was not graded, only ann gets a feedback file, and results.json
    says that grading was interrupted rather than that nothing was handed in."""
    from minigrpo.__main__ import main
    from minigrpo.grading import runner
    from minigrpo.grading.reports import gradebook

    folder, out = tmp_path / "class", tmp_path / "out"
    paths = {student: folder / student / "06_kl_k3_estimator.ipynb" for student in ("ann", "bob")}
    for path in paths.values():
        path.parent.mkdir(parents=True)
        path.write_text("{}")
    full = {"check": "check_kl_k3", "points": 3.0, "max_points": 3.0, "cases": []}
    ann = NotebookReport(str(paths["ann"]), checks=[full], student="ann", exercise="06_kl_k3_estimator")

    def interrupted(submissions, **options):
        raise runner.GradingInterrupted(signal.SIGTERM, [ann], [paths["bob"]])

    monkeypatch.setattr(gradebook, "grade_notebooks", interrupted)
    outputs = ["--csv", str(out / "grades.csv"), "--checks-csv", str(out / "checks.csv")]
    outputs += ["--feedback", str(out / "feedback"), "--gradescope", str(out / "results.json"), "--exercise", "06"]
    assert main(["grade", str(folder), *outputs]) == 128 + signal.SIGTERM
    assert "Traceback" not in capsys.readouterr().err
    with open(out / "grades.csv", newline="") as f:
        totals = {row["student"]: row["total"] for row in csv.DictReader(f)}
    assert totals == {"ann": "3", "bob": "not graded (interrupted)"}
    with open(out / "checks.csv", newline="") as f:
        statuses = {row["student"]: row["status"] for row in csv.DictReader(f)}
    assert statuses == {"ann": "ok", "bob": "not graded (interrupted)"}
    assert [p.name for p in (out / "feedback").iterdir()] == ["ann.md"]
    results = json.loads((out / "results.json").read_text())
    assert results["score"] == 3.0 and "grading was interrupted" in results["output"].splitlines()[1]


def test_the_judge_runs_isolated_with_no_path_into_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    command = judge_command(ROOT)
    assert command[:3] == [sys.executable, "-I", "-c"]
    path = command[4:]
    assert path[0] == str(ROOT) and "" not in path and str(tmp_path) not in path

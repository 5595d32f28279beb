"""minigrpo.course: which model each lesson gets (GPU mocked), the presets, and the Colab setup cell run as Colab
would run it (google.colab faked, pip mocked): it installs, or prints one clear message, and never raises."""

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import minigrpo
from minigrpo import course
from minigrpo.config import GRPOConfig
from minigrpo.course import experiments
from minigrpo.models import QWEN_MODEL_ID

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("stamp_colab", ROOT / "scripts" / "stamp_colab.py")
stamp_colab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamp_colab)


@pytest.fixture
def gpu(monkeypatch):
    """A machine with a GPU, in full (not quick) mode."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Tesla T4")
    monkeypatch.setattr(course, "QUICK", False)


def test_lessons_get_the_tiny_model_by_default_even_on_a_gpu(gpu):
    assert course.model_name() == "tiny"
    assert course.course_config() == GRPOConfig.tiny_cpu(overwrite_output_dir=True)  # a re-run replaces its run


def test_real_on_gpu_asks_for_qwen_only_where_a_gpu_is(gpu, monkeypatch):
    assert course.model_name(real_on_gpu=True) == QWEN_MODEL_ID
    assert course.course_config(QWEN_MODEL_ID) == GRPOConfig.qwen_t4(overwrite_output_dir=True)
    monkeypatch.setattr(course, "QUICK", True)  # CI on a GPU machine: still the tiny model
    assert course.model_name(real_on_gpu=True) == "tiny"
    monkeypatch.setattr(course, "QUICK", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert course.model_name(real_on_gpu=True) == "tiny"


def test_course_config_passes_overrides_to_the_preset():
    config = course.course_config("tiny", beta=0.0, max_steps=3)
    assert config == GRPOConfig.tiny_cpu(beta=0.0, max_steps=3, overwrite_output_dir=True)
    assert not course.course_config("tiny", overwrite_output_dir=False).overwrite_output_dir


def test_describe_names_the_device_and_the_model(gpu):
    assert course.describe().startswith("device: Tesla T4 | model: tiny | quick mode: False")
    assert f"model: {QWEN_MODEL_ID}" in course.describe(course.model_name(real_on_gpu=True))


def test_colab_install_is_the_colab_extra_at_this_version():
    assert course.colab_install("1.2.0") == "minigrpo[colab]==1.2.0"
    assert course.COLAB_INSTALL == f"minigrpo[colab]=={minigrpo.__version__}"


# --- the Colab setup cell -----------------------------------------------------------------------------------------
@pytest.fixture
def colab(monkeypatch):
    """A fake google.colab whose output.enable_custom_widget_manager() records its calls."""
    calls = []
    output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append("widgets"))
    monkeypatch.setitem(sys.modules, "google.colab", types.SimpleNamespace(output=output))
    return calls


def fake_pip(monkeypatch, returncode: int):
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, returncode, "", "ERROR: Repository not found.\n")

    monkeypatch.setattr(subprocess, "run", run)
    return commands


PACKAGE = "minigrpo[colab]==1.2.0"


def run_setup_cell() -> None:
    exec(stamp_colab.install_source(PACKAGE, course.INSTALL_HELP), {"__name__": "__main__"})


def test_setup_cell_does_nothing_outside_colab(monkeypatch, capsys):
    commands = fake_pip(monkeypatch, 0)
    run_setup_cell()
    assert commands == [] and capsys.readouterr().out == ""


def test_setup_cell_installs_the_stamped_version_and_turns_on_widgets(colab, monkeypatch, capsys):
    """pip runs even when minigrpo is importable: a runtime that kept another version gets the notebook's."""
    commands = fake_pip(monkeypatch, 0)
    run_setup_cell()
    assert commands == [[sys.executable, "-m", "pip", "install", "-q", PACKAGE]]
    assert colab == ["widgets"] and capsys.readouterr().out == ""


def test_setup_cell_explains_a_failed_install_in_one_line_without_a_traceback(colab, monkeypatch, capsys):
    fake_pip(monkeypatch, 1)
    run_setup_cell()
    out = capsys.readouterr().out
    assert out == (f"pip could not install {PACKAGE} (ERROR: Repository not found.): {course.INSTALL_HELP}\n")
    assert "\n" not in course.INSTALL_HELP and "build_dist.py" in course.INSTALL_HELP and colab == []


def test_setup_cell_refuses_a_help_text_that_would_break_it():
    with pytest.raises(ValueError, match="one line without double quotes"):
        stamp_colab.install_source(PACKAGE, 'say "hi"')


def test_colab_setup_is_a_no_op_outside_colab():
    assert "google.colab" not in sys.modules
    course.colab_setup()  # no google.colab to import: must not raise


# --- lesson 08's TRL cell ---------------------------------------------------------------------------------------------
def test_the_trl_lesson_08_installs_is_the_one_the_test_extra_pins():
    import tomllib

    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert course.TRL_REQUIREMENT in [requirement.split("#")[0].strip() for requirement in test_extra]
    assert f"`pip install {course.TRL_REQUIREMENT}`" in course.TRL_MISSING and "\n" not in course.TRL_MISSING


def test_moved_imports_are_the_changed_distributions_this_process_imported():
    before = {"datasets": "4.0.0", "pyarrow": "18.1.0", "numpy": "2.1.3", "xxhash": "3.5.0"}
    after = {"datasets": "4.8.5", "pyarrow": "23.0.1", "numpy": "2.1.3", "trl": "1.16.0"}  # xxhash removed
    imported = {"datasets", "numpy", "xxhash"}  # pyarrow moved but was never imported: no restart for it
    assert course.moved_imports(before, after, imported) == ["datasets 4.0.0 -> 4.8.5", "xxhash 3.5.0 -> removed"]
    assert course.moved_imports(before, before, imported) == []


def test_this_process_has_imported_torch_and_not_an_uninstalled_name():
    imported = course.imported_distributions()
    assert "torch" in imported and "pytest" in imported and "trl-not-a-distribution" not in imported


@pytest.mark.parametrize(
    ("versions_after", "returncode", "ready", "message"),
    [
        ({"trl": "1.16.0"}, 0, True, "Installed trl==1.16.0.\n"),
        (
            {"trl": "1.16.0", "torch": "0.0.1"},  # torch is imported here: as datasets is in Colab once minigrpo is
            0,
            False,
            "Installed trl==1.16.0, which moved torch {torch} -> 0.0.1 after this runtime imported it: restart the "
            "runtime from Colab's Runtime menu, then run the lesson again from the top.\n",
        ),
        ({}, 1, False, "pip could not install trl==1.16.0: ERROR: Repository not found.\n"),
    ],
)
def test_install_trl_says_in_one_line_whether_to_restart(
    monkeypatch, capsys, versions_after, returncode, ready, message
):
    before = {"torch": torch.__version__}
    snapshots = iter([before, {**before, **versions_after}])
    monkeypatch.setattr(course, "installed_versions", lambda: next(snapshots))
    commands = fake_pip(monkeypatch, returncode)
    assert course.install_trl() is ready
    assert commands == [[sys.executable, "-m", "pip", "install", "-q", "trl==1.16.0"]]
    assert capsys.readouterr().out == message.format(torch=torch.__version__)


# --- a failed torchrun in lesson 07 -------------------------------------------------------------------------------
TORCHRUN_OUTPUT = (
    """\
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "minigrpo/run/distributed.py", line 320, in data_parallel_policy
[rank0]:   File "minigrpo/run/distributed.py", line 320, in data_parallel_policy
[rank1]: TypeError: __init__() got an unexpected keyword argument 'forward_sync_buffers'
[rank0]: TypeError: __init__() got an unexpected keyword argument 'forward_sync_buffers'
[rank1]:[W1203 10:39:29 ProcessGroupGloo.cpp:123] Warning: destroy_process_group() was not called
E1203 10:39:29.049000 20790 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 20902)
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""
    + "=" * 60
    + "\n  rank      : 1 (local_rank: 1)\n"
    + "x" * 2000
    + "\n"
)


def test_a_failed_torchrun_shows_the_first_ranks_error_first():
    shown = experiments.torchrun_failure(TORCHRUN_OUTPUT, tail=100)
    assert shown.splitlines()[:4] == [
        "rank 1 raised:",
        "Traceback (most recent call last):",
        '  File "minigrpo/run/distributed.py", line 320, in data_parallel_policy',
        "TypeError: __init__() got an unexpected keyword argument 'forward_sync_buffers'",
    ]
    assert shown.endswith("torchrun's last lines:\n" + TORCHRUN_OUTPUT[-100:])
    assert "forward_sync_buffers" not in TORCHRUN_OUTPUT[-2000:]  # what the lesson showed before: not the error


def test_a_chained_traceback_is_shown_to_its_last_exception_and_no_traceback_as_the_tail():
    chained = (
        "Traceback (most recent call last):\n  File 'a.py', line 1\nKeyError: 'x'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File 'a.py', line 3\nValueError: no x\nlauncher says: exit 1\n"
    )
    shown = experiments.torchrun_failure(chained, tail=22)
    assert shown.startswith("the program raised:\nTraceback") and "KeyError: 'x'" in shown
    assert shown.split("\n\ntorchrun's last lines:\n") == [
        "the program raised:\n" + chained.split("\nlauncher")[0],
        "launcher says: exit 1\n",
    ]
    assert experiments.torchrun_failure("Killed\n" * 10, tail=7) == "Killed\n"

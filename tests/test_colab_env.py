"""scripts/colab_env.py: the pins it reads, the key it caches by, the Python it looks for, and how it judges lesson 08
without TRL and the graded capstone. (The leg itself, hours of CPU the first time, is a step of .ci/run.)"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minigrpo import course

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("colab_env", ROOT / "scripts" / "colab_env.py")
colab_env = importlib.util.module_from_spec(spec)
spec.loader.exec_module(colab_env)


def test_the_pins_file_names_colabs_python_and_exact_pins_with_the_date_read():
    text = colab_env.PINS.read_text()
    python, pins = colab_env.read_pins(text)
    assert python == "3.13" and "torch==2.11.0" in pins and "datasets==4.0.0" in pins
    assert all(not pin.startswith(("trl", "vllm", "bitsandbytes")) for pin in pins)  # Colab has none of them
    assert "read on 20" in text.splitlines()[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("torch==2.11.0\n", "name Colab's Python"),
        ("# python 3.13\n# python 3.12\ntorch==2.11.0\n", "name Colab's Python"),
        ("# python 3.13\ntransformers==5.15.0\n", "torch's among them"),
        ("# python 3.13\ntorch==2.11.0\nnumpy>=2\n", "must be exact"),
    ],
)
def test_a_pins_file_without_one_python_or_with_a_loose_pin_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        colab_env.read_pins(text)


def test_the_cache_key_is_the_pins_files_hash():
    key = colab_env.pins_key("# python 3.13\ntorch==2.11.0\n")
    assert len(key) == 12 and key == colab_env.pins_key("# python 3.13\ntorch==2.11.0\n")
    assert key != colab_env.pins_key("# python 3.13\ntorch==2.11.1\n")


def test_pythons_interpreter_comes_from_its_variable_or_a_clear_error(monkeypatch):
    assert colab_env.find_python("3.13", {"PYTHON313": "/opt/py/bin/python3.13"}) == Path("/opt/py/bin/python3.13")
    monkeypatch.setenv("PATH", "")  # no pyenv to ask
    with pytest.raises(RuntimeError, match=r"pyenv install 3.13.*PYTHON313"):
        colab_env.find_python("3.13", {})


def test_the_test_tools_and_trl_come_from_the_project():
    tools = colab_env.test_tools((ROOT / "pyproject.toml").read_text())
    assert tools[:3] == ["pytest>=8", "pytest-xdist>=3.5", "nbval>=0.11"] and len(tools) == len(colab_env.TEST_TOOLS)
    assert colab_env.trl_requirement() == course.TRL_REQUIREMENT


def stream(text, name="stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def test_printed_is_what_a_checked_cell_keeps():
    outputs = [
        stream("a\n"),
        stream("a warning\n", "stderr"),
        nbformat.v4.new_output("execute_result", {"text/plain": "3"}),
    ]
    assert colab_env.printed(outputs) == "a\n3"


def test_every_cell_of_lesson_08_that_names_trl_has_the_guard_the_leg_looks_for():
    cells = [c.source for c in nbformat.read(ROOT / colab_env.LESSON_08, as_version=4).cells if c.cell_type == "code"]
    guarded = [c for c in cells if any(line.startswith(colab_env.NEEDS_TRL) for line in c.splitlines())]
    naming_trl = [c for c in cells if "trl." in c or '"trl"' in c]
    trl_cell = next(c for c in cells if "import trl" in c)
    assert set(naming_trl) - set(guarded) == {trl_cell} and len(guarded) == 12
    assert all(f"{colab_env.NEEDS_TRL}  # without TRL" in c and "print(course.TRL_MISSING)" in c for c in guarded)


def graded(points, max_points, errors=(), status="ok"):
    notebook = {"status": status, "points": points, "max_points": max_points, "errors": list(errors)}
    return json.dumps({"notebooks": [notebook]})


def test_the_capstone_passes_with_full_marks_and_no_error_only():
    assert colab_env.capstone_problems(graded(30, 30)) == []
    assert colab_env.capstone_problems(graded(27, 30)) == ["ok: 27 of 30 points"]
    assert colab_env.capstone_problems(graded(30, 30, ["cell 4: NameError"])) == ["error: cell 4: NameError"]
    assert colab_env.capstone_problems(graded(0, 0)) == ["ok: 0 of 0 points"]


def test_the_capstone_names_each_case_that_lost_points_with_its_hint():
    notebook = json.loads(graded(26, 30))
    notebook["notebooks"][0]["checks"] = [
        {"check": "check_a", "cases": [{"name": "one", "passed": True, "message": ""}]},
        {"check": "check_b", "cases": [{"name": "two", "passed": False, "message": "0.190 -> 0.215 (+0.025)"}]},
    ]
    assert colab_env.capstone_problems(json.dumps(notebook)) == [
        "ok: 26 of 30 points",
        "check_b: two: 0.190 -> 0.215 (+0.025)",
    ]


# --- the rehearsal's Colab (the lessons part) ---------------------------------------------------------------------
def test_the_lessons_run_from_a_bare_content_folder_installing_the_wheel_without_the_network(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for name in ("00_tour.ipynb", "08_from_minigrpo_to_trl.ipynb"):
        nbformat.write(nbformat.v4.new_notebook(), tmp_path / "notebooks" / name)
    wheel = tmp_path / "wheels" / "minigrpo-9.9.9-py3-none-any.whl"
    base = tmp_path / "cache" / "base"
    (lessons,) = colab_env.parts(base / "bin" / "python", Path("trl"), tmp_path, wheel)["lessons"]
    assert lessons.base == base and lessons.lessons == ["content/00_tour.ipynb"]  # lesson 08: its own part
    assert lessons.command("content/00_tour.ipynb") == [
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",
        "content/00_tour.ipynb",
    ]
    assert [path.name for path in (tmp_path / "content").iterdir()] == ["00_tour.ipynb"]
    env = lessons.colab_env
    assert env["PIP_FIND_LINKS"] == str(tmp_path / "wheels") and env["PIP_NO_INDEX"] == "1"
    assert env["PYTHONPATH"] == str(tmp_path / "colab-standin") and env["IPYTHONDIR"] == str(tmp_path / "ipython")


def test_a_fresh_runtime_is_a_copy_without_minigrpo_that_leaves_the_original_whole(tmp_path, monkeypatch):
    """fresh_runtime hard-links the environment and uninstalls the package there: the original keeps its files."""
    base = tmp_path / "base"
    package = base / "lib" / "minigrpo" / "__init__.py"
    package.parent.mkdir(parents=True)
    package.write_text("VERSION = 1\n")
    (base / "bin").mkdir()
    commands = []

    def fake_run(*command, **kwargs):
        commands.append([str(part) for part in command])
        if command[0] == "cp":
            return subprocess.run([str(part) for part in command], check=True)
        os.unlink(Path(command[0]).parent.parent / "lib" / "minigrpo" / "__init__.py")  # what pip does: unlink

    monkeypatch.setattr(colab_env, "run", fake_run)
    python = colab_env.fresh_runtime(base, tmp_path / "runtime")
    assert python == tmp_path / "runtime" / "bin" / "python"
    assert commands[1] == [str(python), "-m", "pip", "uninstall", "-q", "-y", "minigrpo"]
    assert not (tmp_path / "runtime" / "lib" / "minigrpo" / "__init__.py").exists()
    assert package.read_text() == "VERSION = 1\n"


def test_the_kernels_start_in_colab_with_a_stand_in_the_course_can_use(tmp_path):
    """A kernel's startup file imports the stand-in google.colab: the setup cell's test ("google.colab" in
    sys.modules) is true, course.colab_setup() runs on it, and google stays a namespace (protobuf's google.* still
    imports beside it)."""
    _, env = colab_env.colab_content(tmp_path, [], tmp_path / "minigrpo.whl")
    (startup,) = (tmp_path / "ipython" / "profile_default" / "startup").glob("*.py")
    script = (
        f"exec(open({str(startup)!r}).read())\n"
        "import sys\n"
        "from minigrpo import course\n"
        "course.colab_setup()\n"
        "import google.protobuf\n"
        "print(course.in_colab(), sys.modules['google.colab'].__file__)\n"
    )
    path = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": path}, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode() == f"True {tmp_path / 'colab-standin' / 'google' / 'colab' / '__init__.py'}\n"

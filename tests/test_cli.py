"""The command line: mistakes are one line on stderr and exit status 2, caught before any model is loaded."""

import pytest

import minigrpo.models
from minigrpo.__main__ import check_model_name, main


@pytest.fixture(autouse=True)
def no_model_work(monkeypatch, tmp_path):
    """Every check here must fire before a model is loaded: loading one fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the command loaded a model before checking its arguments")

    monkeypatch.setattr(minigrpo.models, "load_model_and_tokenizer", forbidden)
    monkeypatch.chdir(tmp_path)


def run(capsys, *argv: str) -> str:
    """main(argv) must exit with status 2 and one line on stderr; returns that line."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err and "--debug" in lines[0]
    return lines[0]


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("path", ["/no/such/minigrpo-model", "runs/nope/final", "./nope", "~/no-such-minigrpo-model"])
def test_missing_model_folder(capsys, command, path):
    assert f"--model {path}: no such folder" in run(capsys, command, "--model", path)


def test_a_folder_that_is_not_a_model(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "without config.json" in run(capsys, "eval", "--model", "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert "no tokenizer files" in run(capsys, "eval", "--model", "empty")
    (tmp_path / "weights.bin").write_text("")
    assert "is a file" in run(capsys, "train", "--model", "weights.bin")


def test_hub_ids_and_folders_are_told_apart(tmp_path):
    assert check_model_name("tiny") == "tiny"
    assert check_model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert check_model_name("gpt2") == "gpt2"  # a Hub id without an organisation
    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    assert check_model_name("final") == "final"  # on disk: a path, even though it also looks like a Hub id
    with pytest.raises(FileNotFoundError, match="no such folder"):
        check_model_name("runs/minigrpo/final")


def test_a_hub_failure_is_one_line(capsys, monkeypatch):
    def offline(name, device=None):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(minigrpo.models, "load_model_and_tokenizer", offline)
    line = run(capsys, "eval", "--model", "org/name")
    assert "could not load --model org/name from the Hugging Face Hub (We couldn't connect" in line


def test_output_dir_that_is_a_file_or_inside_one(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("")
    assert "--output-dir notes.txt is a file" in run(capsys, "train", "--output-dir", "notes.txt")
    assert "inside the file" in run(capsys, "train", "--output-dir", "notes.txt/run")
    assert "is a file" in run(capsys, "pretrain-tiny", "--output-dir", "notes.txt")


def test_output_dir_that_is_not_writable(capsys, monkeypatch):
    monkeypatch.setattr("minigrpo.__main__.os.access", lambda path, mode: False)  # root may write anywhere
    assert "is not writable" in run(capsys, "train", "--output-dir", "runs/x")


def test_zero_steps_or_eval_problems(capsys):
    assert "max_steps=0: give a number of steps >= 1" in run(capsys, "train", "--max-steps", "0")
    assert "--eval-size 0" in run(capsys, "train", "--eval-size", "0")
    assert "--eval-size 0" in run(capsys, "eval", "--eval-size", "0")


def test_a_bad_config_value_is_one_line(capsys):
    assert "num_generations" in run(capsys, "train", "--num-generations", "0")
    assert "warmup_steps=2.5: give a whole number of steps" in run(capsys, "train", "--warmup-steps", "2.5")


def test_the_cosine_schedule_with_a_warmup_ratio_from_the_command_line():
    from minigrpo.__main__ import build_parser, make_config

    args = build_parser().parse_args(["train", "--lr-scheduler-type", "cosine", "--warmup-steps", "0.1"])
    overrides = {name: getattr(args, name) for name in ("lr_scheduler_type", "warmup_steps")}
    config = make_config("tiny", overrides)
    assert (config.lr_scheduler_type, config.warmup_steps) == ("cosine", 0.1)


def test_debug_shows_the_traceback():
    with pytest.raises(FileNotFoundError, match="no such folder"):
        main(["eval", "--model", "/no/such/minigrpo-model", "--debug"])


def test_grade_says_what_it_does_before_it_starts(capsys, monkeypatch, tmp_path):
    import minigrpo.grading

    said_first = []

    def grade_command(path, **options):  # the grader itself: the line must be on stderr before it starts
        said_first.append(capsys.readouterr().err)
        return 0

    monkeypatch.setattr(minigrpo.grading, "grade_command", grade_command)
    (tmp_path / "class").mkdir()
    assert main(["grade", str(tmp_path / "class")]) == 0
    assert said_first == [
        f"grading {tmp_path / 'class'}: each notebook runs in a kernel of its own, its checks then judged apart; a "
        "line as each one finishes\n"
    ]
    assert main(["grade", str(tmp_path / "nothing-here")]) == 0  # a missing path: the grader's own error, no line
    assert said_first[1] == ""


def test_grade_checks_every_output_path_before_it_grades(capsys, monkeypatch, tmp_path):
    import minigrpo.grading

    def grade_command(path, **options):
        raise AssertionError("grading started before its output paths were checked")

    monkeypatch.setattr(minigrpo.grading, "grade_command", grade_command)
    (tmp_path / "class").mkdir()
    (tmp_path / "notes.txt").write_text("")
    assert "--csv class is a folder: give a file path" in run(capsys, "grade", "class", "--csv", "class")
    line = run(capsys, "grade", "class", "--checks-csv", "notes.txt/checks.csv")
    assert "--checks-csv notes.txt/checks.csv lies inside the file notes.txt" in line
    assert "--gradescope is empty" in run(capsys, "grade", "class", "--gradescope", "")
    assert "--feedback notes.txt is a file" in run(capsys, "grade", "class", "--feedback", "notes.txt")
    line = run(capsys, "grade", "class", "--csv", "out.csv", "--checks-csv", "./out.csv")
    assert "--csv and --checks-csv both name ./out.csv: give each its own path" in line
    monkeypatch.setattr("minigrpo.__main__.os.access", lambda path, mode: False)  # root may write anywhere
    assert "--csv grades.csv cannot be written" in run(capsys, "grade", "class", "--csv", "grades.csv")


def test_grade_refuses_an_empty_student_name_before_it_grades(capsys, tmp_path):
    (tmp_path / "class").mkdir()
    assert main(["grade", str(tmp_path / "class"), "--student", " "]) == 2
    assert capsys.readouterr().err == "error: --student is empty: give the student's name.\n"


def test_grade_makes_the_folders_its_outputs_go_in(capsys, tmp_path):
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "04_mine.ipynb").write_text("not a notebook")  # unreadable: no kernel starts
    outputs = ["--csv", "new/grades.csv", "--checks-csv", "new/checks.csv", "--gradescope", "gs/results.json"]
    assert main(["grade", "class", *outputs, "--feedback", "feedback"]) == 0
    for written in ("new/grades.csv", "new/checks.csv", "gs/results.json", "feedback/04_mine.md"):
        assert (tmp_path / written).is_file(), written


def test_a_tracker_that_is_not_installed_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr("minigrpo.run.trackers.is_installed", lambda tracker: tracker != "wandb")
    line = run(capsys, "train", "--report-to", "wandb")
    assert "report_to='wandb': wandb is not installed" in line and "pip install 'minigrpo[trackers]'" in line


@pytest.mark.parametrize(
    "saved, cause",
    [
        ('{"max_completion_length": "24"}', "max_completion_length='24' is a str"),
        ('{"max_completion_length": 0}', "max_completion_length=0: it must be positive"),
        ('{"max_completion_length": 24,', "not valid JSON"),
        ("[24]", "not a JSON object"),
    ],
)
def test_eval_names_the_saved_settings_it_cannot_use(capsys, tmp_path, saved, cause):
    """eval --model <run>/final reads the run's eval_settings.json: a damaged one is one line naming the file."""
    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    (model / "eval_settings.json").write_text(saved)
    line = run(capsys, "eval", "--model", "final")
    assert line.startswith("error: final/eval_settings.json: ") and cause in line, line
    assert "or delete the file to evaluate with the preset's settings" in line

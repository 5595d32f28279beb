"""A fast, helpful command line: `import minigrpo` and every --help load no torch, and every train flag has a help
line, from its GRPOConfig field's docstring, in the groups of TRL's GRPOConfig."""

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

import minigrpo
from minigrpo.__main__ import FLAG_GROUPS, TRL_SWITCHES, build_parser, config_field_help, first_sentence, main
from minigrpo.config import REFUSED_SWITCHES, GRPOConfig

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "datasets")
COMMANDS = ("train", "eval", "pretrain-tiny", "grade", "autograder")


def test_import_and_help_load_no_torch():
    """In a fresh interpreter: the package import and each subcommand's --help leave torch, transformers and
    datasets unloaded (they take seconds of CPU; the help needs none of them)."""
    script = f"""
import contextlib, io, sys
import minigrpo
from minigrpo.__main__ import main
for argv in ([], *[[command] for command in {COMMANDS!r}]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*argv, "--help"])
        except SystemExit as done:
            assert done.code == 0, argv
    assert "usage:" in out.getvalue(), argv
print(sorted(name for name in {HEAVY!r} if name in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_every_public_name_is_its_modules_object():
    import importlib

    for name in minigrpo.__all__:
        module = importlib.import_module(minigrpo._MODULE_OF[name])
        assert getattr(minigrpo, name) is getattr(module, name), name
    assert minigrpo.GRPOTrainer.__module__ == "minigrpo.trainer"
    assert set(minigrpo.__all__) <= set(dir(minigrpo))


def test_star_import_and_submodules():
    namespace = {}
    exec("from minigrpo import *", namespace)
    assert set(minigrpo.__all__) <= set(namespace) and namespace["GRPOConfig"] is GRPOConfig
    assert minigrpo.course.model_name  # a subpackage, reached as an attribute, as before the lazy import
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        minigrpo.no_such_name  # noqa: B018


def test_every_config_field_is_in_one_flag_group():
    grouped = [name for names in FLAG_GROUPS.values() for name in names] + list(TRL_SWITCHES)
    fields = [field.name for field in dataclasses.fields(GRPOConfig)]
    assert sorted(grouped) == sorted(fields), set(grouped) ^ set(fields)


def test_every_train_flag_has_a_help_line_in_its_group():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    groups = {group.title: group._group_actions for group in train._action_groups}
    for title, names in FLAG_GROUPS.items():
        flags = [action.option_strings[0] for action in groups[f"GRPOConfig: {title}"]]
        assert flags == ["--" + name.replace("_", "-") for name in names]
    for action in train._actions:
        if not isinstance(action, argparse._HelpAction):
            assert action.help and action.help.strip(), action.option_strings


def test_help_lines_come_from_the_field_docstrings():
    helps = config_field_help()
    assert helps["num_generations"] == "G, completions sampled per prompt (TRL's 8)."
    assert helps["scale_rewards"].endswith("or not at all (Dr. GRPO).")  # "Dr." does not end the sentence
    assert helps["adam_beta1"] == helps["adam_beta2"]  # declared together above one docstring
    assert len(helps) == len(dataclasses.fields(GRPOConfig))


def test_first_sentence_by_hand():
    assert first_sentence("One.  Two.") == "One."
    assert first_sentence("Clip, e.g. 0.28;\n    None means epsilon. More.") == "Clip, e.g. 0.28; None means epsilon."
    assert first_sentence("no stop at all") == "no stop at all"
    assert first_sentence("a 5% share.") == "a 5%% share."  # argparse formats help with %
    assert first_sentence("version 1.16 is pinned.") == "version 1.16 is pinned."  # a dot inside a number


def test_a_missing_optional_module_is_one_line_naming_its_extra(monkeypatch, capsys):
    """grade without the grade extra (nbformat, nbclient, ipykernel): one line saying what to install, exit 1."""

    def without_nbformat(args):
        raise ModuleNotFoundError("No module named 'nbformat'", name="nbformat")

    monkeypatch.setattr("minigrpo.__main__.run_grade", without_nbformat)
    assert main(["grade", "exercises"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "error: python -m minigrpo grade needs nbformat, which the 'grade' extra installs: "
        'pip install "minigrpo[grade]" (in a clone: pip install -e ".[grade]")'
    )

    def without_something_else(args):
        raise ModuleNotFoundError("No module named 'numpyy'", name="numpyy")

    monkeypatch.setattr("minigrpo.__main__.run_grade", without_something_else)
    with pytest.raises(ModuleNotFoundError):  # not an extra's: the traceback, as for any other bug
        main(["grade", "exercises"])


def commands() -> dict[str, argparse.ArgumentParser]:
    return build_parser()._subparsers._group_actions[0].choices


def test_every_option_of_every_command_has_help_and_shows_its_default():
    """Each option says what it does, and each that has a value when it is not given says which; train's GRPOConfig
    flags show the preset's (they default to nothing: a flag not given keeps the model's preset)."""
    fields = {field.name for field in dataclasses.fields(GRPOConfig)}
    for name, command in commands().items():
        formatter = command._get_formatter()
        for action in command._actions:
            if isinstance(action, argparse._HelpAction) or action.dest in REFUSED_SWITCHES:
                continue  # -h; TRL's switches, listed on one line (below)
            assert action.help and action.help.strip(), (name, action.dest)
            shown = formatter._expand_help(action)
            if (name == "train" and action.dest in fields) or action.default not in (
                None,
                False,
                [],
                argparse.SUPPRESS,
            ):
                assert "(default: " in shown, (name, action.dest, shown)


def test_train_help_shows_the_presets_values():
    """tiny_cpu()'s values, which `train` uses for 'tiny' (GRPOConfig.for_model), and qwen_t4()'s where they differ."""
    text = " ".join(commands()["train"].format_help().split())
    assert "(default: 0.0003 for 'tiny', 1e-06 for other models)" in text  # --learning-rate
    assert "(default: 200 for 'tiny', 100 for other models)" in text  # --max-steps
    assert "--beta BETA KL coefficient (DeepSeekMath 0.04; TRL 0.0). (default: 0.04)" in text
    assert "(default: 1.0 0.1)" in text  # --reward-weights: the task's, as make_config gives them


def test_the_values_help_shows_are_those_train_runs_with():
    """preset_defaults reads the presets without building a config (which loads torch): the same values as the
    configs train builds (make_config), but for the fields a config resolves from None (the batch sizes,
    eval_strategy), which help shows as None."""
    from minigrpo.__main__ import make_config, preset_defaults
    from minigrpo.config import RESOLVED_FIELDS

    for model in ("tiny", "Qwen/Qwen2.5-0.5B-Instruct"):
        shown, built = preset_defaults(model), make_config(model, {})
        for field in dataclasses.fields(GRPOConfig):
            if not (field.name in RESOLVED_FIELDS and shown[field.name] is None):
                assert shown[field.name] == getattr(built, field.name), (model, field.name)


def test_trls_switches_are_accepted_and_refused_but_listed_on_one_line(capsys, monkeypatch):
    """--use-vllm, --fp16, --push-to-hub, ... exist so that TRL scripts and recipes parse: named once, on the line of
    their group, without a help entry each; False is accepted and True refused, as before."""
    monkeypatch.setattr("minigrpo.models.load_model_and_tokenizer", lambda *a, **k: pytest.fail("loaded a model"))
    train = commands()["train"]
    text = train.format_help()
    assert "exist for TRL scripts" in text and "Refused when True" not in text
    for name in REFUSED_SWITCHES:
        flag = "--" + name.replace("_", "-")
        assert text.count(flag) == 1, flag
        assert getattr(train.parse_args([f"--no-{flag[2:]}"]), name) is False
        assert main(["train", flag]) == 2
        assert capsys.readouterr().err.startswith(f"error: {name}=True: ")

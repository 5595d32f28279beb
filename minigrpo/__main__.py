"""Command line: python -m minigrpo train | eval | pretrain-tiny | grade | autograder

python -m minigrpo train                      # tiny Qwen on the CPU, in minutes
python -m minigrpo train --max-steps 20 --beta 0 --loss-type dapo
python -m minigrpo train --resume             # continue from the last checkpoint
python -m minigrpo train --resume --allow-dataset-change  # ... on another training set (sampler restarted)
python -m minigrpo eval --model runs/minigrpo/final
python -m minigrpo pretrain-tiny              # rebuild the bundled tiny Qwen
python -m minigrpo pretrain-tiny --tools      # rebuild the bundled tools model (the calculator task)
torchrun --nproc-per-node 2 -m minigrpo train # data-parallel on 2 processes (GPUs, or CPU with gloo)

A mistake in the command (a missing model folder, an output folder that is a
file, --max-steps 0, a grade --csv path inside a file) is reported on one line
before any model is loaded or any notebook graded, and the command exits with
status 2; add --debug to see the traceback instead.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import json
import os
import re
import sys
import textwrap
import time
import types
import typing
from pathlib import Path

# no torch: --help prints before torch and transformers load
from minigrpo.config import GROUPS, OPTIONS, PRESETS, REFUSED_SWITCHES, GRPOConfig, preset_for
from minigrpo.trl_compat import BATCH_FIELDS

TRAIN_PROMPTS, EVAL_PROMPTS = 2000, 200
MAX_EVAL_SIZE = 10_000  # the held-out half of the problems with operands 0..99 holds fewer distinct ones
EXIT_USAGE = 2  # the exit status of a command-line mistake, as argparse uses
# A Hub id: "name" or "org/name" (letters, digits, "-", "_", "."). Anything else that is not on disk is a path.
_HUB_ID_RE = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


FLAG_GROUPS = {
    title: tuple(name for name, option in OPTIONS.items() if option.group == group and not option.refused)
    for group, title in GROUPS.items()
}
"""The train command's GRPOConfig flags by --help section, read from each field's Option (config.GROUPS); TRL's
switches that minigrpo refuses at True are in TRL_SWITCHES instead."""
TRL_SWITCHES = tuple(REFUSED_SWITCHES)
"""Flags that exist for TRL scripts and recipes (--use-vllm, --fp16, --push-to-hub, ...): accepted at False, refused at
True (config.REFUSED_SWITCHES). --help names them on one line instead of an entry each."""


@functools.cache
def config_field_help() -> dict[str, str]:
    """{field: the first sentence of its docstring}, read from config.py's source with ast (milliseconds, and nothing
    imported). A field's docstring is the string literal after it; fields declared together above one string (adam_beta1
    and adam_beta2) share it."""
    import minigrpo.config

    try:
        tree = ast.parse(Path(minigrpo.config.__file__).read_text(encoding="utf-8"))
    except OSError:  # no source installed (bytecode only): flags without help lines
        return {}
    (config_class,) = (node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "GRPOConfig")
    helps, undocumented = {}, []
    for statement in config_class.body:
        if isinstance(statement, ast.AnnAssign):
            undocumented.append(statement.target.id)
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and undocumented:
            helps.update(dict.fromkeys(undocumented, first_sentence(str(statement.value.value))))
            undocumented = []
        else:
            undocumented = []
    return helps


def first_sentence(text: str) -> str:
    """The text up to its first full stop followed by a space (or the end), on one line, ready for argparse."""
    line = " ".join(text.split())
    match = re.search(r"(?<!e\.g)(?<!i\.e)(?<!vs)(?<!Dr)\.(\s|$)", line)  # not the stop of "e.g." or "Dr."
    return (line[: match.start() + 1] if match else line).replace("%", "%%")


def _config_flags(parser: argparse.ArgumentParser) -> None:
    """One --flag per GRPOConfig field (--learning-rate, --beta, --loss-type, ...), with its docstring's first
    sentence and the preset's value as help, in FLAG_GROUPS' groups; TRL_SWITCHES in a group of their own, named
    on its one line."""
    hints = typing.get_type_hints(GRPOConfig)
    helps = config_field_help()
    tiny, other = preset_defaults("tiny"), preset_defaults("Qwen/Qwen2.5-0.5B-Instruct")  # other: any model but tiny
    for title, names in FLAG_GROUPS.items():
        group = parser.add_argument_group(f"GRPOConfig: {title}")
        for name in names:
            if name in BATCH_FIELDS and tiny[name] is None is other[name]:
                shown = "None, derived from the others"
            elif tiny[name] == other[name]:
                shown = _shown(tiny[name])
            else:
                shown = f"{_shown(tiny[name])} for 'tiny', {_shown(other[name])} for other models"
            _add_config_flag(group, name, hints[name], f"{helps.get(name, '')} (default: {shown})".lstrip())
    flags = [f"--{name.replace('_', '-')}" for name in TRL_SWITCHES]
    switches = parser.add_argument_group(
        "TRL's switches",
        f"{', '.join(flags)}: these exist for TRL scripts and recipes that pass them. Each is accepted at False "
        "(--no-use-vllm) and refused at True, with what minigrpo does instead (docs/trl.md).",
    )
    for name in TRL_SWITCHES:
        _add_config_flag(switches, name, hints[name], argparse.SUPPRESS)


def preset_defaults(model_name: str) -> dict:
    """Every GRPOConfig field's value in `train --model model_name` when its flag is not given: the model's preset
    (config.preset_for), else the field's default, with the task's reward weights (make_config). Read from the
    presets, not from a built config, which would load torch; a batch field left None is derived when one is built."""
    defaults = {field.name: field.default for field in dataclasses.fields(GRPOConfig)}
    return defaults | PRESETS[preset_for(model_name)] | {"reward_weights": list(task_reward_weights())}


@functools.cache
def task_reward_weights() -> tuple[float, ...]:
    """tasks.arithmetic.REWARD_WEIGHTS, read from the module's source with ast (importing it loads datasets)."""
    import minigrpo.tasks

    source = Path(minigrpo.tasks.__file__).with_name("arithmetic.py").read_text(encoding="utf-8")
    (value,) = (
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "REWARD_WEIGHTS"
    )
    return ast.literal_eval(value)


def _shown(value) -> str:
    """A default as the flag takes it: [1.0, 0.1] -> '1.0 0.1'."""
    shown = " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    return shown.replace("%", "%%")  # argparse formats help with %


def _add_config_flag(group, name: str, kind, help_line: str) -> None:
    flag = "--" + name.replace("_", "-")
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType)
    choices = [a for a in typing.get_args(kind) if a is not type(None)] if optional else [kind]
    base = str if str in choices else choices[0]  # report_to, model_init_kwargs (JSON): given as text
    if typing.get_origin(base) is list:
        group.add_argument(flag, type=float, nargs="+", default=argparse.SUPPRESS, help=help_line)
    elif base is bool:
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_line)
    elif typing.get_origin(base) is typing.Literal:
        group.add_argument(flag, choices=typing.get_args(base), default=argparse.SUPPRESS, help=help_line)
    else:
        group.add_argument(flag, type=base, default=argparse.SUPPRESS, help=help_line)


# --- checks that run before any model is loaded ------------------------------------
def check_model_name(name: str) -> str:
    """The name to load: "tiny", a Hub id, or an existing model folder (returned with ~ expanded).

    How a Hub id is told from a path: what exists on disk is a path, and must hold a saved model (config.json, or
    a LoRA run's adapter_config.json, and tokenizer files); what does not exist is a Hub id if it looks like one
    ("name" or "org/name"), and a missing folder otherwise (it starts with ".", "/" or "~", or has a backslash or
    more than one "/").
    """
    if name in ("tiny", "tiny-tools"):
        return name
    path = Path(name).expanduser()
    if path.is_file():
        raise ValueError(f"--model {name} is a file: give the folder that holds config.json (from save_pretrained).")
    if path.is_dir():
        if (path / "adapter_config.json").is_file():  # a LoRA run's adapters: loaded on the base model they name
            from minigrpo.models import adapter_base

            adapter_base(path)  # a base that was moved, or a circle of adapter folders: the error says what to fix
        elif not (path / "config.json").is_file():
            raise ValueError(
                f"--model {name} is a folder without config.json, not a saved model: give the folder written by "
                "save_pretrained (e.g. runs/minigrpo/final), 'tiny', or a Hub id."
            )
        if not any((path / file).is_file() for file in _TOKENIZER_FILES):
            raise ValueError(
                f"--model {name} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}): save the tokenizer "
                "into the same folder (tokenizer.save_pretrained)."
            )
        return str(path)
    if _HUB_ID_RE.fullmatch(name):
        return name
    raise FileNotFoundError(
        f"--model {name}: no such folder. Give an existing folder written by save_pretrained, 'tiny', "
        "or a Hub id such as Qwen/Qwen2.5-0.5B-Instruct."
    )


def check_output_dir(output_dir: str, flag: str = "--output-dir") -> None:
    """Fail now, not after the first training steps, when `output_dir` is empty (the current folder), a file, or
    cannot be created or written. flag: the option it came from (--output-dir, --logging-dir)."""
    if not output_dir.strip():
        raise ValueError(f"{flag} is empty, which means the current folder: give a folder (it is created if missing).")
    path = Path(output_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {output_dir} is a file: give a folder (it is created if missing).")
    existing = next(p for p in (path, *path.parents) if p.exists())  # the folder it would be created in
    if not existing.is_dir():
        raise ValueError(f"{flag} {output_dir} lies inside the file {existing}: give a folder path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f"{flag} {output_dir} is not writable (no write permission on {existing}): choose another folder."
        )


def check_output_file(path: str, flag: str) -> None:
    """Fail now, not after grading a class, when the file `path` cannot be written: empty, a folder, inside a file,
    or in a folder that cannot be created or written. flag: the option it came from (--csv, --gradescope, ...)."""
    if not path.strip():
        raise ValueError(f"{flag} is empty: give a file path (its folder is created if missing).")
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{flag} {path} is a folder: give a file path (its folder is created if missing).")
    existing = next(p for p in target.parents if p.exists())  # the folder it would be created in
    if not existing.is_dir():
        raise ValueError(f"{flag} {path} lies inside the file {existing}: give a file path in a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f"{flag} {path} cannot be written (no write permission on {existing}): choose another path."
        )


def check_grade_outputs(args: argparse.Namespace) -> None:
    """Every output `grade` was asked to write (the files of --csv, --checks-csv and --gradescope, the folder of
    --feedback) can be written, each at a path of its own: said before grading starts, not after hours of it."""
    outputs = {"--csv": args.csv, "--checks-csv": args.checks_csv, "--gradescope": args.gradescope}
    outputs["--feedback"] = args.feedback
    seen: dict[str, str] = {}  # absolute path -> the flag that named it
    for flag, path in outputs.items():
        if path is None:
            continue
        if flag == "--feedback":
            check_output_dir(path, flag)
        else:
            check_output_file(path, flag)
        if os.path.abspath(path) in seen:
            raise ValueError(f"{seen[os.path.abspath(path)]} and {flag} both name {path}: give each its own path.")
        seen[os.path.abspath(path)] = flag


def check_positive(flag: str, value: int, what: str, most: int | None = None) -> None:
    """value must be 1 or more (and at most `most`, with the reason in `what`)."""
    if value < 1 or (most is not None and value > most):
        allowed = "1 or more" if most is None else f"1 to {most:,}"
        raise ValueError(f"{flag} {value}: {what}; give {allowed}.")


def check_eval_size(eval_size: int) -> None:
    check_positive(
        "--eval-size", eval_size, "accuracy needs at least one held-out problem, and more than "
        f"{MAX_EVAL_SIZE:,} only repeats problems (greedy decoding scores a repeat the same)", MAX_EVAL_SIZE,
    )  # fmt: skip


def load_checked(model_name: str):
    """load_model_and_tokenizer, with a Hub failure (no connection, unknown id) turned into one clear line."""
    from minigrpo.models import load_model_and_tokenizer
    from minigrpo.run.progress import library_bars_off

    try:
        with library_bars_off():  # no "Loading weights" bar: the command's own lines say what it does
            return load_model_and_tokenizer(model_name)
    except OSError as error:
        reason = _first_line(error)
        raise OSError(
            f"could not load --model {model_name} from the Hugging Face Hub ({reason}): check the id and the "
            "connection, or give a local folder written by save_pretrained."
        ) from error


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


# --- the commands ---------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minigrpo", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add_command = functools.partial(commands.add_parser, formatter_class=HelpFormatter)

    train = add_command(
        "train",
        help="train a model with GRPO on arithmetic",
        usage="%(prog)s [--model MODEL] [--resume] [--eval-size N] [--GRPOConfig-field VALUE ...]",
        description="Train a model with GRPO on arithmetic. Every GRPOConfig field is a flag (--learning-rate, "
        "--beta, ...); a flag not given keeps the model's preset: GRPOConfig.tiny_cpu() for 'tiny', qwen_t4() "
        "for any other model.",
    )
    train.add_argument(
        "--model",
        default=None,
        help="'tiny' (default on CPU; 'tiny-tools' with --task calculator), a Hub id or a local path",
    )
    train.add_argument(
        "--task",
        choices=TASKS,
        default="arithmetic",
        help="arithmetic: sums, one-turn answers; calculator: 3-digit products with a calculator tool the model may "
        "call (each completion an episode; GRPOConfig.tiny_tools_cpu() for 'tiny-tools') (default: %(default)s)",
    )
    train.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    train.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: continue even though training-defining flags differ from the checkpoint's run",
    )
    train.add_argument(
        "--allow-dataset-change",
        action="store_true",
        help="with --resume: continue on this training set although the checkpoint's run trained on another one "
        "(the prompt sampler starts afresh)",
    )
    train.add_argument(
        "--eval-size", type=int, default=EVAL_PROMPTS, help="held-out problems for accuracy (default: %(default)s)"
    )
    _config_flags(train)

    evaluate = add_command("eval", help="held-out greedy accuracy of a model")
    evaluate.add_argument(
        "--model",
        default=None,
        help="'tiny', 'tiny-tools', a Hub id or a local path (e.g. runs/minigrpo/final) (default: 'tiny', "
        "'tiny-tools' with --task calculator)",
    )
    evaluate.add_argument("--task", choices=TASKS, default="arithmetic", help="what to score (default: %(default)s)")
    evaluate.add_argument(
        "--eval-size", type=int, default=EVAL_PROMPTS, help="held-out problems to score (default: %(default)s)"
    )
    evaluate.add_argument(
        "--seed",
        type=int,
        default=0,
        help="which held-out problems are drawn (default: %(default)s, the ones train evaluates on)",
    )

    pretrain = add_command("pretrain-tiny", help="rebuild the bundled tiny Qwen (supervised warm-up)")
    pretrain.add_argument(
        "--output-dir",
        default=None,
        help="where to write it (default: the package's assets/tiny-qwen, or assets/tiny-qwen-tools with --tools)",
    )
    pretrain.add_argument(
        "--target-accuracy",
        type=float,
        default=0.3,
        help="stop once held-out accuracy reaches it (default: %(default)s; not with --tools, which runs a fixed "
        "number of steps)",
    )
    pretrain.add_argument(
        "--tools",
        action="store_true",
        help="rebuild the tools model instead: it calls a calculator tool on some multiplications and guesses on "
        "the others (load_model_and_tokenizer('tiny-tools'))",
    )
    pretrain.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the weights, the training problems and the held-out ones (default: %(default)s)",
    )

    grade = add_command(
        "grade",
        help="grade an exercise notebook, or a class's folder of them",
        description="Grade notebooks: a .ipynb file, a flat folder (the student is the file's stem), a folder per "
        "student, nbgrader's submitted/ (submitted/<student>/<assignment>/*.ipynb), or one student's folder of it "
        "(submitted/<student>); it says which layout it read. Each notebook is graded on its exercise's checks and "
        "maximum; a student with several notebooks of one exercise gets the best score.",
    )
    grade.add_argument("path", help="a .ipynb file or a folder")
    grade.add_argument("--json", action="store_true", help="print the scores as JSON")
    grade.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="seconds per notebook, its cells and the judging of its checks (default: its exercise's limit, "
        f"{_time_limits()})",
    )
    grade.add_argument(
        "--jobs", type=int, default=None, help="notebooks graded at once (default: $MINIGRPO_GRADE_JOBS, else up to 4)"
    )
    grade.add_argument(
        "--csv",
        default=None,
        metavar="PATH",
        help="also write the gradebook to PATH: one row per student (student, one column per exercise, total)",
    )
    grade.add_argument(
        "--checks-csv", default=None, metavar="PATH", help="also write one row per notebook and check to PATH"
    )
    grade.add_argument("--feedback", default=None, metavar="DIR", help="also write a feedback file per student to DIR")
    grade.add_argument(
        "--gradescope",
        default=None,
        metavar="FILE",
        help="also write Gradescope's results.json for PATH, one student's submission, to FILE",
    )
    grade.add_argument(
        "--student",
        default=None,
        metavar="NAME",
        help="every notebook under PATH is NAME's (one student's folder anywhere); default: read from the folders, "
        "the layout read said in one line (a folder right below one named submitted is one student's)",
    )
    grade.add_argument(
        "--require-sandbox",
        action="store_true",
        help="refuse to grade (exit status 2) where no operating-system sandbox can run the notebooks (bubblewrap on "
        "Linux); without it, grading there goes on and says in one line that it grades trusted code only",
    )
    grade.add_argument(
        "--exercise",
        action="append",
        default=[],
        metavar="ID",
        help="with --gradescope: an exercise the assignment asks for (id or number; repeat for more); one not handed "
        "in scores 0 of its maximum (default: the exercises handed in)",
    )
    autograder = add_command(
        "autograder",
        help="write Gradescope's autograder zip for an exercise",
        description="Write a zip for Gradescope: setup.sh (CPU torch and minigrpo from WHEEL, this very version) and "
        "run_autograder (grade the submission, write results.json).",
    )
    autograder.add_argument("exercise", help="the exercise's id or number (04 or 04_group_relative_advantages)")
    autograder.add_argument(
        "--wheel", required=True, help="minigrpo's wheel, this version (pip wheel --no-deps -w dist . in the checkout)"
    )
    autograder.add_argument("--out", default="autograder.zip", help="the zip to write (default: autograder.zip)")
    for command in (train, evaluate, pretrain, grade, autograder):
        command.add_argument("--debug", action="store_true", help="on an error, show the full traceback")
    return parser


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with lines broken between words only: never inside a flag (--push-to-hub), a file name or
    a number such as 1e-06."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)  # fmt: skip


def _time_limits() -> str:
    """The grader's default limit per exercise, for --help: TIME_LIMIT_FACTOR x the time its solution takes to grade.

    Read from the sources of grading/exercises.py and each check module's `EXERCISE = exercise(id, checks,
    solution_seconds=...)` (importing the grader would load torch, and --help must not)."""
    import ast
    from pathlib import Path

    grading = Path(__file__).parent / "grading"
    factor = next(
        node.value.value
        for node in ast.parse((grading / "exercises.py").read_text()).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "TIME_LIMIT_FACTOR"
    )
    limits = {}
    for path in sorted((grading / "checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "exercise":
                seconds = next(k.value.value for k in node.keywords if k.arg == "solution_seconds")
                limits[node.args[0].value] = factor * seconds
    listed = ", ".join(f"{exercise[:2]} {limits[exercise]} s" for exercise in sorted(limits))
    return f"{factor}x the time its solution takes to grade: {listed}"


TASKS = ("arithmetic", "calculator")


def task_rewards(task: str) -> tuple[list, list, list[float]]:
    """What `--task` scores with: (reward functions, tools, reward weights). The first reward function is the
    accuracy train and eval report."""
    if task == "calculator":
        from minigrpo.tasks.calculator import CALCULATOR_REWARD_FUNCS, CALCULATOR_REWARD_WEIGHTS, calculator

        return list(CALCULATOR_REWARD_FUNCS), [calculator], list(CALCULATOR_REWARD_WEIGHTS)
    from minigrpo.tasks.arithmetic import REWARD_WEIGHTS, correctness_reward, format_reward

    return [correctness_reward, format_reward], [], list(REWARD_WEIGHTS)


def task_dataset(task: str, size: int, split: str, seed: int):
    """`size` problems of `--task` from `split` ("train" or "test")."""
    if task == "calculator":
        from minigrpo.tasks.calculator import make_calculator_dataset

        return make_calculator_dataset(size, split, seed=seed)
    from minigrpo.tasks.arithmetic import make_arithmetic_dataset

    return make_arithmetic_dataset(size, split, seed=seed)


def make_config(model_name: str, overrides: dict, reward_weights: list[float] | None = None) -> GRPOConfig:
    """The preset for the model (tiny on CPU, the tools model's for 'tiny-tools', T4-safe for a real Qwen), with
    command-line overrides; reward_weights: the task's (default: arithmetic's)."""
    from minigrpo.tasks.arithmetic import REWARD_WEIGHTS

    weights = list(REWARD_WEIGHTS) if reward_weights is None else reward_weights
    return GRPOConfig.for_model(model_name, **{"reward_weights": weights, **overrides})


def run_train(args: argparse.Namespace) -> None:
    from minigrpo.models import default_model_name
    from minigrpo.run import distributed
    from minigrpo.run.evaluation import evaluate_model
    from minigrpo.run.progress import last_evaluation, library_bars_off, run_summary
    from minigrpo.run.trackers import resolve_trackers
    from minigrpo.trainer import GRPOTrainer

    tools_task = args.task == "calculator"
    model_name = check_model_name(args.model or ("tiny-tools" if tools_task else default_model_name()))
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    reward_funcs, tools, weights = task_rewards(args.task)  # eval_accuracy: the first function's mean
    config = make_config(model_name, {k: v for k, v in vars(args).items() if k in fields}, weights)
    if config.max_steps != -1:  # -1: num_train_epochs passes over the prompts, as in the API and TRL
        check_positive("--max-steps", config.max_steps, "training needs at least one step (or -1: num_train_epochs)")
    check_eval_size(args.eval_size)
    check_positive(
        "--prompts-per-step", config.prompts_per_step, f"a step draws from the {TRAIN_PROMPTS:,} training problems",
        TRAIN_PROMPTS,
    )  # fmt: skip
    check_output_dir(config.output_dir)
    if config.logging_dir is not None:
        check_output_dir(config.logging_dir, "--logging-dir")
    resolve_trackers(config.report_to)  # --report-to wandb without wandb: said now, not after the model loads
    distributed.init_from_environment()  # under torchrun: join the process group (and pick this rank's GPU)
    say = print if distributed.is_main_process() else lambda *_: None  # one copy of each line, from rank 0
    model, tokenizer = load_checked(model_name)
    train_data = task_dataset(args.task, TRAIN_PROMPTS, "train", config.seed)
    eval_data = task_dataset(args.task, args.eval_size, "test", seed=0)
    processes = f" on {distributed.world_size()} processes" if distributed.is_distributed() else ""
    say(
        f"model {model_name} on {next(model.parameters()).device}{processes}; "
        f"{config.max_steps if config.max_steps > 0 else f'{config.num_train_epochs:g} epochs of'} steps of "
        f"{config.prompts_per_step} prompts x G={config.num_generations}; output in {config.output_dir}"
    )
    weighted = zip(config.reward_weights or [1.0] * len(reward_funcs), reward_funcs, strict=True)
    say(
        "reward = " + " + ".join(f"{weight:g} x {func.__name__}" for weight, func in weighted) + " (the lessons' scale)"
    )
    if tools:
        say(f"tools: {', '.join(tool.__name__ for tool in tools)} (each completion an episode: call, result, answer)")
    trainer = GRPOTrainer(
        model, reward_funcs, config, train_data, eval_data, processing_class=tokenizer, tools=tools
    )  # before the first evaluation: it checks the tokenizer can run the tools
    before = evaluate_model(model, tokenizer, eval_data, reward_funcs, config, tools)["eval_accuracy"]
    started = time.perf_counter()
    trainer.train(
        resume_from_checkpoint=args.resume,
        allow_config_change=args.allow_config_change,
        allow_dataset_change=args.allow_dataset_change,
    )
    history = trainer.state.log_history
    with library_bars_off():  # no "Writing model shards" bar below the run's
        final = trainer.save_model(Path(config.output_dir) / "final")
    if distributed.is_main_process():  # what `eval --model <final>` reads to evaluate as this run did
        record_eval_settings(final, config)
    evaluated = last_evaluation(history)
    if evaluated is None or evaluated["step"] != trainer.step:  # the saved model was not evaluated: evaluate it now
        after = evaluate_model(model, tokenizer, eval_data, reward_funcs, config, tools)["eval_accuracy"]
    else:
        after = evaluated["eval_accuracy"]
    say(f"trained in {time.perf_counter() - started:.0f}s")
    measured = f"{args.eval_size} held-out problems; {eval_settings(config)}"
    task_flag = f" --task {args.task}" if args.task != "arithmetic" else ""
    say(run_summary(history, before, after, measured, config.output_dir, final, trainer.metrics_path, task_flag))
    distributed.teardown()


# --- eval evaluates a run's model as train did ----------------------------------------
EVAL_FIELDS = ("max_prompt_length", "max_completion_length", "eval_batch_size", "bf16")
"""The settings that decide a greedy evaluation's completions: the prompt cut-off, the completion length, how prompts
are batched (a batch is left-padded to its longest prompt, and other padding gives other float rounding, which can
flip a near-tied greedy token) and the precision."""
EVAL_SETTINGS_FILE = "eval_settings.json"


def record_eval_settings(model_dir: Path, config: GRPOConfig) -> None:
    """Write the run's EVAL_FIELDS beside its saved model, for `eval --model <that folder>`."""
    settings = {name: getattr(config, name) for name in EVAL_FIELDS}
    (Path(model_dir) / EVAL_SETTINGS_FILE).write_text(json.dumps(settings, indent=1) + "\n")


def eval_config(model_name: str) -> GRPOConfig:
    """The config `eval` evaluates with: the model's preset (tiny_cpu() for 'tiny', qwen_t4() otherwise: what `train`
    evaluates it with before training) with the EVAL_FIELDS of the run that saved it, when its folder records them,
    so that `eval --model runs/minigrpo/final` prints the accuracy `train` printed."""
    config = GRPOConfig.for_model(model_name)
    recorded = Path(model_name) / EVAL_SETTINGS_FILE
    if model_name != "tiny" and recorded.is_file():
        try:
            settings = json.loads(recorded.read_text())
            if not isinstance(settings, dict):
                raise TypeError(f"it holds {type(settings).__name__} {settings!r}, not a JSON object")
            config = config.replace(**{name: settings[name] for name in EVAL_FIELDS if name in settings})
        except (ValueError, TypeError) as error:  # not JSON (a ValueError), or a value GRPOConfig refuses
            raise ValueError(
                f"{recorded}: {_settings_problem(error)}. It records the settings train evaluated with (a JSON object "
                f"of {', '.join(EVAL_FIELDS)}): correct it, or delete the file to evaluate with the preset's settings."
            ) from error
    return config


def _settings_problem(error: Exception) -> str:
    """What is wrong with an eval_settings.json, from the error reading it raised (without GRPOConfig's mention of
    the bare default, which is not what the run used)."""
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON ({error})"
    return _first_line(error).removeprefix("GRPOConfig: ").split(" (its default: ")[0].rstrip(".")


def eval_settings(config: GRPOConfig) -> str:
    """How accuracy was measured, as train and eval print it."""
    return (
        f"greedy, up to {config.max_completion_length} new tokens, {config.eval_batch_size} prompts per batch, "
        f"{'bf16 autocast where native' if config.bf16 else 'fp32'}"
    )


def run_eval(args: argparse.Namespace) -> None:
    from minigrpo.run.evaluation import evaluate_model
    from minigrpo.tool_calling import check_tool_support

    model_name = check_model_name(args.model or ("tiny-tools" if args.task == "calculator" else "tiny"))
    check_eval_size(args.eval_size)
    config = eval_config(model_name)
    model, tokenizer = load_checked(model_name)
    reward_funcs, tools, _ = task_rewards(args.task)
    if tools:
        check_tool_support(tokenizer, tools)
    eval_data = task_dataset(args.task, args.eval_size, "test", seed=args.seed)
    metrics = evaluate_model(model, tokenizer, eval_data, reward_funcs[:1], config, tools)
    calls = f"; {metrics['eval_tools/call_frequency']:.2f} tool calls per answer" if tools else ""
    measured = f"{args.eval_size} held-out problems; {eval_settings(config)}"
    print(f"accuracy: {metrics['eval_accuracy']:.3f}{calls} ({measured}) for {model_name}")


def run_pretrain(args: argparse.Namespace) -> None:
    from minigrpo.course.pretrain import pretrain_tiny, pretrain_tiny_tools
    from minigrpo.models import TINY_MODEL_DIR, TINY_TOOLS_MODEL_DIR

    output_dir = args.output_dir or (TINY_TOOLS_MODEL_DIR if args.tools else TINY_MODEL_DIR)
    check_output_dir(str(output_dir))
    if args.tools:
        pretrain_tiny_tools(output_dir, seed=args.seed)
    else:
        pretrain_tiny(output_dir, target_accuracy=args.target_accuracy, seed=args.seed)


def run_grade(args: argparse.Namespace) -> int:
    if args.exercise and args.gradescope is None:
        print(
            "error: --exercise names the assignment's exercises for --gradescope: give --gradescope FILE too.",
            file=sys.stderr,
        )
        return 2
    if args.student is not None and not args.student.strip():
        print("error: --student is empty: give the student's name.", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs {args.jobs}: give 1 or more notebooks at once.", file=sys.stderr)
        return 2
    if args.timeout is not None and args.timeout < 1:
        print(f"error: --timeout {args.timeout}: give 1 second or more per notebook.", file=sys.stderr)
        return 2
    check_grade_outputs(args)
    if Path(args.path).exists():  # said before the grader's imports and the first kernel's start, which take seconds
        print(
            f"grading {args.path}: each notebook runs in a kernel of its own, its checks then judged apart; "
            "a line as each one finishes",
            file=sys.stderr,
            flush=True,
        )
    from minigrpo.grading import grade_command

    return grade_command(
        args.path,
        as_json=args.json,
        timeout=args.timeout,
        jobs=args.jobs,
        csv_path=args.csv,
        checks_csv_path=args.checks_csv,
        writers=grade_writers(args),
        student=args.student,
        require_sandbox=args.require_sandbox,
    )


def grade_writers(args: argparse.Namespace) -> list:
    """What --feedback and --gradescope write once grading ends: functions of (reports, seconds, the notebooks an
    interrupt left ungraded), paths made absolute (grading leaves the working folder)."""
    from minigrpo.grading.reports.feedback import write_feedback
    from minigrpo.grading.reports.gradescope import exercise_ids, write_results

    writers = []
    if args.feedback is not None:
        folder = os.path.abspath(args.feedback)
        writers.append(lambda reports, seconds, not_graded: write_feedback(reports, folder, not_graded))
    if args.gradescope is not None:
        path, exercises = os.path.abspath(args.gradescope), exercise_ids(args.exercise)
        writers.append(
            lambda reports, seconds, not_graded: write_results(reports, path, exercises, seconds, not_graded)
        )
    return writers


# Modules of an optional extra (pyproject.toml), which a command imports only when it needs them: a missing one is a
# line that names the extra, not a traceback.
OPTIONAL_MODULES = {"nbformat": "grade", "nbclient": "grade", "jupyter_client": "grade", "ipykernel": "grade"}


def usage_errors() -> tuple[type[BaseException], ...]:
    """The errors reported on one line: bad input (ValueError, OSError) and minigrpo's own errors that name what to
    change (a tracker --report-to names that is not installed among them). Each of minigrpo's classes is taken from
    its module only if that module was imported: an error of a module that never loaded cannot have been raised, and
    importing it here would load torch for nothing."""
    errors = [ValueError, OSError]
    for module, name in (
        ("minigrpo.rewards", "RewardFunctionError"),
        ("minigrpo.run.checkpoints", "CheckpointError"),
        ("minigrpo.run.distributed", "RankFailedError"),
        ("minigrpo.run.trackers", "MissingTrackerError"),
    ):
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            run_train(args)
        elif args.command == "eval":
            run_eval(args)
        elif args.command == "pretrain-tiny":
            run_pretrain(args)
        elif args.command == "grade":
            return run_grade(args)
        elif args.command == "autograder":
            from minigrpo.grading.reports.gradescope import autograder_command

            return autograder_command(args.exercise, args.wheel, args.out)
    except FloatingPointError as error:  # trainer.NonFiniteError: the run diverged, which is not a usage mistake
        if args.debug:
            raise
        print(f"error: {_first_line(error)}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as error:
        extra = OPTIONAL_MODULES.get((error.name or "").partition(".")[0])
        if args.debug or extra is None:
            raise
        print(
            f"error: python -m minigrpo {args.command} needs {error.name}, which the '{extra}' extra installs: "
            f'pip install "minigrpo[{extra}]" (in a clone: pip install -e ".[{extra}]")',
            file=sys.stderr,
        )
        return 1
    except Exception as error:
        if args.debug or not isinstance(error, usage_errors()):
            raise
        print(f"error: {_first_line(error)} (--debug shows the traceback)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

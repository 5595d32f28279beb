"""Command line: python -m minigrpo train | eval | pretrain-tiny | grade

python -m minigrpo train                      # tiny Qwen on the CPU, ~5 minutes
python -m minigrpo train --max-steps 20 --beta 0 --loss-type dapo
python -m minigrpo train --resume             # continue from the last checkpoint
python -m minigrpo eval --model runs/minigrpo/final
python -m minigrpo pretrain-tiny              # rebuild the bundled tiny Qwen
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import types
import typing

from minigrpo.config import GRPOConfig

TRAIN_PROMPTS, EVAL_PROMPTS = 2000, 200


def _config_flags(parser: argparse.ArgumentParser) -> None:
    """One --flag per GRPOConfig field (--learning-rate, --beta, --loss-type, ...)."""
    hints = typing.get_type_hints(GRPOConfig)
    group = parser.add_argument_group("GRPOConfig fields (defaults: the preset for the model)")
    for field in dataclasses.fields(GRPOConfig):
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        optional = typing.get_origin(kind) in (typing.Union, types.UnionType)
        base = next(a for a in typing.get_args(kind) if a is not type(None)) if optional else kind
        if typing.get_origin(base) is list:
            group.add_argument(flag, type=float, nargs="+", default=argparse.SUPPRESS)
        elif base is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)
        elif typing.get_origin(base) is typing.Literal:
            group.add_argument(flag, choices=typing.get_args(base), default=argparse.SUPPRESS)
        else:
            group.add_argument(flag, type=base, default=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minigrpo", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model with GRPO on arithmetic")
    train.add_argument("--model", default=None, help="'tiny' (default on CPU), a Hub id or a local path")
    train.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    train.add_argument("--eval-size", type=int, default=EVAL_PROMPTS, help="held-out problems for accuracy")
    _config_flags(train)

    evaluate = commands.add_parser("eval", help="held-out greedy accuracy of a model")
    evaluate.add_argument("--model", default="tiny", help="'tiny', a Hub id or a local path (e.g. runs/minigrpo/final)")
    evaluate.add_argument("--eval-size", type=int, default=EVAL_PROMPTS)
    evaluate.add_argument("--seed", type=int, default=0)

    pretrain = commands.add_parser("pretrain-tiny", help="rebuild the bundled tiny Qwen (supervised warm-up)")
    pretrain.add_argument("--output-dir", default=None, help="default: the package's assets/tiny-qwen")
    pretrain.add_argument("--target-accuracy", type=float, default=0.35, help="stop once held-out accuracy reaches it")
    pretrain.add_argument("--seed", type=int, default=0)

    grade = commands.add_parser("grade", help="grade an exercise notebook or a folder of them")
    grade.add_argument("path", help="a .ipynb file or a folder")
    grade.add_argument("--json", action="store_true", help="print the scores as JSON")
    grade.add_argument("--timeout", type=int, default=600, help="seconds per notebook")
    return parser


def make_config(model_name: str, overrides: dict) -> GRPOConfig:
    """The preset for the model (tiny on CPU, T4-safe for a real Qwen), with command-line overrides."""
    from minigrpo.tasks.arithmetic import REWARD_WEIGHTS

    return GRPOConfig.for_model(model_name, **{"reward_weights": list(REWARD_WEIGHTS), **overrides})


def run_train(args: argparse.Namespace) -> None:
    from minigrpo.models import default_model_name, load_model_and_tokenizer
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward, make_arithmetic_dataset
    from minigrpo.trainer import GRPOTrainer, evaluate_model

    model_name = args.model or default_model_name()
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    config = make_config(model_name, {k: v for k, v in vars(args).items() if k in fields})
    model, tokenizer = load_model_and_tokenizer(model_name)
    train_data = make_arithmetic_dataset(TRAIN_PROMPTS, "train", seed=config.seed)
    eval_data = make_arithmetic_dataset(args.eval_size, "test", seed=0)
    reward_funcs = [correctness_reward, format_reward]  # the first one is eval/accuracy
    print(
        f"model {model_name} on {next(model.parameters()).device}; {config.max_steps} steps of "
        f"{config.prompts_per_step} prompts x G={config.num_generations}; output in {config.output_dir}"
    )
    before = evaluate_model(model, tokenizer, eval_data, reward_funcs, config)["eval/accuracy"]
    trainer = GRPOTrainer(model, tokenizer, reward_funcs, train_data, config, eval_dataset=eval_data)
    started = time.perf_counter()
    history = trainer.train(resume_from_checkpoint=args.resume)
    final = trainer.save_model()
    after = next(m["eval/accuracy"] for m in reversed(history) if "eval/accuracy" in m)
    print(f"trained in {time.perf_counter() - started:.0f}s; model saved to {final}")
    print(f"accuracy before: {before:.3f} after: {after:.3f}")


def run_eval(args: argparse.Namespace) -> None:
    from minigrpo.models import load_model_and_tokenizer
    from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset
    from minigrpo.trainer import evaluate_model

    model, tokenizer = load_model_and_tokenizer(args.model)
    config = GRPOConfig(max_prompt_length=256, max_completion_length=128, eval_batch_size=128)
    eval_data = make_arithmetic_dataset(args.eval_size, "test", seed=args.seed)
    accuracy = evaluate_model(model, tokenizer, eval_data, [correctness_reward], config)["eval/accuracy"]
    print(f"accuracy: {accuracy:.3f} ({args.eval_size} held-out problems, greedy) for {args.model}")


def run_pretrain(args: argparse.Namespace) -> None:
    from minigrpo.models import TINY_MODEL_DIR
    from minigrpo.pretrain import pretrain_tiny

    pretrain_tiny(args.output_dir or TINY_MODEL_DIR, target_accuracy=args.target_accuracy, seed=args.seed)


def run_grade(args: argparse.Namespace) -> int:
    from minigrpo.grading import grade_command

    return grade_command(args.path, as_json=args.json, timeout=args.timeout)


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
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

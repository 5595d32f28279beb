"""Write tests/data/checkpoint_v0_1/: a GRPO run of minigrpo 0.1.0 stopped after 2 optimizer steps.

tests/test_checkpoint_compat.py resumes it with the current code, so that a checkpoint written before the
0.2.0 reorganisation (modules moved into minigrpo/run/, course/, measuring/) keeps resuming.

Run it with minigrpo 0.1.0 (commit 5982d8b, the last one before the reorganisation), never with the current
code: the point is a checkpoint that the OLD code wrote. From the repository's root:

    git worktree add ../minigrpo-0.1.0 5982d8b
    rm -rf tests/data/checkpoint_v0_1
    PYTHONPATH=../minigrpo-0.1.0 python tests/data/make_checkpoint_v0_1.py tests/data/checkpoint_v0_1
    git worktree remove ../minigrpo-0.1.0

(Made with transformers 5.24.0 and torch 2.13.0 on a CPU; the weights and optimizer state come out the same
on every run, trainer_state.json's timings and training_args.json's output_dir do not.) It prints
minigrpo.__file__, which must lie in that 0.1.0 checkout, and refuses to run with the
reorganised code. What it writes, about 125 KB:

    checkpoint_v0_1/checkpoint-2/   the checkpoint exactly as 0.1.0 wrote it (save_total_limit=1 rotated
                                    checkpoint-1 away): model.safetensors + config.json (the architecture the
                                    test rebuilds), generation_config.json, tokenizer files, trainer_state.pt,
                                    trainer_state.json, training_args.json

The run's metrics.jsonl and lock file (not part of a checkpoint; a resume rewrites metrics.jsonl from the
checkpoint's history) are removed. Nothing inside checkpoint-2 is edited.

The model is a randomly initialised 1-layer Qwen2 (hidden size 16) over the bundled tiny tokenizer's
vocabulary, so the checkpoint stays small. tests/test_checkpoint_compat.py imports CONFIG and the reward
function from here (a resume refuses a run whose settings differ), so importing this module must stay free
of side effects: the work is in main().
"""

import importlib.util
import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import minigrpo
from minigrpo import GRPOConfig, GRPOTrainer, load_model_and_tokenizer, make_arithmetic_dataset

MODEL = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    bos_token_id=None,
)
CONFIG = dict(
    prompts_per_step=2,
    num_generations=2,
    per_device_train_batch_size=4,
    max_prompt_length=128,
    max_completion_length=4,
    learning_rate=1e-2,
    beta=0.04,
    save_steps=1,
    save_total_limit=1,
    eval_strategy="no",
    seed=0,
)


def token_sum_reward(prompts, completions, completion_ids=None, **columns) -> list[float]:
    """Varies within a group whatever the random model samples, so that every step has a gradient."""
    return [float(sum(ids) % 7) for ids in completion_ids]


def main(out: Path) -> None:
    print(f"minigrpo {minigrpo.__version__} from {minigrpo.__file__}")
    if minigrpo.__version__ != "0.1.0" or importlib.util.find_spec("minigrpo.checkpoints") is None:
        sys.exit("run this with minigrpo 0.1.0 (the layout before minigrpo/run/): see the docstring")
    if out.exists():
        sys.exit(f"{out} exists: remove it first")
    tokenizer = load_model_and_tokenizer("tiny", device="cpu")[1]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        **MODEL,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    dataset = make_arithmetic_dataset(n=8, split="train", seed=1)
    args = GRPOConfig(**CONFIG, max_steps=2, output_dir=str(out))
    trainer = GRPOTrainer(model, [token_sum_reward], args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2
    for name in sorted(p.name for p in out.iterdir()):
        if name != "checkpoint-2":  # metrics.jsonl, .minigrpo.lock: not part of the checkpoint
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for path in sorted((out / "checkpoint-2").iterdir()):
        print(f"{path.stat().st_size:>8}  {path}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} OUT_DIR")
    main(Path(sys.argv[1]))

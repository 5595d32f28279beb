"""Checkpoints: atomic save, load, rotation and RNG state, so that a resumed run continues exactly.

A checkpoint is a folder ``output_dir/checkpoint-{step}/``:

| file                         | holds                                                           |
| ---------------------------- | --------------------------------------------------------------- |
| model.safetensors + config   | the policy (``save_pretrained``), loadable on its own            |
| adapter_model.safetensors    | instead, for a LoRA policy: its adapters (+ adapter_config.json) |
| tokenizer files              | the tokenizer, so the folder is a complete model                 |
| <name>/model.safetensors     | every other trained module (PPO's critic in ``critic/``)         |
| trainer_state.pt             | step, optimizer (AdamW moments), scheduler, prompt sampler, RNG  |
| trainer_state.json           | the metric history, readable without torch                       |

"Exactly" means bit for bit: the same weights after steps 1..4 whether or not
the run stopped after step 2. That needs more than the weights: AdamW's two
moments, the learning-rate schedule's position, where the prompt sampler is in
its epoch, and every random generator (sampling draws from them).

Written atomically: everything goes to a hidden temporary folder that is renamed
at the end, so a run killed mid-save (a Colab disconnect) never leaves a
half-written ``checkpoint-N`` that resume would pick.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from minigrpo.models import is_peft_model

STATE_FILE = "trainer_state.pt"
HISTORY_FILE = "trainer_state.json"
ADAPTER_FILE = "adapter_model.safetensors"  # PEFT's file of a LoRA policy's adapter weights


# --- random generators ----------------------------------------------------------------
def rng_state() -> dict:
    """Python's and torch's generators (and CUDA's when there is a GPU), as set_rng_state takes them."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() returned (CUDA's only when both then and now have a GPU)."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- one module's weights ---------------------------------------------------------------
def save_module(module: torch.nn.Module, folder: Path) -> None:
    """A transformers model through save_pretrained (config included); any other module as model.safetensors."""
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(folder)
        return
    folder.mkdir(parents=True, exist_ok=True)
    save_model(module, str(folder / "model.safetensors"))


def load_module(module: torch.nn.Module, folder: Path) -> None:
    """Load every *.safetensors file of `folder` into `module`; only tied weights may be absent.

    A LoRA policy (a PeftModel) loads its adapters only: the frozen base weights are
    the ones it was built from, never saved, never changed.

    save_pretrained drops lm_head.weight when it is tied to the embeddings
    (Qwen2.5-0.5B ties them), so that one key may be missing; anything else
    missing or unexpected means the checkpoint belongs to another model.
    """
    if is_peft_model(module):
        load_adapters(module, folder)
        return
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(file, device=str(next(module.parameters()).device)))
    missing, unexpected = module.load_state_dict(state, strict=False)
    tied = {name for name in missing if name.endswith("lm_head.weight")}
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"checkpoint in {folder} does not match the model: missing {missing}, unexpected {unexpected}"
        )


def load_adapters(model, folder: Path) -> None:
    """Set a PeftModel's adapter weights from folder/adapter_model.safetensors; every adapter weight must be there."""
    from peft import set_peft_model_state_dict

    file = folder / ADAPTER_FILE
    if not file.exists():
        raise RuntimeError(f"checkpoint in {folder} has no {ADAPTER_FILE}: it was not written by a LoRA run.")
    result = set_peft_model_state_dict(model, load_file(file, device=str(next(model.parameters()).device)))
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    missing = [name for name in result.missing_keys if name in trainable]
    if result.unexpected_keys or missing:
        raise RuntimeError(
            f"adapters in {folder} do not match the model's: missing {missing}, unexpected {result.unexpected_keys}"
        )


# --- finding and rotating checkpoints ------------------------------------------------------
def checkpoint_step(path: Path) -> int:
    """checkpoint-12 -> 12."""
    return int(path.name.rsplit("-", 1)[1])


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint (one with its trainer_state.pt) of the highest step in output_dir, or None."""
    checkpoints = [p for p in Path(output_dir).glob("checkpoint-*") if (p / STATE_FILE).exists()]
    return max(checkpoints, key=checkpoint_step) if checkpoints else None


def rotate_checkpoints(output_dir: str | Path, keep: int) -> None:
    """Delete all but the `keep` newest checkpoint folders (save_total_limit)."""
    checkpoints = sorted(Path(output_dir).glob("checkpoint-*"), key=checkpoint_step)
    for old in checkpoints[: max(0, len(checkpoints) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def remove_checkpoints(output_dir: str | Path) -> int:
    """Delete every checkpoint folder in output_dir; returns how many there were."""
    stale = sorted(Path(output_dir).glob("checkpoint-*"), key=checkpoint_step)
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return len(stale)


# --- save and load -------------------------------------------------------------------------
def save_checkpoint(
    output_dir: str | Path,
    step: int,
    modules: dict[str, torch.nn.Module],
    tokenizer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    sampler_state: dict,
    rng: dict,
    history: list[dict],
) -> Path:
    """Write output_dir/checkpoint-{step} atomically (a temporary folder renamed at the end); returns its path.

    `modules` maps a name to a trained module: "model" (the policy) goes to the
    folder itself, any other name to a subfolder of that name.
    """
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, module in modules.items():
        save_module(module, tmp if name == "model" else tmp / name)
    tokenizer.save_pretrained(tmp)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": sampler_state,
        "rng": rng,
    }
    torch.save(state, tmp / STATE_FILE)
    (tmp / HISTORY_FILE).write_text(json.dumps({"step": step, "history": history}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_checkpoint(
    path: str | Path,
    modules: dict[str, torch.nn.Module],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict:
    """Restore the modules, optimizer and scheduler in place from a checkpoint-N folder.

    Returns what the caller owns: {"step", "sampler" (state dict), "rng"
    (for set_rng_state), "history" (list of metric dicts)}.
    """
    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{path} is not a minigrpo checkpoint (no {STATE_FILE}): pass a checkpoint-N folder.")
    for name, module in modules.items():
        load_module(module, path if name == "model" else path / name)
    state = torch.load(path / STATE_FILE, weights_only=False, map_location="cpu")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    history = json.loads((path / HISTORY_FILE).read_text())["history"]
    return {"step": state["step"], "sampler": state["sampler"], "rng": state["rng"], "history": history}

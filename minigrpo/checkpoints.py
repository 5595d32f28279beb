"""Checkpoints: atomic save, load, rotation and RNG state, so that a resumed run continues exactly.

A checkpoint is a folder ``output_dir/checkpoint-{step}/``:

| file                         | holds                                                           |
| ---------------------------- | --------------------------------------------------------------- |
| model.safetensors + config   | the policy (``save_pretrained``), loadable on its own            |
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
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

STATE_FILE = "trainer_state.pt"
HISTORY_FILE = "trainer_state.json"


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
def save_module(module: torch.nn.Module, folder: Path, state_dict: dict | None = None) -> None:
    """A transformers model through save_pretrained (config included); any other module as model.safetensors.
    state_dict: the weights to write when the module's own are not whole tensors (a sharded policy)."""
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(folder, state_dict=state_dict)
        return
    folder.mkdir(parents=True, exist_ok=True)
    save_model(module, str(folder / "model.safetensors"))


def load_module(module: torch.nn.Module, folder: Path) -> None:
    """Load every *.safetensors file of `folder` into `module`; only tied weights may be absent.

    save_pretrained drops lm_head.weight when it is tied to the embeddings
    (Qwen2.5-0.5B ties them), so that one key may be missing; anything else
    missing or unexpected means the checkpoint belongs to another model.
    """
    state = read_weights(folder, device=str(next(module.parameters()).device))
    missing, unexpected = module.load_state_dict(state, strict=False)
    tied = {name for name in missing if name.endswith("lm_head.weight")}
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"checkpoint in {folder} does not match the model: missing {missing}, unexpected {unexpected}"
        )


def read_weights(folder: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every *.safetensors file of `folder`, as one state dict."""
    state = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(file, device=device))
    return state


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
    full_states: tuple[dict, dict] | None = None,
) -> Path:
    """Write output_dir/checkpoint-{step} atomically (a temporary folder renamed at the end); returns its path.

    `modules` maps a name to a trained module: "model" (the policy) goes to the
    folder itself, any other name to a subfolder of that name.
    full_states: (policy weights, optimizer state) gathered from a sharded (FSDP2)
    policy, written instead of the module's and optimizer's own state dicts.
    """
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, module in modules.items():
        weights = full_states[0] if full_states is not None and name == "model" else None
        save_module(module, tmp if name == "model" else tmp / name, weights)
    tokenizer.save_pretrained(tmp)
    state = {
        "step": step,
        "optimizer": full_states[1] if full_states is not None else optimizer.state_dict(),
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
    load_full_states: Callable[[dict, dict], None] | None = None,
) -> dict:
    """Restore the modules, optimizer and scheduler in place from a checkpoint-N folder.

    load_full_states(weights, optimizer_state): how a sharded (FSDP2) policy takes
    the whole-tensor states of the checkpoint, instead of load_state_dict.

    Returns what the caller owns: {"step", "sampler" (state dict), "rng"
    (for set_rng_state), "history" (list of metric dicts)}.
    """
    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{path} is not a minigrpo checkpoint (no {STATE_FILE}): pass a checkpoint-N folder.")
    state = torch.load(path / STATE_FILE, weights_only=False, map_location="cpu")
    if load_full_states is not None:
        load_full_states(read_weights(path), state["optimizer"])
    else:
        for name, module in modules.items():
            load_module(module, path if name == "model" else path / name)
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    history = json.loads((path / HISTORY_FILE).read_text())["history"]
    return {"step": state["step"], "sampler": state["sampler"], "rng": state["rng"], "history": history}

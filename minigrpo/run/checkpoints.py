"""Checkpoints: atomic save, safe load, fallback, rotation and RNG state, so that a resumed run continues exactly.

A checkpoint is a folder ``output_dir/checkpoint-{step}/``:

| file                         | holds                                                                   |
| ---------------------------- | ----------------------------------------------------------------------- |
| model.safetensors + config   | the policy (``save_pretrained``), loadable on its own                    |
| tokenizer files              | the tokenizer, so the folder is a complete model                         |
| <name>/model.safetensors     | every other trained module (PPO's critic in ``critic/``)                 |
| trainer_state.pt             | tensors and plain numbers only: optimizer (AdamW moments), torch's and   |
|                              | CUDA's RNG states; read with ``torch.load(weights_only=True)``           |
| trainer_state.json           | step, metric history, prompt sampler, Python's RNG state (a list of ints) |
| training_args.json           | the run's config, model, reward functions and training set (fingerprint): |
|                              | a resume compares them                                                   |
| adapter_model.safetensors    | instead, for a LoRA policy: its adapters (+ adapter_config.json)          |

"Exactly" means bit for bit: the same weights after steps 1..4 whether or not
the run stopped after step 2. That needs more than the weights: AdamW's two
moments, the step (the learning rate is a function of it, run.schedule.lr_at),
where the prompt sampler is in its epoch, and every random generator (sampling
draws from them).

Safe to share: nothing in a checkpoint is unpickled into arbitrary objects.
``torch.load(weights_only=False)`` would run any code a crafted file names, so
checkpoints are shared between learners only because every file is tensors
(safetensors, ``weights_only=True``) or JSON.

Robust to faults: everything is written to a hidden temporary folder that is
renamed at the end, so a run killed mid-save (a Colab disconnect) never leaves
a half-written ``checkpoint-N``; any failed write (a full disk, a file-size limit)
removes the temporary folder and names its cause (save_failure); a resume reads
every file of the newest checkpoint before changing anything and falls back to an older one when a file is truncated or
garbage (``find_resumable``); folders not named ``checkpoint-<int>`` are not
checkpoints. The output folder, and a separate logging folder, are locked while a
trainer uses them (``output_dir_lock``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import random
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from minigrpo.config import RESUME_FREE_FIELDS, GRPOConfig
from minigrpo.models import TINY_MODEL_DIR, is_peft_model

try:  # POSIX; elsewhere (Windows) the output folder is simply not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

FORMAT = 3  # trainer_state.json's "format"; 1 (no number) pickled Python objects into trainer_state.pt
READABLE_FORMATS = (2, 3)  # 2 also stored a learning-rate scheduler's state, which is now ignored: lr_at(step)
STATE_FILE = "trainer_state.pt"
HISTORY_FILE = "trainer_state.json"
ARGS_FILE = "training_args.json"
METRICS_FILE = "metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"  # log_completions=True (run.completions_log)
ADAPTER_FILE = "adapter_model.safetensors"  # PEFT's file of a LoRA policy's adapter weights
LOCK_FILE = ".minigrpo.lock"
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


class CheckpointError(RuntimeError):
    """A checkpoint or output folder that cannot be used as asked (broken, unsafe, another run's, in use)."""


class RunMismatchError(CheckpointError):
    """A sound checkpoint of another kind of run (a full run's for a LoRA trainer, another LoRA rank): nothing is
    wrong with it, so a resume does not fall back past it."""


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


def _python_rng_from_json(value: list) -> tuple:
    """random.getstate() is (version, tuple of 625 ints, gauss_next); JSON stores it as nested lists."""
    version, internal, gauss_next = value
    return int(version), tuple(int(x) for x in internal), gauss_next


# --- JSON that stays JSON -------------------------------------------------------------------
def json_safe(value):
    """`value` with every NaN or inf float replaced by None (JSON has no NaN: json.dumps would write a bare NaN
    that other readers reject), recursively through dicts and lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def dumps(value, **kwargs) -> str:
    """json.dumps of json_safe(value); allow_nan=False makes any non-finite number that slipped through an error."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


def append_jsonl(path: Path, rows: list[dict]) -> None:
    """Append rows to path, one JSON object a line (metrics.jsonl, completions.jsonl): a NaN is written as null, so
    the file stays valid JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(dumps(row) + "\n" for row in rows)


def _history_from_json(rows: list[dict]) -> list[dict]:
    """Metric rows as logged: a null (a NaN metric, e.g. the mean of a reward that never applied) is NaN again."""
    return [{key: math.nan if value is None else value for key, value in row.items()} for row in rows]


# --- what defines a run ----------------------------------------------------------------------
def model_id(model: torch.nn.Module) -> str:
    """The model a run started from, as recorded in training_args.json: "tiny", a Hub id or a folder."""
    name = str(getattr(model, "name_or_path", "") or "")
    if name and Path(name).resolve() == TINY_MODEL_DIR.resolve():
        return "tiny"  # the bundled model, wherever the package is installed
    return name


def peft_args(model: torch.nn.Module) -> dict | None:
    """A LoRA policy's adapter settings (PEFT's LoraConfig fields that define the run), or None for a full run."""
    if not is_peft_model(model):
        return None
    lora = model.peft_config[model.active_adapter]
    modules = lora.target_modules
    return {
        "r": lora.r,
        "lora_alpha": lora.lora_alpha,
        "target_modules": sorted(modules) if isinstance(modules, list | set | tuple) else modules,
        "lora_dropout": lora.lora_dropout,
        "use_rslora": getattr(lora, "use_rslora", False),
    }


PEFT_SHAPE_FIELDS = ("r", "target_modules")
"""LoRA settings that decide the adapters' shapes: a checkpoint cannot be resumed with others, even allowed."""


def run_args(
    config: GRPOConfig, model: torch.nn.Module, reward_func_names: list[str], train_dataset: dict | None = None
) -> dict:
    """What training_args.json records: the config (every field), its class, the model, the reward functions,
    the LoRA settings (peft_config; None for a full run) and the training set (run.datasets.dataset_record: its
    rows, columns and fingerprint), which a resume compares."""
    return {
        "config_class": type(config).__name__,
        "config": dataclasses.asdict(config),
        "model": model_id(model),
        "reward_funcs": list(reward_func_names),
        "peft_config": peft_args(model),
        "train_dataset": train_dataset,
    }


def check_same_kind_of_run(path: Path, args: dict, model: torch.nn.Module) -> None:
    """Refuse (RunMismatchError) a checkpoint of a full run for a LoRA trainer or the other way round, or one
    whose adapters have other shapes (another r or target_modules): its weights cannot be loaded, however sound.
    A checkpoint without a record of its peft_config (before 0.3) is told by its adapter file."""
    saved_lora = (path / ADAPTER_FILE).exists()
    if saved_lora != is_peft_model(model):
        kinds = ("a LoRA run (adapters only)", "full fine-tuning")
        saved_kind, current_kind = (kinds[0], kinds[1]) if saved_lora else (kinds[1], kinds[0])
        fix = "pass the same peft_config" if saved_lora else "leave out peft_config"
        raise RunMismatchError(
            f"{path} was written by {saved_kind}, and this trainer does {current_kind}: to resume it, {fix}; "
            "to start the other kind of run, give it another output_dir. The checkpoints are sound: keep them."
        )
    saved, current = args.get("peft_config") if isinstance(args, dict) else None, peft_args(model)
    if saved and current:
        changed = [
            f"peft_config.{k}: {saved.get(k)!r} -> {current[k]!r}"
            for k in PEFT_SHAPE_FIELDS
            if saved.get(k) != current[k]
        ]
        if changed:
            raise RunMismatchError(
                f"{path} holds adapters of other shapes ({'; '.join(changed)}): LoRA's r and target_modules "
                "decide the adapters' shapes, so resume with the checkpoint's values, or start a run with the new "
                "ones in another output_dir."
            )


FIELDS_ADDED = {
    "model_init_kwargs": ("0.3.0", None),  # 0.1 / 0.2 loaded the model with from_pretrained's defaults
    "trust_remote_code": ("0.3.0", False),  # 0.1 / 0.2 never ran a model folder's own code
    "push_to_hub": ("0.3.0", False),  # 0.1 / 0.2 never uploaded
    "resume_from_checkpoint": ("0.3.0", None),  # TRL's field; 0.1 / 0.2 resumed only through train()
    # a sampler that is not the trainer: 0.1 / 0.2 had none, and the correction's off value changes nothing
    "vllm_importance_sampling_correction": ("0.3.0", False),
    "vllm_importance_sampling_mode": ("0.3.0", "sequence_mask"),
    "vllm_importance_sampling_clip_max": ("0.3.0", 3.0),
    "vllm_importance_sampling_clip_min": ("0.3.0", None),
    "vllm_importance_sampling_cap": ("0.3.0", None),
    # tools: 0.1 / 0.2 had none, and without tools neither field changes anything
    "max_tool_calling_iterations": ("0.3.0", None),
    "tool_timeout": ("0.3.0", 10.0),
}
"""Config fields added since checkpoints became readable (format 2, minigrpo 0.1.0): name -> (the release that added
it, the value every run before it behaved as). A checkpoint that lacks one is compared as if it held that value;
a field it lacks that is not here cannot be compared, and a resume names it (changed_run_fields). Add a line here
whenever GRPOConfig (or PPOConfig) gains a field."""


def changed_run_fields(saved: dict, current: dict) -> list[str]:
    """The training-defining differences between two run_args(), as "name: saved -> current" lines.

    Fields in config.RESUME_FREE_FIELDS (run length, logging, memory knobs) may change on a resume: a longer (or
    shorter) max_steps continues the run under every schedule; a linear or cosine decay is then recomputed for the new
    max_steps, as transformers' Trainer recomputes it (run.schedule.schedule_change_note). A field the checkpoint
    lacks (it was written by an older minigrpo) counts as the value its release used (FIELDS_ADDED), and is named
    as a change when that is not known; so is a field this minigrpo does not know (a newer one wrote the checkpoint).
    """
    changes = [
        f"{key}: {saved[key]!r} -> {current[key]!r}"
        for key in ("config_class", "model", "reward_funcs")
        if key in saved and saved[key] != current[key]
    ]
    old_peft, new_peft = saved.get("peft_config"), current.get("peft_config")
    if old_peft and new_peft:  # whether LoRA is on at all, r and target_modules: check_same_kind_of_run
        changes += [
            f"peft_config.{name}: {old_peft[name]!r} -> {new_peft[name]!r}"
            for name in sorted(old_peft.keys() & new_peft.keys())
            if old_peft[name] != new_peft[name]
        ]
    elif new_peft and "peft_config" not in saved:  # a LoRA run of 0.1 / 0.2, which did not record its settings
        changes.append(f"peft_config: not recorded (minigrpo before 0.3.0) -> {new_peft!r}")
    old, new = saved.get("config", {}), current["config"]
    free = set(RESUME_FREE_FIELDS)
    for name in sorted(old.keys() - new.keys() - free):
        changes.append(f"{name}: {old[name]!r} -> a field this minigrpo does not know (a newer one wrote it)")
    for name in sorted(new.keys() - free):
        if name in old:
            before = old[name]
        elif name in FIELDS_ADDED:
            before = FIELDS_ADDED[name][1]
        else:
            changes.append(f"{name}: not recorded (the checkpoint predates it: its value is unknown) -> {new[name]!r}")
            continue
        if json_safe(before) != json_safe(new[name]):
            added = f" (before {FIELDS_ADDED[name][0]}, which added it)" if name not in old else ""
            changes.append(f"{name}: {before!r}{added} -> {new[name]!r}")
    return changes


def changed_train_dataset(saved: dict, current: dict) -> str | None:
    """How the training set of run_args() `current` differs from the checkpoint's (`saved`), or None when it is
    the same one or the checkpoint predates the record (minigrpo before 0.3.0: nothing to compare)."""
    old, new = saved.get("train_dataset"), current.get("train_dataset")
    if not old or not new or old.get("fingerprint") == new.get("fingerprint"):
        return None
    return f"the checkpoint's run trained on {describe_dataset(old)}; this trainer has {describe_dataset(new)}"


def describe_dataset(record: dict) -> str:
    """One dataset_record() in words: 16 rows (fingerprint 3f2a9c1b0d4e, first prompt 'What is 3 + 4?')."""
    return (
        f"{record.get('rows')} rows (fingerprint {str(record.get('fingerprint'))[:12]}, first prompt "
        f"{record.get('first_prompt')!r})"
    )


# --- one module's weights ---------------------------------------------------------------
def save_module(module: torch.nn.Module, folder: Path, state_dict: dict | None = None) -> None:
    """A transformers model through save_pretrained (config included); any other module as model.safetensors.
    state_dict: the weights to write when the module's own are not whole tensors (a sharded FSDP2 policy)."""
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(folder, state_dict=state_dict)
        return
    folder.mkdir(parents=True, exist_ok=True)
    save_model(module, str(folder / "model.safetensors"))


def read_module_state(module: torch.nn.Module, folder: Path) -> dict[str, torch.Tensor]:
    """Every *.safetensors file of `folder`, checked against `module` (names and shapes) but not loaded into it.

    A LoRA policy (a PeftModel) loads its adapters only: the frozen base weights are
    the ones it was built from, never saved, never changed.

    save_pretrained drops lm_head.weight when it is tied to the embeddings
    (Qwen2.5-0.5B ties them), so that one key may be missing; anything else
    missing, unexpected or of another shape means the checkpoint belongs to
    another model. Raises CheckpointError for a missing, truncated or garbage file.
    """
    if is_peft_model(module):
        return read_adapter_state(module, folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors file")
    state = {}
    for file in files:
        try:
            state.update(load_file(file, device=str(next(module.parameters()).device)))
        except Exception as error:  # safetensors raises its own error types for a short or garbled file
            raise CheckpointError(f"{file} is truncated or corrupt ({_one_line(error)})") from error
    expected = module.state_dict()
    missing = {name for name in expected.keys() - state.keys() if not name.endswith("lm_head.weight")}
    unexpected = state.keys() - expected.keys()
    reshaped = [name for name in state.keys() & expected.keys() if state[name].shape != expected[name].shape]
    if missing or unexpected or reshaped:
        raise RuntimeError(
            f"checkpoint in {folder} does not match the model: missing {sorted(missing)}, unexpected "
            f"{sorted(unexpected)}, other shapes {sorted(reshaped)}"
        )
    return state


def load_module(module: torch.nn.Module, folder: Path) -> None:
    """Load the weights in `folder` into `module` (see read_module_state for what is checked)."""
    set_module_state(module, read_module_state(module, folder))


def set_module_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a state read by read_module_state: a LoRA policy's adapters, or every weight of a plain module."""
    if is_peft_model(module):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(module, state)
    else:
        module.load_state_dict(state, strict=False)


def _check_finite_weights(modules: dict[str, torch.nn.Module]) -> None:
    """A checkpoint never holds NaN or inf weights: resuming from one would only repeat the failure."""
    for name, module in modules.items():
        for param_name, param in module.named_parameters():
            if not torch.isfinite(param).all():
                raise CheckpointError(
                    f"{name}.{param_name} holds NaN or inf: the weights have diverged and are not saved. Resume "
                    "from an earlier checkpoint with a lower learning_rate."
                )


def read_adapter_state(model, folder: Path) -> dict[str, torch.Tensor]:
    """A PeftModel's adapter weights from folder/adapter_model.safetensors, checked (every adapter weight there,
    nothing else) but not loaded. Raises CheckpointError for a missing, truncated or garbage file."""
    from peft import get_peft_model_state_dict

    file = folder / ADAPTER_FILE
    if not file.exists():
        raise CheckpointError(f"{folder} has no {ADAPTER_FILE}: it was not written by a LoRA run.")
    try:
        state = load_file(file, device=str(next(model.parameters()).device))
    except Exception as error:  # safetensors raises its own error types for a short or garbled file
        raise CheckpointError(f"{file} is truncated or corrupt ({_one_line(error)})") from error
    expected = get_peft_model_state_dict(model)
    missing, unexpected = expected.keys() - state.keys(), state.keys() - expected.keys()
    if missing or unexpected:
        raise RuntimeError(
            f"adapters in {folder} do not match the model's: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    return state


# --- finding and rotating checkpoints ------------------------------------------------------
def checkpoint_step(path: Path) -> int:
    """checkpoint-12 -> 12."""
    return int(_CHECKPOINT_NAME.fullmatch(path.name).group(1))


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The folders named checkpoint-<int> in output_dir, oldest step first (checkpoint-backup is not one)."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and _CHECKPOINT_NAME.fullmatch(p.name)]
    return sorted(folders, key=checkpoint_step)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint of the highest step that has its trainer_state.pt, or None. (It may still be broken:
    find_resumable reads the files.)"""
    complete = [p for p in checkpoint_folders(output_dir) if (p / STATE_FILE).exists()]
    return complete[-1] if complete else None


def rotate_checkpoints(output_dir: str | Path, keep: int) -> None:
    """Delete all but the `keep` newest checkpoint folders (save_total_limit, at least 1)."""
    if keep < 1:
        raise ValueError(f"keep={keep}: keep at least the checkpoint just written.")
    for old in checkpoint_folders(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def remove_checkpoints(output_dir: str | Path) -> int:
    """Delete every checkpoint folder in output_dir; returns how many there were."""
    stale = checkpoint_folders(output_dir)
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return len(stale)


# --- save -------------------------------------------------------------------------------------
def write_checkpoint(
    output_dir: str | Path,
    step: int,
    modules: dict[str, torch.nn.Module],
    tokenizer,
    optimizer: torch.optim.Optimizer,
    sampler_state: dict,
    rng: dict,
    history: list[dict],
    args: dict | None = None,
    full_states: tuple[dict, dict] | None = None,
) -> Path:
    """Write output_dir/checkpoint-{step} atomically (a temporary folder renamed at the end); returns its path.

    `modules` maps a name to a trained module: "model" (the policy) goes to the
    folder itself, any other name to a subfolder of that name. `args`: run_args()
    (training_args.json). Non-finite weights are refused (CheckpointError). Any
    failure removes the temporary folder; a failed write (a full disk, a file-size
    limit, no permission) raises an OSError that names the checkpoint, the cause
    and what to do, in one line (save_failure), whatever the writer raised: torch
    and safetensors raise RuntimeError and their own error types, not OSError.
    """
    _check_finite_weights(modules)
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, module in modules.items():
            weights = full_states[0] if full_states is not None and name == "model" else None
            save_module(module, tmp if name == "model" else tmp / name, weights)
        tokenizer.save_pretrained(tmp)
        tensors = {
            "optimizer": full_states[1] if full_states is not None else optimizer.state_dict(),
            "rng_torch": rng["torch"],
            "rng_cuda": list(rng.get("cuda", [])),
        }
        with open(tmp / STATE_FILE, "wb") as file:  # a Python file: a failed write keeps its OSError (errno)
            torch.save(tensors, file)
        plain = {"format": FORMAT, "step": step, "sampler": sampler_state, "rng_python": rng["python"]}
        (tmp / HISTORY_FILE).write_text(dumps({**plain, "history": history}, indent=1))
        (tmp / ARGS_FILE).write_text(dumps(args or {}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException as error:  # a Ctrl-C too: never leave a half-written folder to fill the disk
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(error, Exception):
            raise
        raise save_failure(error, f"checkpoint-{step} in {output_dir}") from error
    return final


SAVE_FIXES = {  # errno -> what to do, for save_failure
    errno.ENOSPC: "free some space (fewer checkpoints: save_total_limit) or choose an output_dir on a larger disk",
    getattr(errno, "EDQUOT", errno.ENOSPC): "free some of your disk quota (fewer checkpoints: save_total_limit)",
    errno.EFBIG: "a file-size limit (ulimit -f) or the file system's largest file (FAT32: 4 GiB) is smaller than "
    "the checkpoint: raise the limit or choose an output_dir on another file system",
    errno.EACCES: "make output_dir writable or choose another one",
    errno.EPERM: "make output_dir writable or choose another one",
    errno.EROFS: "the file system is read-only: choose an output_dir on a writable one",
}
# safetensors' Rust error, as it prints since 0.5 ("os error 27") and before ("Os { code: 27, ..."), and Python's
_OS_ERROR_IN_TEXT = re.compile(r"os error (\d+)|Os \{ code: (\d+)|\[Errno (\d+)\]")


def save_failure(error: BaseException, what: str) -> OSError:
    """The one-line OSError for a failed write of `what`: the cause by name (os.strerror of the errno found in the
    error, its __cause__ / __context__ chain or its text) and what to do. torch.save reports a failed write as
    RuntimeError("[enforce fail at inline_container.cc...]") with the OSError as its context."""
    code = write_errno(error)
    cause = os.strerror(code) if code is not None else _one_line(error)
    fix = SAVE_FIXES.get(code, "check that output_dir is writable and has space")
    return OSError(
        code,
        f"could not write {what}: {cause}; the temporary folder was removed and earlier checkpoints are kept. "
        f"{fix[0].upper()}{fix[1:]}, then resume",
    )


def write_errno(error: BaseException) -> int | None:
    """The errno behind a failed write: of the first OSError in the exception's chain, else one written in its
    text (safetensors: "... (os error 27)", or "Os { code: 27, ..." before 0.5), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error.errno
        match = _OS_ERROR_IN_TEXT.search(str(error))
        if match:
            return int(next(group for group in match.groups() if group))
        error = error.__cause__ or error.__context__
    return None


# --- read, check, then load -------------------------------------------------------------------
def read_checkpoint(
    path: str | Path,
    modules: dict[str, torch.nn.Module],
    optimizer: torch.optim.Optimizer | None = None,
) -> dict:
    """Every file of a checkpoint-N folder, read and checked whole, without changing anything.

    Returns {"step", "weights" ({module name: state dict}), "optimizer", "sampler", "rng" (for
    set_rng_state), "history", "args" (run_args() of the run that wrote it)}. Raises CheckpointError naming
    the file and what is wrong: missing, truncated, garbage, written by an older or newer minigrpo, holding
    objects that would need unpickling (a crafted file: it is refused, never executed), or entries that could
    not be applied (check_state: RNG states, step and sampler position, and, when given, the optimizer's
    state against `optimizer`). A checkpoint of another kind of run (LoRA
    versus full, another LoRA rank) raises RunMismatchError.
    """
    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise CheckpointError(f"{path} is not a minigrpo checkpoint (no {STATE_FILE}): pass a checkpoint-N folder.")
    plain, args = _read_json(path / HISTORY_FILE), _read_json(path / ARGS_FILE, missing_ok=True)
    saved_format = plain.get("format") if isinstance(plain, dict) else None
    if isinstance(saved_format, int) and saved_format > max(READABLE_FORMATS):
        raise CheckpointError(
            f"{path} was written by a newer minigrpo (checkpoint format {saved_format}; this one reads format "
            f"{FORMAT}): upgrade minigrpo (pip install -U minigrpo) to resume it."
        )
    if not isinstance(plain, dict) or saved_format not in READABLE_FORMATS or args is None:
        raise CheckpointError(
            f"{path} was written by an older minigrpo (checkpoint format 1, no {ARGS_FILE}) and cannot be resumed "
            f"by this one. Start a new run from its weights instead: GRPOTrainer(model='{path}', ...) with "
            "another output_dir (the optimizer starts afresh)."
        )
    try:
        tensors = torch.load(path / STATE_FILE, weights_only=True, map_location="cpu")
    except Exception as error:  # UnpicklingError for a crafted file, RuntimeError for a truncated zip
        raise CheckpointError(
            f"{path / STATE_FILE} cannot be read safely ({_one_line(error)}): it is truncated, corrupt, or holds "
            "objects other than tensors and numbers (a crafted file is refused, never run)"
        ) from error
    try:
        rng = {"python": _python_rng_from_json(plain["rng_python"]), "torch": tensors["rng_torch"]}
        if tensors["rng_cuda"]:
            rng["cuda"] = tensors["rng_cuda"]
        state = {"step": int(plain["step"]), "sampler": dict(plain["sampler"]), "rng": rng}
        state.update(optimizer=tensors["optimizer"], args=args)
        state["history"] = _history_from_json(plain["history"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(f"{path} lacks or garbles an entry of its state ({_one_line(error)})") from error
    check_same_kind_of_run(path, args, modules["model"])
    problem = check_state(state, optimizer)
    if problem:
        raise CheckpointError(f"{path} holds a state that cannot be applied: {problem}")
    state["weights"] = {
        name: read_module_state(module, path if name == "model" else path / name) for name, module in modules.items()
    }
    return state


def check_state(state: dict, optimizer=None) -> str | None:
    """What in read_checkpoint's `state` could not be applied, or None: each part is checked before any is
    applied, so a bad checkpoint changes nothing and the resume falls back to the previous one.

    step and the sampler's epoch and position: integers >= 0; the history: metric dicts; training_args.json: a
    dict; Python's and torch's RNG states: accepted by a scratch generator. With `optimizer`: as many parameter
    groups and parameters as it has, each moment of its parameter's shape."""
    step, sampler = state["step"], state["sampler"]
    if step < 0:
        return f"step {step} is negative"
    for key in sampler.keys() & {"epoch", "position"}:
        value = sampler[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"the prompt sampler's {key} is {value!r}, not an integer >= 0"
    if not isinstance(state["args"], dict) or not isinstance(state["args"].get("config", {}), dict):
        return f"{ARGS_FILE} is not a dict of the run's settings"
    if not all(isinstance(row, dict) for row in state["history"]):
        return "the metric history is not a list of dicts"
    try:
        random.Random().setstate(state["rng"]["python"])
        torch.Generator().set_state(state["rng"]["torch"])
    except (TypeError, ValueError, RuntimeError) as error:
        return f"a random generator's state is malformed ({_one_line(error)})"
    if optimizer is not None:
        problem = _optimizer_state_problem(state["optimizer"], optimizer)
        if problem:
            return f"the optimizer state {problem}"
    return None


def _optimizer_state_problem(saved, optimizer: torch.optim.Optimizer) -> str | None:
    """What makes `saved` (an optimizer's state_dict) unfit for `optimizer`, or None."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return "is not an optimizer state_dict"
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return f"has {len(groups) if isinstance(groups, list) else 'no'} parameter groups, the optimizer has " + str(
            len(optimizer.param_groups)
        )
    params = {}
    for saved_group, group in zip(groups, optimizer.param_groups, strict=True):
        ids = saved_group.get("params") if isinstance(saved_group, dict) else None
        if not isinstance(ids, list) or len(ids) != len(group["params"]):
            return "has another number of parameters than the optimizer"
        params.update(zip(ids, group["params"], strict=True))
    for key, moments in saved["state"].items():
        if key not in params or not isinstance(moments, dict):
            return f"has an entry {key!r} for no parameter"
        for name, value in moments.items():
            if name != "step" and isinstance(value, torch.Tensor) and value.shape != params[key].shape:
                return f"holds {name} of shape {tuple(value.shape)} for a parameter of {tuple(params[key].shape)}"
    return None


def _read_json(file: Path, missing_ok: bool = False):
    if missing_ok and not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file} is missing, truncated or not JSON ({_one_line(error)})") from error


def apply_checkpoint(
    state: dict,
    modules: dict[str, torch.nn.Module],
    optimizer: torch.optim.Optimizer,
    load_full_states: Callable[[dict, dict], None] | None = None,
) -> None:
    """Load what read_checkpoint returned into the modules and the optimizer, in place.

    load_full_states(weights, optimizer_state): how a sharded (FSDP2) policy takes the checkpoint's
    whole-tensor states, instead of load_state_dict."""
    if load_full_states is not None:
        load_full_states(state["weights"]["model"], state["optimizer"])
    else:
        optimizer.load_state_dict(state["optimizer"])  # torch checks the groups' sizes before changing anything
    for name, module in modules.items():
        if load_full_states is None or name != "model":
            set_module_state(module, state["weights"][name])


def load_checkpoint(
    path: str | Path,
    modules: dict[str, torch.nn.Module],
    optimizer: torch.optim.Optimizer,
    load_full_states: Callable[[dict, dict], None] | None = None,
) -> dict:
    """Restore the modules and the optimizer in place from a checkpoint-N folder.

    Returns what the caller owns: {"step", "sampler" (state dict), "rng"
    (for set_rng_state), "history" (list of metric dicts), "args"}. Every file is
    read and checked first (read_checkpoint), so a broken checkpoint changes nothing.
    """
    state = read_checkpoint(path, modules, optimizer)
    apply_checkpoint(state, modules, optimizer, load_full_states)
    return {key: state[key] for key in ("step", "sampler", "rng", "history", "args")}


def find_resumable(
    output_dir: str | Path, modules: dict[str, torch.nn.Module], optimizer=None
) -> tuple[Path, dict, list[str]] | None:
    """The newest checkpoint in output_dir that reads completely: (path, read_checkpoint's state, warnings).

    Each newer checkpoint that is broken gives one warning that names it and why. None when output_dir holds
    no checkpoint-<int> folder; CheckpointError listing each one when none of them reads. A RunMismatchError
    (good checkpoints of another kind of run) is raised at once: no older checkpoint would fit better.
    """
    candidates = checkpoint_folders(output_dir)
    if not candidates:
        return None
    problems = []
    for path in reversed(candidates):
        try:
            return path, read_checkpoint(path, modules, optimizer), problems
        except RunMismatchError:
            raise
        except CheckpointError as error:
            problems.append(f"skipped {path.name}: {error}")
    raise CheckpointError(
        f"no checkpoint in {output_dir} can be resumed ({'; '.join(problems)}). Start a fresh run in another "
        "output_dir, or with overwrite_output_dir=True to replace them."
    )


# --- the output folder: one run at a time -----------------------------------------------------
RUN_OUTPUTS = (
    METRICS_FILE,
    COMPLETIONS_FILE,
    "final",  # python -m minigrpo train's final model
    "trainer_state.json",  # save_state() (a checkpoint's own trainer_state.json is inside checkpoint-N)
    "all_results.json",  # save_metrics()
    "train_results.json",
    "eval_results.json",
    "config.json",  # save_model() with no path: the model (or a LoRA run's adapters) and tokenizer, as in TRL
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    ADAPTER_FILE,
    "adapter_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
"""What a run writes into its output_dir besides its checkpoint folders: a fresh run that replaces an earlier one
removes every one of them (and the checkpoints, sharded model files and temporary folders), so that nothing of
the old run (its final/ model, say) is left beside the new run's files."""
_RUN_OUTPUT_PATTERNS = (re.compile(r"\.checkpoint-\d+\.tmp"), re.compile(r"model-\d+-of-\d+\.safetensors"))


def earlier_run(output_dir: str | Path) -> list[str]:
    """What an earlier run left in output_dir (its checkpoint folders, then metrics.jsonl, final/ and the other
    RUN_OUTPUTS it holds, and half-written checkpoint folders); [] when nothing."""
    output_dir = Path(output_dir)
    found = [p.name for p in checkpoint_folders(output_dir)]
    found += [name for name in RUN_OUTPUTS if (output_dir / name).exists()]
    if output_dir.is_dir():
        found += sorted(p.name for p in output_dir.iterdir() if any(r.fullmatch(p.name) for r in _RUN_OUTPUT_PATTERNS))
    return found


def claim_output_dir(output_dir: str | Path, replace: bool, resuming_from: Path | None = None) -> None:
    """Make output_dir ready for a fresh run. An earlier run's checkpoints and metrics would be resumed from
    (resume picks the highest step) or would rotate this run's newer checkpoints away, and its final model would
    be taken for this run's, so they must go; they are never deleted silently: `replace` deletes every one of
    them (earlier_run) before the new run writes anything (and says so), otherwise FileExistsError names the
    options. resuming_from: another run's checkpoint that this run continues from (the error then says so).
    """
    earlier = earlier_run(output_dir)
    if earlier and not replace:
        shown = ", ".join(earlier if len(earlier) <= 4 else [*earlier[:3], "..."])
        if resuming_from is not None:
            raise FileExistsError(
                f"resuming from {resuming_from} (another run's checkpoint) would write into output_dir "
                f"{output_dir}, which holds an earlier run ({shown}) that would be overwritten: set output_dir to "
                f"{resuming_from.parent} to continue that run in place, give an empty output_dir to branch off it, "
                "or replace the earlier run with overwrite_output_dir=True (--overwrite-output-dir)."
            )
        raise FileExistsError(
            f"{output_dir} holds an earlier run ({shown}): resume it (train(resume_from_checkpoint=True), "
            "--resume), give this run another output_dir, or replace it with overwrite_output_dir=True "
            "(--overwrite-output-dir)."
        )
    for name in earlier:
        path = Path(output_dir) / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if earlier:
        print(f"new run in {output_dir}: removed the earlier run's {', '.join(earlier)}")


def claim_logging_dir(logging_dir: str | Path, replace: bool) -> None:
    """Make a separate logging_dir ready for a fresh run's metrics.jsonl. Another run's output folder (it holds
    checkpoint folders, whose metrics that file is) is always refused: overwrite_output_dir names this run's
    output_dir, not that one. An earlier metrics.jsonl alone is refused unless `replace` (then deleted, and said)."""
    logging_dir = Path(logging_dir)
    if checkpoint_folders(logging_dir):
        raise FileExistsError(
            f"logging_dir {logging_dir} is another run's output folder (it holds "
            f"{checkpoint_folders(logging_dir)[-1].name}): its {METRICS_FILE} belongs to those checkpoints and is "
            "not replaced. Give this run its own logging_dir, or none (metrics then go to output_dir)."
        )
    if (logging_dir / METRICS_FILE).exists():
        if not replace:
            raise FileExistsError(
                f"logging_dir {logging_dir} holds the {METRICS_FILE} of an earlier run: give this run another "
                "logging_dir, or replace that file with overwrite_output_dir=True (--overwrite-output-dir)."
            )
        (logging_dir / METRICS_FILE).unlink()
        print(f"new run logging to {logging_dir}: removed the {METRICS_FILE} of an earlier run")


@contextlib.contextmanager
def output_dir_lock(output_dir: str | Path, field: str = "output_dir") -> Iterator[None]:
    """Hold an exclusive lock on output_dir (its .minigrpo.lock, which records the holder's PID) while the
    block runs; a second trainer, in this process or another, gets a CheckpointError instead of interleaving
    metrics and overwriting checkpoints. field: the setting that named the folder, for the error (a separate
    logging_dir is locked the same way: two runs logging there would write one metrics.jsonl between them).

    fcntl.flock belongs to the open file, so the kernel releases it when the process dies: a lock left by a
    killed run (kill -9, a Colab disconnect) is simply taken over. Where a file system has no flock (some
    network or FUSE mounts) or on Windows, the folder is used unlocked.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    handle = open(output_dir / LOCK_FILE, "a+")
    try:
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise CheckpointError(
                    f"{field} {output_dir} is in use by another trainer (process {holder}): wait for it to finish, "
                    f"or give this run another {field}."
                ) from None
            except OSError:
                pass  # no flock on this file system: run unlocked rather than not at all
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the flock


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__

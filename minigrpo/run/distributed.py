"""Data-parallel GRPO with torch.distributed: the same trainer on K processes (torchrun).

    torchrun --nproc-per-node K -m minigrpo train ...       # K GPUs (nccl) or K CPU processes (gloo)

torchrun starts K copies of the program and tells each its RANK (0 .. K-1) and
the WORLD_SIZE K. Every rank holds a whole policy. What data parallelism adds
to one step, and where each piece lives:

| what                       | how                                                                    |
| -------------------------- | ---------------------------------------------------------------------- |
| the B prompts of a step    | drawn from the seed by every rank alike; rank r keeps groups r*B/K ... |
| sampling                   | each group from its own generator, seeded by (seed, step, group index) |
| advantages                 | per group, on the rank that holds it: group statistics never cross     |
| gradients                  | DistributedDataParallel averages them over the ranks after backward    |
| dapo's token count         | all-reduced: the normaliser is the whole step's, on every rank         |
| metrics, evaluation        | reduced / gathered over the ranks; rank 0 writes metrics and checkpoints |

Why these are enough: each loss below is a mean over the step, so splitting
the step into K equal shards and averaging their gradients (what DDP does)
gives the gradient of the whole step. "grpo" is a mean over the N
completions: rank r's mean over its N/K, averaged over K ranks, is the mean
over N. "dr_grpo" divides by n * max_completion_length with n the rows in the
micro-batch: the same argument. "dapo" divides a *sum* by the step's token
count, a number no rank knows alone: each rank divides by (all tokens) / K,
and DDP's division by K restores sum / (all tokens). "bnpo" is a token mean
per micro-batch, so it matches a single process with the same micro-batches
(per_device_train_batch_size <= N/K).

Sampling: one shared random stream would give different completions with
K = 1 and K = 2 (each rank's stream would cover different rows). So each
group is sampled from its own generator, seeded from (seed, step, the group's
index in the step), in one process as under torchrun: group 5 gets the same
completions whichever rank holds it, and `python -m minigrpo train` and K
processes give the same weights (up to float rounding).

Failures: a rank that raises while collecting its rollout tells the others
(an all-gather of the error each step), and every rank stops with that error
instead of waiting forever in the next collective. A crash inside the update
ends the rank's process; torchrun then stops the others.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from minigrpo.logprobs import completion_logps
from minigrpo.rollout import Rollout
from minigrpo.trl_compat import world_size  # K: one definition, shared with the config's batch rule


class RankFailedError(RuntimeError):
    """Another rank raised: this rank stops with that rank's error message."""


# --- the process group ---------------------------------------------------------------------
def is_distributed() -> bool:
    """True inside a torch.distributed process group (under torchrun, after init_from_environment)."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's index in 0 .. K-1 (0 outside torch.distributed)."""
    return dist.get_rank() if is_distributed() else 0


def is_main_process() -> bool:
    """Rank 0: the one that prints, writes metrics.jsonl and writes checkpoints."""
    return rank() == 0


def launched_by_torchrun() -> bool:
    """torchrun (and any launcher that follows its conventions) sets RANK, WORLD_SIZE and MASTER_ADDR."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def one_process_of_several() -> str | None:
    """What to say when `accelerate launch --num_processes K` (K > 1) started this script as ONE process: without
    --multi_gpu, accelerate's plain launcher expects MPI for several CPU processes, and on a machine without GPUs it
    starts a single process (it sets MASTER_ADDR, but no RANK). None otherwise."""
    if "ACCELERATE_USE_CPU" not in os.environ or "MASTER_ADDR" not in os.environ or "RANK" in os.environ:
        return None
    return (
        "accelerate launch started this script as one process, not several: on a machine without GPUs pass "
        "--multi_gpu (accelerate launch --multi_gpu --num_processes K script.py hands the processes to torchrun's "
        "launcher, which works on the CPU with gloo), or run torchrun --nproc-per-node K script.py. This run trains "
        "in one process (the same updates, one process doing all the work)."
    )


def init_from_environment(use_cpu: bool = False) -> bool:
    """Join the process group torchrun describes in the environment: nccl on CUDA, gloo on the CPU.

    Does nothing outside torchrun or when a group already exists (a user's
    script may have made its own). On CUDA, rank r of a node uses GPU
    LOCAL_RANK, so that "cuda" means that GPU from here on. The group we make
    is destroyed at exit (teardown). Returns whether a group exists. use_cpu: gloo even where there are GPUs.
    """
    note = None if launched_by_torchrun() else one_process_of_several()
    if note:
        warnings.warn(note, stacklevel=3)
    if is_distributed() or not launched_by_torchrun():
        return is_distributed()
    if torch.cuda.is_available() and not use_cpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    atexit.register(teardown)
    return True


def teardown() -> None:
    """Destroy the process group (safe to call twice, or outside torch.distributed)."""
    if is_distributed():
        dist.destroy_process_group()


def barrier() -> None:
    """Wait until every rank is here (no-op in one process)."""
    if is_distributed():
        dist.barrier()


def local_device(model: torch.nn.Module, use_cpu: bool = False) -> torch.nn.Module:
    """The model on this rank's GPU: a model loaded to "cuda" before the group existed sits on GPU 0 everywhere.
    use_cpu: on the CPU, wherever it was."""
    if use_cpu:
        return model.to("cpu")
    if is_distributed() and torch.cuda.is_available():
        return model.to(torch.device("cuda", torch.cuda.current_device()))
    return model


# --- the step's prompts: whole groups per rank --------------------------------------------------
def check_config(config) -> None:
    """Fail at once when the step's B prompts or the micro-batches cannot be split over the K ranks."""
    K, B = world_size(), config.prompts_per_step
    if B % K != 0:
        raise ValueError(
            f"prompts_per_step={B} cannot be split into whole groups over {K} processes: each rank takes B/K "
            f"prompts with their G completions. Choose prompts_per_step divisible by {K} (e.g. {K * max(1, B // K)})."
        )
    rows, micro_batch = config.num_completions // K, config.per_device_train_batch_size
    if micro_batch < rows and rows % micro_batch != 0:
        raise ValueError(
            f"each of the {K} processes holds N/K = {rows} completions, which per_device_train_batch_size="
            f"{micro_batch} does not divide: choose a divisor of {rows}."
        )


PER_RANK_FIELDS = ("model_init_kwargs",)
"""Config fields that may differ between ranks: a device_map that puts each rank's model on its own GPU."""


def check_same_config(config) -> None:
    """Fail on every rank, at once and with the same message, when the ranks were started with different configs
    (another max_steps would end in gloo's "Connection closed by peer" when one rank stops early; another learning
    rate would train diverging replicas while rank 0's weights are saved). One all-gather of a hash of the config;
    only when the hashes differ, a second one of the configs, to name the fields."""
    if not is_distributed():
        return
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in PER_RANK_FIELDS}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=repr).encode()).hexdigest()
    digests: list[str | None] = [None] * world_size()
    dist.all_gather_object(digests, digest)
    if len(set(digests)) == 1:
        return
    configs: list[dict | None] = [None] * world_size()
    dist.all_gather_object(configs, fields)
    differing = sorted(name for name in fields if any(other[name] != fields[name] for other in configs))
    details = "; ".join(
        f"{name}: " + ", ".join(f"rank {r} {other[name]!r}" for r, other in enumerate(configs)) for name in differing
    )
    raise ValueError(
        f"the {world_size()} processes were started with different settings ({details}): every rank must run the "
        "same config, or their updates diverge. Start torchrun again with one set of flags and the same script."
    )


def local_groups(prompt_indices: list[int], seed: int, step: int, first_group: int = 0) -> tuple[list[int], list[int]]:
    """This rank's share of B prompts, and the sampling seed of each of its groups.

    prompt_indices: the B dataset indices, the same on every rank (drawn from
    the seed). Rank r keeps the contiguous slice r*B/K .. (r+1)*B/K, so group b
    of the step is first_group + r*B/K + local b (first_group: the groups the
    step sampled before, in DAPO's refill rounds). In one process (K = 1): all
    of them, with the same seeds.
    """
    per_rank = len(prompt_indices) // world_size()
    first = rank() * per_rank
    groups = range(first_group + first, first_group + first + per_rank)
    return prompt_indices[first : first + per_rank], group_seeds(seed, step, groups)


def group_seeds(seed: int, step: int, groups) -> list[int]:
    """One 63-bit seed per global group index, a hash of (seed, step, group): the same whatever K is."""
    return [
        int.from_bytes(hashlib.sha256(f"{seed}/{step}/{group}".encode()).digest()[:8], "little") >> 1
        for group in groups
    ]


# --- numbers that span the whole step -----------------------------------------------------------
def global_sum(values: torch.Tensor) -> int:
    """The sum of `values` over every process (every rank must call it); in one process, its own sum."""
    total = values.sum().to(torch.float64)
    if is_distributed():
        dist.all_reduce(total)
    return int(total.item())


def step_token_count(loss_mask: torch.Tensor) -> float:
    """dapo's normaliser as each rank must use it: (tokens in the whole step) / K.

    loss_mask: (N/K, T) this rank's mask. DDP then averages the K gradients,
    dividing once more by K, so every rank's sum over its tokens ends up
    divided by the step's token count, as in one process. In one process:
    the mask's sum.
    """
    count = loss_mask.sum().to(torch.float64)
    if is_distributed():
        dist.all_reduce(count)
        count = count / world_size()
    return float(count)


def _reduction(key: str) -> Callable[[list[float]], float]:
    """How a metric combines over ranks: min of minima, max of maxima and of times (the slowest rank sets the
    pace), the mean of everything else (each rank holds the same number of groups and completions)."""
    name = key.rsplit("/", 1)[-1]
    if name.startswith("min"):
        return min
    if name.startswith("max") or key.startswith("time/") or key == "step_time":
        return max
    return lambda values: sum(values) / len(values)


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Every rank's step metrics -> the step's, on every rank.

    Means of per-rank means are the step's mean (equal shards); a per-rank std
    (rewards/<fn>/std) becomes the mean of the ranks' stds, not the std of the
    whole step.
    """
    if not is_distributed():
        return metrics
    gathered: list[dict] = [None] * world_size()
    dist.all_gather_object(gathered, metrics)
    keys = dict.fromkeys(key for rank_metrics in gathered for key in rank_metrics)
    return {key: _reduction(key)([m[key] for m in gathered if key in m]) for key in keys}


def map_shards(fn: Callable[[list], list], items: list) -> list:
    """fn(items), with the work split over the ranks: rank r runs fn on its contiguous slice and the results
    are gathered in order, on every rank. Slices have equal length (the last is padded by repeating an item,
    dropped afterwards) so that every rank makes the same calls, as a sharded model (FSDP) requires."""
    if not is_distributed() or not items:
        return fn(items)
    K = world_size()
    per_rank = -(-len(items) // K)  # ceil
    padded = items + [items[-1]] * (per_rank * K - len(items))
    results: list[list] = [None] * K
    dist.all_gather_object(results, fn(padded[rank() * per_rank : (rank() + 1) * per_rank]))
    return [result for shard in results for result in shard][: len(items)]


def gather_lists(items: list) -> list:
    """Every rank's `items`, concatenated in rank order, on every rank (a collective: every rank must call it)."""
    if not is_distributed():
        return items
    gathered: list[list] = [None] * world_size()
    dist.all_gather_object(gathered, items)
    return [item for shard in gathered for item in shard]


# --- failures: every rank stops, none waits ------------------------------------------------------
@contextlib.contextmanager
def fail_together(stage: str) -> Iterator[None]:
    """Run a rank-local stage (rollout, rewards); if any rank raises in it, every rank raises.

    The failing rank raises its own error; the others raise RankFailedError
    with its message. Without this, the others would go on to the update and
    wait in DDP's gradient all-reduce for a rank that will never come. Either
    error is marked as stopped_together: every rank stops at this point, so
    collectives (saving a checkpoint) are still safe while it propagates.
    """
    if not is_distributed():
        yield
        return
    try:
        yield
    except Exception as error:
        _share_outcome(f"{type(error).__name__}: {error}")
        error.stopped_together = True
        raise
    failures = [(r, message) for r, message in enumerate(_share_outcome(None)) if message is not None]
    if failures:
        failed_rank, message = failures[0]
        error = RankFailedError(f"rank {failed_rank} failed in {stage}, so rank {rank()} stops too: {message}")
        error.stopped_together = True
        raise error


def stopped_together(error: BaseException) -> bool:
    """Whether every rank is stopping on `error` at the same point (always, in one process)."""
    return not is_distributed() or getattr(error, "stopped_together", False)


def _share_outcome(message: str | None) -> list[str | None]:
    outcomes: list[str | None] = [None] * world_size()
    dist.all_gather_object(outcomes, message)
    return outcomes


# --- the policy in the update -------------------------------------------------------------------
class PolicyLogps(torch.nn.Module):
    """The policy's forward pass of the update, as one module: rows of a rollout -> (log-probs, entropy).

    DDP synchronises the gradients of what runs inside its forward. With a
    shared prompt (share_prompt_prefix) the policy runs twice per micro-batch
    (prompt, then completions): wrapping this module instead of the model keeps
    it one forward per backward, which is what DDP expects. Only under torchrun:
    a one-process run calls completion_logps on the model directly.
    """

    def __init__(self, model: torch.nn.Module, config):
        super().__init__()
        self.model, self.config = model, config

    def forward(self, rollout: Rollout, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return completion_logps(self.model, rollout, self.config, rows)  # (n, T), (n, T)


def data_parallel_policy(model: torch.nn.Module, config) -> torch.nn.Module | None:
    """Under torchrun, PolicyLogps(model) in DistributedDataParallel, or None with config.fsdp (the model is
    sharded by FSDP2 in place instead, and its own forward gathers the shards). None in one process.

    Call before the optimizer is built (FSDP2 replaces the parameters by shards) and after the reference copy
    (the reference stays whole, outside DDP)."""
    if not is_distributed():
        return None
    if config.fsdp:
        shard_model(model)
        return None
    # device_ids=None: the inputs are already on this rank's device (no scatter); buffers (rotary tables) never
    # change, so there is nothing to synchronise before each forward.
    return torch.nn.parallel.DistributedDataParallel(PolicyLogps(model, config), device_ids=None, **no_buffer_sync())


def no_buffer_sync() -> dict[str, bool]:
    """DistributedDataParallel's argument that turns off the buffer broadcast before each forward, in this torch's
    spelling: torch 2.13 knows `forward_sync_buffers` and warns that `broadcast_buffers` is deprecated (a
    FutureWarning); older torch (Colab's 2.11 among them) knows only `broadcast_buffers`, and raises a TypeError on
    the new name.
    (`broadcast_buffers=False` also skips the broadcast at construction: the buffers are equal on every rank.)"""
    accepted = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers"
    return {name: False}


def shard_model(model: torch.nn.Module) -> None:
    """FSDP2: each decoder layer, then the whole model, keeps 1/K of its parameters per rank and gathers
    them for its forward and backward. The root keeps its gathered parameters after the forward, so the
    log-prob head can read the (tied) output embedding."""
    from torch.distributed.fsdp import fully_shard

    for layer in getattr(getattr(model, "model", model), "layers", []):
        fully_shard(layer)
    fully_shard(model)
    # transformers' generate then keeps every rank stepping until all are done (synced_gpus): each forward of
    # a sharded model is a collective, and ranks whose completions end sooner must still take part.
    model._is_fsdp_managed_module = True


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether shard_model has split this model's parameters over the ranks."""
    return is_distributed() and getattr(model, "_is_fsdp_managed_module", False)


def full_state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """FSDP2: the model's and AdamW's state as whole tensors, gathered on rank 0 (a collective: every rank
    calls it; the others get empty dicts). The optimizer's state is keyed by parameter names."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def load_full_state_dicts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optimizer_state: dict
) -> None:
    """FSDP2: load whole-tensor states (read from a checkpoint by every rank) into this rank's shards."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def gradient_sync(module: torch.nn.Module, enabled: bool):
    """A context in which backward synchronises gradients over the ranks only if `enabled` (the last
    micro-batch of a step): the others accumulate locally, which saves K-1 all-reduces per micro-batch.
    module: the DDP-wrapped policy, or the model (sharded by FSDP2, or plain in one process: nothing to do)."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel) and not enabled:
        return module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def tie_weights(model, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """save_pretrained leaves out lm_head.weight when it is tied to the input embeddings; put it back."""
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights

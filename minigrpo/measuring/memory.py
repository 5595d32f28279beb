"""Where the memory of a training step goes: live tensor bytes, on the GPU and on the CPU alike.

On CUDA, ``torch.cuda.max_memory_allocated`` reports the peak of live tensor
bytes. The CPU has no such counter (the process RSS also counts the
allocator's cache, Python and the libraries), so ``TensorMemoryTracker``
counts tensor storages itself: a ``TorchDispatchMode`` sees every tensor an
operator returns, records its storage the first time it appears, and a
weakref finalizer on the storage subtracts it when it is freed.

At each new peak the tracker remembers which storages were live, so that the
peak can be split afterwards (``peak_breakdown``) into weights, gradients,
optimizer state and the rest (activations and temporaries).

What it does not see: storages created before it was entered (count them
with ``storage_bytes``) and scratch buffers a kernel allocates and frees
inside one operator (small next to activations for the models here).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TensorMemoryTracker(TorchDispatchMode):
    """Live bytes of tensor storages allocated while active, and their peak.

    Usage::

        with TensorMemoryTracker() as tracker:
            loss = model(x).sum(); loss.backward()
        tracker.peak_bytes, tracker.live_bytes
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[int, int]] = {}  # storage data_ptr -> (allocation id, bytes)
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_ids: frozenset[int] = frozenset()  # allocation ids live at the peak
        self._ids = itertools.count()
        self._peak_dirty = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        # A view or in-place result shares an input's storage: not an allocation (and the input's storage
        # may predate the tracker, e.g. a parameter seen through `weight.t()`).
        inputs = {_pointer(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(output):
            if isinstance(tensor, torch.Tensor) and _pointer(tensor) not in inputs:
                self._record(tensor)
        return output

    def _record(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        pointer, size = storage.data_ptr(), storage.nbytes()
        if pointer == 0 or pointer in self.live:  # empty, or a storage already counted
            return
        self.live[pointer] = (next(self._ids), size)
        self.live_bytes += size
        # The Python storage object is kept alive as long as the C++ storage, so this fires when it is freed.
        weakref.finalize(storage, self._free, pointer)
        if self.live_bytes > self.peak_bytes:  # the set of live storages is taken at the next free
            self.peak_bytes = self.live_bytes
            self._peak_dirty = True

    def _free(self, pointer: int) -> None:
        if self._peak_dirty:
            self._snapshot()
        entry = self.live.pop(pointer, None)
        if entry is not None:
            self.live_bytes -= entry[1]

    def reset_peak(self) -> None:
        """Start a new phase: its peak starts from what is live now."""
        self.peak_bytes = self.live_bytes
        self._snapshot()

    def _snapshot(self) -> None:
        self.peak_ids = frozenset(allocation for allocation, _ in self.live.values())
        self._peak_dirty = False

    def __exit__(self, *exc):
        if self._peak_dirty:
            self._snapshot()
        return super().__exit__(*exc)

    def ids_of(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        """Allocation ids of those `tensors` whose storage the tracker saw allocated (and is still live)."""
        ids = set()
        for tensor in tensors:
            entry = self.live.get(tensor.untyped_storage().data_ptr())
            if entry is not None:
                ids.add(entry[0])
        return ids

    def peak_bytes_of(self, ids: set[int]) -> int:
        """Bytes, at the peak, of the storages with these allocation ids (still live now)."""
        sizes = {allocation: size for allocation, size in self.live.values()}
        return sum(sizes[i] for i in ids & self.peak_ids if i in sizes)


def _pointer(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without a storage (e.g. sparse)
        return 0


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (tied weights and views count once)."""
    storages = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def gradients(modules: Iterable[torch.nn.Module]) -> list[torch.Tensor]:
    return [p.grad for module in modules for p in module.parameters() if p.grad is not None]


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """AdamW's exp_avg and exp_avg_sq (and step counters) of every parameter."""
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def peak_breakdown(
    tracker: TensorMemoryTracker,
    weights_before: int,
    grads: list[torch.Tensor],
    optimizer_tensors: list[torch.Tensor],
    state_before: int = 0,
) -> dict[str, int]:
    """Split the peak of live bytes: {"weights", "gradients", "optimizer_state", "activations", "total"}.

    weights_before: bytes that existed before the tracker started (models' parameters and buffers);
    state_before: gradient / optimizer bytes that existed before it (0 on a first step).
    Gradients and optimizer state are the storages live at the end of the step that were also live
    at the peak; everything else the tracker saw live at the peak is activations and temporaries.
    """
    grad_bytes = tracker.peak_bytes_of(tracker.ids_of(grads))
    state_bytes = tracker.peak_bytes_of(tracker.ids_of(optimizer_tensors))
    activations = tracker.peak_bytes - grad_bytes - state_bytes
    return {
        "weights": weights_before,
        "gradients": grad_bytes,
        "optimizer_state": state_bytes + state_before,
        "activations": activations,
        "total": weights_before + state_before + tracker.peak_bytes,
    }


GiB = 1024**3


def format_bytes(num_bytes: int) -> str:
    return f"{num_bytes / GiB:6.2f} GiB" if num_bytes >= GiB / 10 else f"{num_bytes / 1024**2:6.1f} MiB"

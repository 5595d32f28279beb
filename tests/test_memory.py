"""The live-tensor tracker against known allocations (tests/test_bench.py runs bench/memory.py --quick)."""

import torch

from minigrpo.measuring.memory import TensorMemoryTracker, optimizer_state, peak_breakdown, storage_bytes

MiB = 1024**2


def test_a_4_mib_tensor_shows_4_mib_and_disappears_when_freed():
    with TensorMemoryTracker() as tracker:
        a = torch.zeros(MiB)  # 1 Mi fp32 values = 4 MiB
        assert tracker.live_bytes == 4 * MiB
        b = torch.ones(MiB)
        a.view(-1, 2).add_(1)  # a view and an in-place op: no new storage
        assert tracker.live_bytes == 8 * MiB
        del b
        assert tracker.live_bytes == 4 * MiB
        del a
        assert tracker.live_bytes == 0
    assert tracker.peak_bytes == 8 * MiB


def test_views_of_older_tensors_are_not_allocations():
    weight = torch.randn(512, 512)  # allocated before the tracker, like a model's parameters
    with TensorMemoryTracker() as tracker:
        transposed, row = weight.t(), weight[0]
        weight.mul_(2)
        assert tracker.live_bytes == 0
        product = transposed @ row  # a new (512,) result: 2 KiB
        assert tracker.live_bytes == product.untyped_storage().nbytes() == 2048


def test_peak_breakdown_finds_gradients_and_optimizer_state():
    weight = torch.nn.Parameter(torch.randn(512, 512))  # 1 MiB, allocated before the tracker
    optimizer = torch.optim.AdamW([weight], foreach=False)
    with TensorMemoryTracker() as tracker:
        (weight @ weight).sum().backward()
        optimizer.step()
    breakdown = peak_breakdown(tracker, storage_bytes([weight]), [weight.grad], optimizer_state(optimizer))
    assert breakdown["weights"] == MiB
    assert breakdown["gradients"] == MiB
    assert breakdown["optimizer_state"] >= 2 * MiB  # exp_avg and exp_avg_sq (+ the step counter)
    assert breakdown["total"] == MiB + tracker.peak_bytes

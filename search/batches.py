"""How a workload's global batch splits over the GPUs and into micro-batches."""

from __future__ import annotations

from store.errors import InputError
from store.records import Hardware, Workload


def per_gpu_batch(workload: Workload, hardware: Hardware) -> int:
    """Samples per GPU per optimizer step; the global batch must split evenly over the GPUs."""
    world = hardware.world_size
    if workload.global_batch % world:
        raise InputError(
            f"--batch {workload.global_batch} does not split over {world} GPUs "
            f"({hardware.gpus} per node x {hardware.nodes} nodes); use a multiple of {world}"
        )
    return workload.global_batch // world


def micro_batches(workload: Workload, hardware: Hardware) -> list[int]:
    """Micro-batch sizes that keep the global batch exact (divisors of the per-GPU batch)."""
    return divisors(per_gpu_batch(workload, hardware))


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order (O(sqrt n): a large batch costs no more than its root)."""
    low, high = [], []
    k = 1
    while k * k <= n:
        if n % k == 0:
            low.append(k)
            if k * k != n:
                high.append(n // k)
        k += 1
    return low + high[::-1]

"""Seconds: collectives, PCIe/NVMe offload traffic, empty_cache (compute: :mod:`search.model.roofline`).

Pure functions of shapes, hardware and coefficients.
"""

from __future__ import annotations

from search.coefficients import Coefficients
from store.records import DTYPE_BYTES, Hardware


def per_gpu_link_gbps(hardware: Hardware) -> float:
    """Bandwidth one GPU gets in a ring collective: NVLink inside a node, a share of the NIC across."""
    if hardware.nodes == 1:
        return hardware.gpu.interconnect_gbps
    return min(hardware.gpu.interconnect_gbps, hardware.inter_node_gbps / hardware.gpus)


def collective_time(ring_bytes: float, hardware: Hardware, coef: Coefficients, overlapped: bool = True) -> float:
    """Seconds for collectives moving ``ring_bytes`` per GPU, less the share hidden behind compute when they
    run on a stream of their own (``overlapped``: ZeRO's ``overlap_comm``)."""
    if hardware.world_size == 1 or ring_bytes <= 0:
        return 0.0
    seconds = ring_bytes / (per_gpu_link_gbps(hardware) * 1e9 * coef.network_efficiency)
    return seconds * (1.0 - coef.comm_overlap) if overlapped else seconds


def zero_comm_bytes(
    *, zero_stage: int, trainable: int, resident: int, dtype: str, world_size: int, grad_accum: int, passes: int
) -> float:
    """Bytes each GPU sends per optimizer step in ZeRO's collectives (ring algorithms).

    ``passes`` is how often ZeRO-3 gathers the parameters per micro-batch (forward, backward, and once
    more under recompute).
    """
    if world_size == 1:
        return 0.0
    d = DTYPE_BYTES[dtype]
    ring = (world_size - 1) / world_size
    if zero_stage in (0, 1):
        return 2 * ring * d * trainable  # one all-reduce (or reduce-scatter + all-gather) per step
    if zero_stage == 2:
        return ring * d * trainable * grad_accum + ring * d * trainable  # reduce per micro, gather per step
    return grad_accum * (passes * ring * d * resident + ring * d * trainable)


def pcie_time(bytes_moved: float, hardware: Hardware, coef: Coefficients) -> float:
    """Seconds to move ``bytes_moved`` over one GPU's host link with pinned buffers. Not hidden: DeepSpeed's
    offloaded gradients are copied out before the backward's epilogue synchronizes, and the updated 16-bit
    parameters come back before the next forward can start."""
    return bytes_moved / (hardware.gpu.pcie_gbps * 1e9 * hardware.gpu.pcie_efficiency)


def nvme_time(bytes_moved_per_node: float, coef: Coefficients) -> float:
    """Seconds to read and write ``bytes_moved_per_node`` on the node's NVMe drive."""
    return bytes_moved_per_node / (coef.nvme_gbps * 1e9)


def empty_cache_time(calls: float, released_bytes: float, coef: Coefficients) -> float:
    """What ``torch.cuda.empty_cache()`` costs: the release now and the cudaMalloc afterwards."""
    return calls * (coef.empty_cache_call_s + coef.empty_cache_realloc_s_per_gib * released_bytes / 2**30)

"""Seconds: compute at an achieved rate, collectives, PCIe/NVMe offload traffic, optimizer, empty_cache.

Pure functions of shapes, hardware and coefficients.
"""

from __future__ import annotations

from search.coefficients import Coefficients
from store.records import DTYPE_BYTES, Hardware


def compute_time(flops: float, tokens: int, dtype: str, hardware: Hardware, coef: Coefficients) -> float:
    """Seconds for ``flops`` of transformer math on one GPU with ``tokens`` tokens per call.

    The achieved rate is mfu x peak, scaled down for small micro-batches that cannot fill the GPU.
    """
    fill = tokens / (tokens + coef.half_efficiency_tokens)
    rate = hardware.gpu.tflops(dtype) * 1e12 * coef.mfu * fill
    return flops / rate


def per_gpu_link_gbps(hardware: Hardware) -> float:
    """Bandwidth one GPU gets in a ring collective: NVLink inside a node, a share of the NIC across."""
    if hardware.nodes == 1:
        return hardware.gpu.interconnect_gbps
    return min(hardware.gpu.interconnect_gbps, hardware.inter_node_gbps / hardware.gpus)


def collective_time(ring_bytes: float, hardware: Hardware, coef: Coefficients) -> float:
    """Seconds for collectives moving ``ring_bytes`` per GPU, less the share hidden behind compute."""
    if hardware.world_size == 1 or ring_bytes <= 0:
        return 0.0
    seconds = ring_bytes / (per_gpu_link_gbps(hardware) * 1e9 * coef.network_efficiency)
    return seconds * (1.0 - coef.comm_overlap)


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
    """Seconds to move ``bytes_moved`` over one GPU's host link, less the overlapped share."""
    seconds = bytes_moved / (hardware.gpu.pcie_gbps * 1e9 * coef.pcie_efficiency)
    return seconds * (1.0 - coef.offload_overlap)


def nvme_time(bytes_moved_per_node: float, coef: Coefficients) -> float:
    """Seconds to read and write ``bytes_moved_per_node`` on the node's NVMe drive."""
    return bytes_moved_per_node / (coef.nvme_gbps * 1e9)


def gpu_adam_time(params: int, hardware: Hardware, coef: Coefficients) -> float:
    """Fused Adam on the GPU: memory-bound streaming of master weights, moments and gradients."""
    return params * coef.gpu_adam_bytes_per_param / (hardware.gpu.hbm_gbps * 1e9 * coef.hbm_efficiency)


def cpu_adam_time(params_per_gpu: int, hardware: Hardware, coef: Coefficients) -> float:
    """DeepSpeedCPUAdam: every local rank's partition is stepped by the same host CPUs."""
    return params_per_gpu * hardware.gpus / coef.cpu_adam_params_per_s


def empty_cache_time(calls: float, released_bytes: float, coef: Coefficients) -> float:
    """What ``torch.cuda.empty_cache()`` costs: the release now and the cudaMalloc afterwards."""
    return calls * (coef.empty_cache_call_s + coef.empty_cache_realloc_s_per_gib * released_bytes / 2**30)

"""The coefficients a calibration may move: where each lives, its bounds, and what it stands for.

A value is named ``<field>`` for a :class:`search.coefficients.Coefficients` field and ``gpu.<field>`` for an
achieved fraction or floor of the GPU's catalog entry (:class:`store.records.GPUSpec`). Bounds are physical:
a fraction of a peak rate is at most 1, a latency is positive. The lower bounds are far below what a GPU
reaches because the same machinery calibrates DeepSpeed's CPU accelerator, whose "device" runs the GPU time
model with rates a few hundred times lower than any catalog GPU's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from search.coefficients import Coefficients
from store.records import Hardware

# Bump when PARAMETERS change meaning: a stored calibration of another version is not applied.
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class Parameter:
    """One calibrated coefficient: its value's name, its bounds and the quantity it moves."""

    name: str  # "gpu.<GPUSpec field>" or a Coefficients field
    lower: float
    upper: float
    moves: str  # "time" or "memory": which measured quantities can determine it
    what: str

    @property
    def on_gpu(self) -> bool:
        return self.name.startswith("gpu.")

    @property
    def field(self) -> str:
        return self.name.removeprefix("gpu.")


PARAMETERS: tuple[Parameter, ...] = (
    # --- the GPU's achieved rates (search.model.roofline) ---------------------------------------------
    Parameter("gpu.matmul_efficiency", 1e-6, 1.0, "time", "achieved share of the dense matmul peak"),
    Parameter("gpu.matmul_half_dim", 1.0, 8192.0, "time", "GEMM dimension at which the achieved rate halves"),
    Parameter("gpu.hbm_efficiency", 1e-5, 1.0, "time", "achieved share of HBM bandwidth (element-wise, Adam)"),
    Parameter("gpu.pcie_efficiency", 1e-4, 1.0, "time", "achieved share of the host link (offload copies)"),
    Parameter("gpu.kernel_floor_s", 1e-8, 1e-2, "time", "least device time of one kernel"),
    # --- host work and the rest of the time model (search.coefficients) --------------------------------
    Parameter("host_s_per_kernel", 1e-8, 1e-1, "time", "host seconds to issue one kernel from eager PyTorch"),
    Parameter("host_s_per_tensor_op", 1e-8, 1e-1, "time", "host seconds of one bare tensor expression"),
    Parameter("checkpoint_forward_overhead", 0.01, 10.0, "time", "checkpoint hooks in the forward"),
    Parameter("checkpoint_backward_overhead", 0.01, 10.0, "time", "checkpoint hooks beyond the recompute"),
    Parameter("host_memory_gbps", 0.05, 2000.0, "time", "host bandwidth CPU Adam streams at (its throughput)"),
    Parameter("pageable_copy_gbps", 0.01, 200.0, "time", "host-to-device copies from pageable memory (ZeRO-3 offload)"),
    Parameter("host_first_touch_gbps", 0.01, 500.0, "time", "first write of new pageable host pages (ZeRO-3 offload)"),
    Parameter("network_efficiency", 0.01, 1.0, "time", "achieved share of link bandwidth in collectives"),
    Parameter("nvme_gbps", 0.01, 100.0, "time", "NVMe read/write bandwidth"),
    Parameter("empty_cache_call_s", 1e-6, 1.0, "time", "one torch.cuda.empty_cache() call"),
    Parameter("step_overhead_s", 1e-6, 10.0, "time", "the training loop's Python and data per micro-batch"),
    # --- memory outside the traced tensors ---------------------------------------------------------------
    # (torch's counters never see the CUDA context: probes leave it undetermined, unless a record measures it)
    Parameter("cuda_context_bytes", 1.0, 2.0**33, "memory", "CUDA context, kernels and library handles"),
    Parameter("cublas_workspace_bytes", 1.0, 2.0**31, "memory", "cuBLAS workspace through the caching allocator"),
    # (peak reserved comes from the allocator replay, which no coefficient here moves but the workspace: the
    # fragment coefficients only screen a search's choices, so no probe can calibrate them)
)
BY_NAME: dict[str, Parameter] = {p.name: p for p in PARAMETERS}


def default_values(hardware: Hardware, coef: Coefficients) -> dict[str, float]:
    """Every parameter's value before calibration: the GPU's catalog entry and the coefficients given."""
    return {p.name: float(getattr(hardware.gpu, p.field) if p.on_gpu else getattr(coef, p.field)) for p in PARAMETERS}


def apply_values(hardware: Hardware, coef: Coefficients, values: dict[str, float]) -> tuple[Hardware, Coefficients]:
    """The hardware and coefficients with ``values`` in place (names not in PARAMETERS are ignored)."""
    gpu_changes: dict[str, Any] = {BY_NAME[n].field: v for n, v in values.items() if n in BY_NAME and BY_NAME[n].on_gpu}
    coef_changes = {BY_NAME[n].field: v for n, v in values.items() if n in BY_NAME and not BY_NAME[n].on_gpu}
    if gpu_changes:
        hardware = replace(hardware, gpu=replace(hardware.gpu, **gpu_changes))
    if coef_changes:
        coef = coef.with_(**coef_changes)
    return hardware, coef

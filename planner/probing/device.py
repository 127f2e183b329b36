"""What a probe's device shows of a prediction: the CPU backend has no CUDA context, cuBLAS workspace or
caching allocator, and its "device" and host memory are one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from planner.job.inputs import JobSpec
from search import Coefficients, Prediction, cpu_backend_coefficients


def cpu_probe_dtype(spec: JobSpec, device: str, on_note: Callable[[str], None] | None) -> JobSpec:
    """The job a probe on ``device`` runs: on the CPU backend with no dtype asked for, the dtype this processor
    runs fast (bf16 where oneDNN has bf16 kernels, else fp32), said in one line; an explicit bf16 on a
    processor without them is kept, with a one-line warning that it will be slow. CUDA jobs are unchanged."""
    if device != "cpu" or spec.dtype not in (None, "bf16"):
        return spec
    from probes.measure.cpu_support import cpu_bf16_slow_reason, cpu_fast_dtype  # lazy on purpose: probes loads torch

    line: str | None
    if spec.dtype is None:
        dtype, line = cpu_fast_dtype()
        spec = replace(spec, dtype=dtype)
    else:
        line = cpu_bf16_slow_reason()
    if line is not None and on_note is not None:
        on_note(line)
    return spec


def device_coefficients(device: str, coef: Coefficients) -> Coefficients:
    """The CPU backend has no CUDA context, cuBLAS workspace or caching allocator."""
    if device == "cpu":
        return cpu_backend_coefficients(coef)
    return coef


def device_prediction(prediction: Prediction, device: str) -> Prediction:
    """The prediction as the probe's device measures it: on the CPU backend host-resident states (offloaded
    optimizer states, pinned buffers) are live tensors of the same memory, and reserved equals allocated."""
    return prediction.on_cpu_backend() if device == "cpu" else prediction


# Where neither gpu_mem nor gpu is given, a probe plans for this GPU memory (by --device).
PROBE_GPU_MEM = {"cuda": "80G", "cpu": "24G"}

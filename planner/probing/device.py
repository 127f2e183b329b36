"""What a probe's device shows of a prediction: the CPU backend has no CUDA context, cuBLAS workspace or
caching allocator, and its "device" and host memory are one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from planner.job.inputs import JobSpec
from search import Coefficients, Prediction, cpu_backend_coefficients
from store.gpus import gpu_for_device


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


# Where neither gpu_mem nor gpu is given and the GPU here cannot be read, a probe plans for this memory.
PROBE_GPU_MEM = {"cuda": "80G", "cpu": "24G"}


def probe_gpu(
    spec: JobSpec,
    device: str,
    on_note: Callable[[str], None] | None = None,
    detect: Callable[[], tuple[str, int] | None] | None = None,
) -> JobSpec:
    """The GPU a probe's job plans for where it names neither ``gpu`` nor ``gpu_mem``.

    On cuda, the GPU the probes run on (nvidia-smi's name and memory, ``detect`` in tests): its catalog entry,
    so the prediction beside each measurement uses that GPU's rates, or, for a GPU the catalog lacks, its memory
    with generic rates, said in one line. Where nothing can be read, ``PROBE_GPU_MEM["cuda"]``, said too. On the
    CPU backend, ``PROBE_GPU_MEM["cpu"]``. A job that names its GPU is unchanged.
    """
    if spec.gpu_mem is not None or spec.gpu is not None:
        return spec
    if device != "cuda":
        return replace(spec, gpu_mem=PROBE_GPU_MEM["cpu"])
    if detect is None:
        from probes.measure.fingerprint import local_cuda_gpu  # lazy on purpose: probes loads torch

        detect = local_cuda_gpu
    found = detect()
    if found is None:
        if on_note is not None:
            on_note(f"no GPU readable by nvidia-smi here: the probes plan for {PROBE_GPU_MEM['cuda']} at generic rates")
        return replace(spec, gpu_mem=PROBE_GPU_MEM["cuda"])
    name, memory_bytes = found
    gpu = gpu_for_device(name, memory_bytes)
    if gpu is not None:
        if on_note is not None:
            on_note(f"the probes plan for the GPU here: {gpu.name} (nvidia-smi: {name}, {memory_bytes // 2**20} MiB)")
        return replace(spec, gpu=gpu.name)
    if on_note is not None:
        on_note(
            f"{name} ({memory_bytes // 2**20} MiB) is not in the GPU catalog: the probes plan for its memory at "
            "generic rates; --gpu names a catalog GPU whose rates are closer"
        )
    return replace(spec, gpu_mem=str(memory_bytes))

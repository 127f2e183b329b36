"""Which compute dtypes DeepSpeed's CPU accelerator runs on this processor.

DeepSpeed's engine refuses a dtype its accelerator does not support (``_do_sanity_check``: "Type fp16 is
not supported on your device."). On the CPU accelerator bf16 and fp32 always run, while fp16 runs only
where oneDNN implements it for the processor (``CPU_Accelerator.is_fp16_supported`` asks
``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: AVX512-FP16 or AMX-FP16 parts). The answer here comes from
that same accelerator class, so the probes and the tests agree with the engine that would refuse.

Which of the dtypes that run is fast is another question: without oneDNN bf16 kernels
(``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` False: no AVX512-BF16 or AMX, e.g. AVX2-only parts) torch
computes a bf16 matmul with its reference kernel, about 75x slower than fp32 (a 512 x 768 x 3072 matmul: 5.1 s
against 68 ms on a 2-core AMD EPYC). :func:`cpu_fast_dtype` is the dtype a CPU probe takes when none is asked
for, and :func:`cpu_bf16_slow_reason` the warning for an explicit bf16 there. ``ONEDNN_MAX_CPU_ISA=AVX2`` in
the environment makes a processor that has the kernels behave, and answer, as one without.

Imports deepspeed (or torch) on first call (seconds); only the probe path and the tests call it.
"""

from __future__ import annotations

__all__ = [
    "cpu_bf16_is_fast",
    "cpu_bf16_slow_reason",
    "cpu_dtype_unsupported_reason",
    "cpu_fast_dtype",
    "cpu_runs_dtype",
]


def cpu_runs_dtype(dtype: str) -> bool:
    """Whether ``deepspeed.initialize`` on the CPU accelerator accepts ``dtype`` (fp32, bf16, fp16) here."""
    if dtype == "fp32":
        return True
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    accelerator = CPU_Accelerator()
    if dtype == "bf16":
        return bool(accelerator.is_bf16_supported())
    if dtype == "fp16":
        return bool(accelerator.is_fp16_supported())
    raise ValueError(f"unknown dtype {dtype!r}")


def cpu_dtype_unsupported_reason(dtype: str) -> str | None:
    """None when the CPU accelerator runs ``dtype`` here, else one line saying why not and what to do."""
    if cpu_runs_dtype(dtype):
        return None
    if dtype == "fp16":
        return (
            "this processor cannot run fp16 on DeepSpeed's CPU accelerator (oneDNN has no fp16 kernels for it: "
            "torch.ops.mkldnn._is_mkldnn_fp16_supported() is False); probe with --dtype bf16 or fp32, "
            "or on --device cuda"
        )
    return f"DeepSpeed's CPU accelerator does not support {dtype} on this processor; probe with --dtype fp32"


def cpu_bf16_is_fast() -> bool:
    """Whether oneDNN has bf16 kernels for this processor (the check torch's own bf16 CPU paths make)."""
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_fast_dtype() -> tuple[str, str]:
    """The dtype a CPU probe runs in when none is asked for, and one line saying which and why.

    bf16 (what the GPU plan trains in) where oneDNN runs it; fp32 elsewhere, since bf16 matmuls then take the
    reference kernel, one to two orders of magnitude slower, and a probe would run for minutes a step.
    """
    if cpu_bf16_is_fast() and cpu_runs_dtype("bf16"):
        return "bf16", "dtype: bf16 (oneDNN runs bf16 on this processor; pass --dtype to choose)"
    return "fp32", (
        "dtype: fp32 (this processor has no oneDNN bf16 kernels: torch.ops.mkldnn._is_mkldnn_bf16_supported() "
        "is False, and bf16 matmuls would run about 75x slower; pass --dtype bf16 to probe bf16 anyway)"
    )


def cpu_bf16_slow_reason() -> str | None:
    """None where bf16 is fast on this processor, else one warning line for a probe asked to run bf16."""
    if cpu_bf16_is_fast():
        return None
    return (
        "warning: --dtype bf16 on a processor without oneDNN bf16 kernels (no AVX512-BF16 or AMX): bf16 matmuls "
        "fall back to torch's reference kernel, about 75x slower than fp32; a probe step may take minutes"
    )

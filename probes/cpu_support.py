"""Which compute dtypes DeepSpeed's CPU accelerator runs on this processor.

DeepSpeed's engine refuses a dtype its accelerator does not support (``_do_sanity_check``: "Type fp16 is
not supported on your device."). On the CPU accelerator bf16 and fp32 always run, while fp16 runs only
where oneDNN implements it for the processor (``CPU_Accelerator.is_fp16_supported`` asks
``torch.ops.mkldnn._is_mkldnn_fp16_supported()``: AVX512-FP16 or AMX-FP16 parts). The answer here comes from
that same accelerator class, so the probes and the tests agree with the engine that would refuse.

Imports deepspeed on first call (seconds); only the probe path and the tests call it.
"""

from __future__ import annotations

__all__ = ["cpu_dtype_unsupported_reason", "cpu_runs_dtype"]


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

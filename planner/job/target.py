"""The device a calibration belongs to, its *target*: the catalog GPU a probe's fingerprint names
(``H100-80G``), ``cuda:<name>`` for a GPU the catalog does not know, or ``cpu:<model>`` for DeepSpeed's CPU
accelerator. Calibrated values are fractions of the target's catalog rates; a CPU target runs the GPU time
model on the generic rates (``store.gpus.GENERIC_RATES``), so its values mean the same whatever ``--gpu`` a CPU
probe planned for.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from store.gpus import GENERIC_RATES, gpu_for_device
from store.records import Hardware


def target_of(fingerprint: dict[str, Any] | None) -> tuple[str, str]:
    """(target, device) of a device fingerprint (see the module docstring)."""
    fp = fingerprint or {}
    device = str(fp.get("device", "cuda"))
    name = str(fp.get("name", "unknown"))
    if device == "cpu":
        return f"cpu:{name}", "cpu"
    gpu = gpu_for_device(name, int(fp.get("total_memory_bytes", 0) or 0))
    return (gpu.name if gpu is not None else f"cuda:{name}"), "cuda"


def detected_target() -> str:
    """This machine's device: its GPU where torch sees one, else its CPU (DeepSpeed's CPU accelerator)."""
    import torch

    return device_target("cuda" if torch.cuda.is_available() else "cpu")


def device_target(device: str) -> str:
    """The target of the device this machine probes: its GPU 0 (as torch sees it) on cuda, this CPU on the CPU
    backend; ``cuda:unknown GPU`` where torch sees no GPU (the probe itself will say why it cannot run)."""
    from probes.measure.fingerprint import fingerprint, host_fingerprint  # lazy on purpose: probes loads torch

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return target_of(host_fingerprint("cuda").to_dict())[0]
    return target_of(fingerprint(device).to_dict())[0]


def target_hardware(hardware: Hardware, target: str) -> Hardware:
    """The job's hardware with the rates a target's calibration is relative to: the catalog GPU's for a
    known GPU, the generic rates (with the job's memory) for the CPU backend and unknown GPUs."""
    if target.startswith(("cpu:", "cuda:")):
        generic = replace(GENERIC_RATES, name=hardware.gpu.name, memory_bytes=hardware.gpu.memory_bytes, aliases=())
        return replace(hardware, gpu=generic)
    return hardware

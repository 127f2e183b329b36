"""Which device and software produced a measurement (``DeviceFingerprint``).

:func:`fingerprint` runs in the probe child (it imports torch for CUDA facts); :func:`host_fingerprint`
needs no torch and serves the parent when a child died before reporting one. Versions come from the
installed packages' metadata (:func:`versions`, which the planner also puts in the request key).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata

from store.measurements import DeviceFingerprint

__all__ = ["cpu_name", "fingerprint", "host_fingerprint", "host_memory_bytes", "local_cuda_gpu", "versions"]


def versions() -> dict[str, str]:
    """Installed torch, deepspeed and transformers versions ("" where one is missing)."""
    out = {}
    for name in ("torch", "deepspeed", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = ""
    return out


def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s model name where there is one, else the platform's words)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def host_memory_bytes() -> int:
    """Physical memory of this machine (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _nvidia_smi(query: str) -> list[str]:
    """The first GPU's answer to ``nvidia-smi --query-gpu=QUERY`` as fields, or [] without the tool."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        done = subprocess.run(
            [tool, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    lines = done.stdout.strip().splitlines()
    return [field.strip() for field in lines[0].split(",")] if done.returncode == 0 and lines else []


def _nvidia_driver() -> str:
    fields = _nvidia_smi("driver_version")
    return fields[0] if fields else ""


def local_cuda_gpu() -> tuple[str, int] | None:
    """GPU 0 of this machine as nvidia-smi names it, with its memory in bytes (nvidia-smi's MiB), or None
    where there is no nvidia-smi or no GPU. No torch: the planner asks this without a CUDA context of its own,
    which would hold device memory beside the probes."""
    fields = _nvidia_smi("name,memory.total")
    if len(fields) != 2 or not fields[1].isdigit():
        return None
    return fields[0], int(fields[1]) * 2**20


def host_fingerprint(device: str) -> DeviceFingerprint:
    """What can be said without torch: the CPU (device "cpu"), or the driver alone for "cuda"."""
    v = versions()
    if device == "cuda":
        return DeviceFingerprint(device="cuda", name="unknown GPU", total_memory_bytes=0, driver=_nvidia_driver(), **v)
    return DeviceFingerprint(device="cpu", name=cpu_name(), total_memory_bytes=host_memory_bytes(), **v)


def fingerprint(device: str) -> DeviceFingerprint:
    """The full fingerprint of ``device`` ("cuda": GPU 0 as torch sees it; "cpu": the host)."""
    if device != "cuda":
        return host_fingerprint("cpu")
    import torch

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    major, minor = torch.cuda.get_device_capability(index)
    driver = _nvidia_driver()
    if not driver and hasattr(torch._C, "_cuda_getDriverVersion"):
        api = torch._C._cuda_getDriverVersion()  # e.g. 12040: the CUDA version the driver supports
        driver = f"supports CUDA {api // 1000}.{api % 1000 // 10}"
    return DeviceFingerprint(
        device="cuda",
        name=torch.cuda.get_device_name(index),
        total_memory_bytes=int(props.total_memory),
        compute_capability=f"{major}.{minor}",
        driver=driver,
        cuda=torch.version.cuda or "",
        **versions(),
    )

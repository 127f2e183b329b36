"""The GPU catalog: memory as torch reports it, dense tensor-core rates and bandwidths.

Memory is ``torch.cuda.get_device_properties(i).total_memory`` as nvidia-smi lists it (MiB). Rates are
the vendors' dense figures (no sparsity); the time model applies achieved-fraction coefficients to
them. Bandwidths are GB/s (10^9 bytes per second), one direction.
"""

from __future__ import annotations

import difflib
from dataclasses import replace

from store.errors import InputError
from store.records import GPUSpec

MiB = 2**20

_GPUS: tuple[GPUSpec, ...] = (
    GPUSpec(
        name="A100-40G",
        memory_bytes=40960 * MiB,
        bf16_tflops=312,
        fp16_tflops=312,
        fp32_tflops=156,
        hbm_gbps=1555,
        pcie_gbps=25,
        interconnect_gbps=300,
        aliases=("a100", "a100-40gb", "a100-sxm4-40gb"),
    ),
    GPUSpec(
        name="A100-80G",
        memory_bytes=81920 * MiB,
        bf16_tflops=312,
        fp16_tflops=312,
        fp32_tflops=156,
        hbm_gbps=2039,
        pcie_gbps=25,
        interconnect_gbps=300,
        aliases=("a100-80gb", "a100-sxm4-80gb"),
    ),
    GPUSpec(
        name="H100-80G",
        memory_bytes=81559 * MiB,
        bf16_tflops=989,
        fp16_tflops=989,
        fp32_tflops=495,
        hbm_gbps=3350,
        pcie_gbps=50,
        interconnect_gbps=450,
        aliases=("h100", "h100-sxm", "h100-80gb"),
    ),
    GPUSpec(
        name="H200",
        memory_bytes=143771 * MiB,
        bf16_tflops=989,
        fp16_tflops=989,
        fp32_tflops=495,
        hbm_gbps=4800,
        pcie_gbps=50,
        interconnect_gbps=450,
        aliases=("h200-141g", "h200-sxm"),
    ),
    # V100 and T4 have no bf16 tensor cores: bf16 runs at the fp32 rate there.
    GPUSpec(
        name="V100-16G",
        memory_bytes=16384 * MiB,
        bf16_tflops=15.7,
        fp16_tflops=125,
        fp32_tflops=15.7,
        hbm_gbps=900,
        pcie_gbps=12,
        interconnect_gbps=150,
        aliases=("v100", "v100-16gb"),
    ),
    GPUSpec(
        name="V100-32G",
        memory_bytes=32768 * MiB,
        bf16_tflops=15.7,
        fp16_tflops=125,
        fp32_tflops=15.7,
        hbm_gbps=900,
        pcie_gbps=12,
        interconnect_gbps=150,
        aliases=("v100-32gb",),
    ),
    GPUSpec(
        name="A10",
        memory_bytes=23028 * MiB,
        bf16_tflops=125,
        fp16_tflops=125,
        fp32_tflops=62.5,
        hbm_gbps=600,
        pcie_gbps=25,
        interconnect_gbps=25,
        aliases=("a10-24g",),
    ),
    GPUSpec(
        name="A6000",
        memory_bytes=49140 * MiB,
        bf16_tflops=154.8,
        fp16_tflops=154.8,
        fp32_tflops=77.4,
        hbm_gbps=768,
        pcie_gbps=25,
        interconnect_gbps=25,
        aliases=("rtx-a6000",),
    ),
    GPUSpec(
        name="L4",
        memory_bytes=23034 * MiB,
        bf16_tflops=121,
        fp16_tflops=121,
        fp32_tflops=60,
        hbm_gbps=300,
        pcie_gbps=25,
        interconnect_gbps=25,
        aliases=("l4-24g",),
    ),
    GPUSpec(
        name="L40S",
        memory_bytes=46068 * MiB,
        bf16_tflops=362,
        fp16_tflops=362,
        fp32_tflops=183,
        hbm_gbps=864,
        pcie_gbps=25,
        interconnect_gbps=25,
        aliases=("l40s-48g",),
    ),
    GPUSpec(
        name="RTX-3090",
        memory_bytes=24576 * MiB,
        bf16_tflops=71,
        fp16_tflops=71,
        fp32_tflops=35.6,
        hbm_gbps=936,
        pcie_gbps=25,
        interconnect_gbps=25,
        aliases=("3090", "rtx3090", "geforce-rtx-3090"),
    ),
    GPUSpec(
        name="RTX-4090",
        memory_bytes=24564 * MiB,
        bf16_tflops=165,
        fp16_tflops=165,
        fp32_tflops=82.6,
        hbm_gbps=1008,
        pcie_gbps=25,
        interconnect_gbps=25,
        aliases=("4090", "rtx4090", "geforce-rtx-4090"),
    ),
    GPUSpec(
        name="T4",
        memory_bytes=15360 * MiB,
        bf16_tflops=8.1,
        fp16_tflops=65,
        fp32_tflops=8.1,
        hbm_gbps=320,
        pcie_gbps=12,
        interconnect_gbps=12,
        aliases=("tesla-t4",),
    ),
)

# Rates assumed when only ``--gpu-mem`` is given: an A100's. Memory comes from the user.
GENERIC_RATES = _GPUS[1]


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


_BY_KEY: dict[str, GPUSpec] = {}
for _gpu in _GPUS:
    for _alias in (_gpu.name, *_gpu.aliases):
        _BY_KEY[_key(_alias)] = _gpu


def gpu_names() -> list[str]:
    """Catalog names, in catalog order."""
    return [gpu.name for gpu in _GPUS]


def get_gpu(name: str) -> GPUSpec:
    """The catalog GPU called ``name`` (case and ``-``/``_`` insensitive, aliases allowed)."""
    found = _BY_KEY.get(_key(name))
    if found is None:
        close = difflib.get_close_matches(_key(name), list(_BY_KEY), n=3, cutoff=0.4)
        names = sorted({_BY_KEY[c].name for c in close})
        hint = f"; did you mean {', '.join(names)}?" if names else ""
        raise InputError(f"unknown GPU {name!r}{hint} Known: {', '.join(gpu_names())}")
    return found


GENERIC_PREFIX = "generic-"  # the name of a GPU known only by its memory


def generic_gpu(memory_bytes: int) -> GPUSpec:
    """A GPU known only by its memory: the catalog's A100 rates, the user's memory."""
    gib = memory_bytes / 2**30
    return replace(GENERIC_RATES, name=f"{GENERIC_PREFIX}{gib:g}G", memory_bytes=memory_bytes, aliases=())


def _family(name: str) -> str:
    """The catalog name's model part: ``H100-80G`` -> ``h100``, ``RTX-4090`` -> ``4090``."""
    return _key(name).split("-")[1] if _key(name).startswith("rtx-") else _key(name).split("-")[0]


def gpu_for_device(device_name: str, total_memory_bytes: int) -> GPUSpec | None:
    """The catalog GPU that ``torch.cuda.get_device_name()`` and its total memory describe, or None.

    ``"NVIDIA H100 80GB HBM3"`` with 85,017,493,504 bytes is ``H100-80G``: the entries whose model name is a
    word of the device name, and of those the one whose memory is nearest to the device's.
    """
    words = set(device_name.lower().replace("_", " ").replace("-", " ").split())
    found = [gpu for gpu in _GPUS if _family(gpu.name) in words]
    if not found:
        return None
    return min(found, key=lambda gpu: abs(gpu.memory_bytes - total_memory_bytes))

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
    GPUSpec("A100-40G", 40960 * MiB, 312, 312, 156, 1555, 25, 300, ("a100", "a100-40gb", "a100-sxm4-40gb")),
    GPUSpec("A100-80G", 81920 * MiB, 312, 312, 156, 2039, 25, 300, ("a100-80gb", "a100-sxm4-80gb")),
    GPUSpec("H100-80G", 81559 * MiB, 989, 989, 495, 3350, 50, 450, ("h100", "h100-sxm", "h100-80gb")),
    GPUSpec("H200", 143771 * MiB, 989, 989, 495, 4800, 50, 450, ("h200-141g", "h200-sxm")),
    # V100 and T4 have no bf16 tensor cores: bf16 runs at the fp32 rate there.
    GPUSpec("V100-16G", 16384 * MiB, 15.7, 125, 15.7, 900, 12, 150, ("v100", "v100-16gb")),
    GPUSpec("V100-32G", 32768 * MiB, 15.7, 125, 15.7, 900, 12, 150, ("v100-32gb",)),
    GPUSpec("A10", 23028 * MiB, 125, 125, 62.5, 600, 25, 25, ("a10-24g",)),
    GPUSpec("A6000", 49140 * MiB, 154.8, 154.8, 77.4, 768, 25, 25, ("rtx-a6000",)),
    GPUSpec("L4", 23034 * MiB, 121, 121, 60, 300, 25, 25, ("l4-24g",)),
    GPUSpec("L40S", 46068 * MiB, 362, 362, 183, 864, 25, 25, ("l40s-48g",)),
    GPUSpec("RTX-3090", 24576 * MiB, 71, 71, 35.6, 936, 25, 25, ("3090", "rtx3090", "geforce-rtx-3090")),
    GPUSpec("RTX-4090", 24564 * MiB, 165, 165, 82.6, 1008, 25, 25, ("4090", "rtx4090", "geforce-rtx-4090")),
    GPUSpec("T4", 15360 * MiB, 8.1, 65, 8.1, 320, 12, 12, ("tesla-t4",)),
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

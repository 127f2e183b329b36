"""The GPU catalog as documents: memory, compute capability, rates, achieved fractions and their sources."""

from __future__ import annotations

from typing import Any

from store.gpus import get_gpu, gpu_names
from store.records import GPU_FRACTION_FIELDS, GPU_RATE_FIELDS, GPUSpec


def gpu_document(gpu: GPUSpec) -> dict[str, Any]:
    """One catalog entry as JSON: memory, compute capability, rates, achieved fractions and where each comes from."""
    cc = gpu.compute_capability
    return {
        "name": gpu.name,
        "aliases": list(gpu.aliases),
        "memory_bytes": gpu.memory_bytes,
        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
        "bf16": gpu.has_bf16,
        "rates": {name: getattr(gpu, name) for name in GPU_RATE_FIELDS},
        "fractions": {name: getattr(gpu, name) for name in GPU_FRACTION_FIELDS},
        "sources": gpu.source_map(),
    }


def gpu_catalog(name: str | None = None) -> list[dict[str, Any]]:
    """Every catalog GPU's document, in catalog order, or the one ``name`` names (InputError if none does)."""
    gpus = [get_gpu(name)] if name else [get_gpu(n) for n in gpu_names()]
    return [gpu_document(g) for g in gpus]

"""``planner gpus``: the GPU catalog, each rate and achieved fraction with where it comes from."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the catalog is imported inside the command: 'planner --help' loads typer and nothing else
    from store.records import GPUSpec


def gpu_document(gpu: GPUSpec) -> dict[str, Any]:
    """One catalog entry as JSON: memory, compute capability, rates, achieved fractions and their sources."""
    from store.records import GPU_FRACTION_FIELDS, GPU_RATE_FIELDS

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


def _table(gpus: list[GPUSpec]) -> None:
    head = f"{'gpu':<10} {'memory':>9} {'cc':>4} {'bf16':>6} {'fp16':>6} {'fp32':>6} {'HBM':>6} {'PCIe':>6} {'link':>5}"
    print(head + f" {'matmul':>6} {'half':>5} {'hbm':>5} {'pcie':>5} {'floor':>6}")
    for g in gpus:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "?"
        bf16 = f"{g.bf16_tflops:>6g}" if g.has_bf16 else f"{'none':>6}"
        print(
            f"{g.name:<10} {g.memory_bytes / 2**30:>7.1f}Gi {cc:>4} {bf16} {g.fp16_tflops:>6g} {g.fp32_tflops:>6g} "
            f"{g.hbm_gbps:>6g} {g.pcie_gbps:>6g} {g.interconnect_gbps:>5g} {g.matmul_efficiency:>6g} "
            f"{g.matmul_half_dim:>5g} {g.hbm_efficiency:>5g} {g.pcie_efficiency:>5g} {g.kernel_floor_s * 1e6:>4g}us"
        )
    print("TF/s dense; GB/s one direction; 'planner gpus NAME' shows where each value comes from (docs/gpus.md).")


def _sources(gpu: GPUSpec) -> None:
    from store.records import GPU_FRACTION_FIELDS, GPU_RATE_FIELDS

    cc = gpu.compute_capability
    print(f"{gpu.name}: compute capability {cc[0]}.{cc[1]}" if cc else f"{gpu.name}: compute capability unknown")
    if not gpu.has_bf16:
        print("  no bf16: --dtype bf16 is refused; the default dtype is fp16")
    for name in ("memory_bytes", *GPU_RATE_FIELDS, *GPU_FRACTION_FIELDS):
        print(f"  {name:<18} {getattr(gpu, name):>12g}  {gpu.source(name)}")


def gpus_command(
    name: Annotated[
        str | None, typer.Argument(help="One GPU (a catalog name or alias) to show with its sources.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON document instead of tables.")] = False,
) -> int:
    """List the GPU catalog: memory, compute capability, dense rates, achieved fractions; with NAME, where each
    value comes from (a datasheet, a mechanism, or the device it was calibrated on).

    Example: planner gpus V100-32G
    """
    from store.gpus import get_gpu, gpu_names

    gpus = [get_gpu(name)] if name else [get_gpu(n) for n in gpu_names()]
    if as_json:
        print(json.dumps([gpu_document(g) for g in gpus], indent=2))
    elif name:
        _sources(gpus[0])
    else:
        _table(gpus)
    return 0

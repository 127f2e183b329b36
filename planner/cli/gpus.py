"""``planner gpus``: the GPU catalog, each rate and achieved fraction with where it comes from."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer


def _table(gpus: list[dict[str, Any]]) -> None:
    head = f"{'gpu':<10} {'memory':>9} {'cc':>4} {'bf16':>6} {'fp16':>6} {'fp32':>6} {'HBM':>6} {'PCIe':>6} {'link':>5}"
    print(head + f" {'matmul':>6} {'half':>5} {'hbm':>5} {'pcie':>5} {'floor':>6}")
    for g in gpus:
        r, f = g["rates"], g["fractions"]
        bf16 = f"{r['bf16_tflops']:>6g}" if g["bf16"] else f"{'none':>6}"
        print(
            f"{g['name']:<10} {g['memory_bytes'] / 2**30:>7.1f}Gi {g['compute_capability'] or '?':>4} {bf16} "
            f"{r['fp16_tflops']:>6g} {r['fp32_tflops']:>6g} {r['hbm_gbps']:>6g} {r['pcie_gbps']:>6g} "
            f"{r['interconnect_gbps']:>5g} {f['matmul_efficiency']:>6g} {f['matmul_half_dim']:>5g} "
            f"{f['hbm_efficiency']:>5g} {f['pcie_efficiency']:>5g} {f['kernel_floor_s'] * 1e6:>4g}us"
        )
    print("TF/s dense; GB/s one direction; 'planner gpus NAME' shows where each value comes from (docs/gpus.md).")


def _sources(gpu: dict[str, Any]) -> None:
    cc = gpu["compute_capability"]
    print(f"{gpu['name']}: compute capability {cc}" if cc else f"{gpu['name']}: compute capability unknown")
    if not gpu["bf16"]:
        print("  no bf16: --dtype bf16 is refused; the default dtype is fp16")
    values = {"memory_bytes": gpu["memory_bytes"], **gpu["rates"], **gpu["fractions"]}
    for name, value in values.items():
        print(f"  {name:<18} {value:>12g}  {gpu['sources'].get(name, '')}")


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
    from planner.api import gpu_catalog  # lazy on purpose: 'planner --help' loads typer and nothing else

    gpus = gpu_catalog(name)
    if as_json:
        print(json.dumps(gpus, indent=2))
    elif name:
        _sources(gpus[0])
    else:
        _table(gpus)
    return 0

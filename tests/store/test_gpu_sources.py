"""Every rate and achieved fraction in the GPU catalog says where it comes from, per generation."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields, replace
from typing import Any

import pytest

from store.gpus import GENERATIONS, HOPPER, VOLTA, bf16_refusal, generic_gpu, get_gpu, gpu_names, gpus_without_bf16
from store.records import GPU_FRACTION_FIELDS, GPU_RATE_FIELDS, GPUSpec

# The kinds of ground a source may rest on (docs/gpus.md); a generation's fractions say its name first.
GROUNDS = ("datasheet:", "mechanism:", "published:", "calibrated on ", "assumption:")
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(GPUSpec)}


def _ground(source: str) -> str:
    """The source without its generation's prefix ('volta: published: ...' -> 'published: ...')."""
    for generation in GENERATIONS:
        if source.startswith(f"{generation.name}: "):
            return source[len(generation.name) + 2 :]
    return source


@pytest.mark.parametrize("name", gpu_names())
def test_every_entry_has_a_compute_capability_and_a_source_for_every_rate_and_fraction(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.compute_capability is not None and (5, 0) <= gpu.compute_capability <= (12, 1)
    for field in (*GPU_RATE_FIELDS, *GPU_FRACTION_FIELDS):
        source = gpu.source(field)
        assert source != "not stated", f"{name}.{field} has no source"
        ground = _ground(source)
        assert ground.startswith(GROUNDS) or ground.startswith("NVIDIA"), f"{name}.{field}: {source!r}"
    assert gpu.source("memory_bytes") != "not stated"


def test_a_datasheet_rate_is_the_figure_its_source_names() -> None:
    """The datasheet strings name the number they stand for (read as the catalog holds it)."""
    for name in gpu_names():
        gpu = get_gpu(name)
        for field in GPU_RATE_FIELDS:
            source = gpu.source(field)
            if source.startswith("datasheet:"):
                value = getattr(gpu, field)
                shown = f"{value:,g}" if value < 1000 else f"{value:,.0f}"
                alternatives = {shown, f"{value:g}", f"{value / 1000:g} TB/s", f"{value:.1f}"}
                assert any(a in source for a in alternatives), f"{name}.{field}={value}: {source!r}"


def test_the_v100s_fractions_are_not_the_h100s() -> None:
    v100, h100 = get_gpu("V100-32G"), get_gpu("H100-80G")
    assert v100.matmul_efficiency != h100.matmul_efficiency
    assert v100.hbm_efficiency != h100.hbm_efficiency
    assert v100.pcie_efficiency != h100.pcie_efficiency
    for field in ("matmul_efficiency", "hbm_efficiency", "pcie_efficiency"):
        assert "H100" not in v100.source(field), v100.source(field)  # not set against the H100 records
    # what the V100's rest on: a published GEMM share below Hopper's, HBM2's measured share, PCIe 3.0's line rate
    assert v100.matmul_efficiency < h100.matmul_efficiency
    assert "Markidis" in v100.source("matmul_efficiency") and "Jia" in v100.source("hbm_efficiency")
    assert "PCIe 3.0" in v100.source("pcie_gbps") and "PCIe 5.0" in h100.source("pcie_gbps")
    # achieved host-link rate: PCIe 3.0 x16's pinned copies, 12-13 GB/s
    assert 12.0 <= v100.pcie_gbps * v100.pcie_efficiency <= 13.0


def test_a_carried_value_says_it_is_an_assumption() -> None:
    """Where a generation has nothing of its own the Hopper value is carried, and its source says so."""
    for name in gpu_names():
        gpu = get_gpu(name)
        for field in GPU_FRACTION_FIELDS:
            value, source = getattr(gpu, field), _ground(gpu.source(field))
            hopper_value, _ = getattr(HOPPER, field)
            if not source.startswith("calibrated on ") and value == hopper_value and field != "pcie_efficiency":
                assert source.startswith("assumption:"), f"{name}.{field}: {source!r}"


@pytest.mark.parametrize("name", ["H100-80G", "H200", "A100-80G", "A100-40G"])
def test_hopper_and_a100_fractions_are_unchanged(name: str) -> None:
    """The fractions these entries had before the catalog was split by generation: GPUSpec's defaults."""
    gpu = get_gpu(name)
    for field in GPU_FRACTION_FIELDS:
        assert getattr(gpu, field) == _DEFAULTS[field], field
    assert get_gpu(name).pcie_gbps in (25, 50)


def test_generic_gpu_is_the_a100_with_the_users_memory() -> None:
    gpu = generic_gpu(24 * 2**30)
    a100 = get_gpu("A100-80G")
    assert gpu.compute_capability == a100.compute_capability
    assert all(getattr(gpu, f) == getattr(a100, f) for f in (*GPU_RATE_FIELDS, *GPU_FRACTION_FIELDS))
    assert gpu.source("memory_bytes") == "the user's --gpu-mem"
    assert "A100-80G" in gpu.source("hbm_gbps")


def test_bf16_follows_the_compute_capability() -> None:
    assert set(gpus_without_bf16()) == {"V100-16G", "V100-32G", "T4"}
    for name in gpu_names():
        gpu = get_gpu(name)
        assert gpu.has_bf16 == (gpu.compute_capability is not None and gpu.compute_capability >= (8, 0))
    line = bf16_refusal("V100-32G", (7, 0))
    assert "\n" not in line and "compute capability 7.0" in line and "fp16" in line


def test_sources_take_no_part_in_equality() -> None:
    """Sources are for people: two entries that price the same are the same cache key."""
    gpu = get_gpu("H100-80G")
    assert replace(gpu, sources=()) == gpu and hash(replace(gpu, sources=())) == hash(gpu)
    assert GENERATIONS[0] is HOPPER and VOLTA in GENERATIONS


def test_planner_gpus_lists_the_sources_without_torch() -> None:
    code = (
        "import sys; from planner.cli import main; rc = main(['gpus', 'V100-32G', '--json']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (doc,) = json.loads(done.stdout)
    assert doc["compute_capability"] == "7.0" and doc["bf16"] is False
    assert set(doc["sources"]) >= {*GPU_RATE_FIELDS, *GPU_FRACTION_FIELDS}
    assert doc["fractions"]["matmul_efficiency"] == get_gpu("V100-32G").matmul_efficiency

"""The GPU a cuda probe plans for is the one it runs on, never an 80G GPU at generic (A100) rates by default.

On an H200, ``planner probe --device cuda`` without ``--gpu`` planned for ``generic-80G``: the prediction beside
each measurement then had the A100's rates and the H100's memory (2026-11-26 session, ZeRO-0 step predicted at
0.45 s, measured 0.21 s). ``probe_gpu`` reads the GPU (nvidia-smi, injected here) and takes its catalog entry.
"""

from __future__ import annotations

from planner.job.inputs import JobSpec
from planner.probing.device import PROBE_GPU_MEM, probe_gpu
from store.gpus import get_gpu


def _spec(**fields: object) -> JobSpec:
    return JobSpec(model="opt-125m", **fields)  # type: ignore[arg-type]


def test_an_h200_probe_plans_for_the_h200() -> None:
    notes: list[str] = []
    spec = probe_gpu(_spec(), "cuda", notes.append, detect=lambda: ("NVIDIA H200", 143771 * 2**20))
    assert spec.gpu == "H200" and spec.gpu_mem is None
    assert get_gpu(spec.gpu).hbm_gbps > get_gpu("H100-80G").hbm_gbps  # the H200's own rates, not the H100's
    assert len(notes) == 1 and "H200" in notes[0] and "NVIDIA H200" in notes[0]


def test_an_h100_probe_plans_for_the_h100() -> None:
    spec = probe_gpu(_spec(), "cuda", detect=lambda: ("NVIDIA H100 80GB HBM3", 81559 * 2**20))
    assert spec.gpu == "H100-80G"


def test_a_gpu_outside_the_catalog_keeps_its_memory_and_says_the_rates_are_generic() -> None:
    notes: list[str] = []
    spec = probe_gpu(_spec(), "cuda", notes.append, detect=lambda: ("Imaginary X9", 48 * 2**30))
    assert spec.gpu is None and spec.gpu_mem == str(48 * 2**30)
    assert "not in the GPU catalog" in notes[0] and "generic" in notes[0]


def test_no_nvidia_smi_falls_back_and_says_so() -> None:
    notes: list[str] = []
    spec = probe_gpu(_spec(), "cuda", notes.append, detect=lambda: None)
    assert spec.gpu_mem == PROBE_GPU_MEM["cuda"] and "generic rates" in notes[0]


def test_a_named_gpu_and_the_cpu_backend_are_not_read() -> None:
    def fail() -> tuple[str, int] | None:
        raise AssertionError("the GPU must not be read")

    assert probe_gpu(_spec(gpu="A100-80G"), "cuda", detect=fail).gpu == "A100-80G"
    assert probe_gpu(_spec(gpu_mem="24G"), "cuda", detect=fail).gpu_mem == "24G"
    assert probe_gpu(_spec(), "cpu", detect=fail).gpu_mem == PROBE_GPU_MEM["cpu"]

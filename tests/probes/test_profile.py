"""The profiled step (``MEMPLAN_PROFILE=1``): one more step, not measured, each phase under torch.profiler."""

from __future__ import annotations

import pytest
from tiny_models import tiny_llama_hf_config

from probes.step.profile import PROFILE_ENV, PhaseProfiler, kernel_kind, profile_enabled, union_seconds
from store.measurements import ProbeRequest

LLAMA = {"model_type": "llama", **tiny_llama_hf_config()}


def test_kernels_are_sorted_by_what_they_do() -> None:
    assert kernel_kind("Memcpy HtoD (Pinned -> Device)") == "copy_host_to_device"
    assert kernel_kind("Memcpy DtoH (Device -> Pinned)") == "copy_device_to_host"
    assert kernel_kind("Memcpy DtoD (Device -> Device)") == "copy_device_to_device"
    assert kernel_kind("Memset (Device)") == "memset"
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "collective"
    assert kernel_kind("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>") == "attention"
    assert kernel_kind("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)") == (
        "attention"
    )
    assert kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kernel_kind("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>") == (
        "other"
    )


def test_the_union_of_intervals_counts_overlaps_once() -> None:
    assert union_seconds([]) == 0.0
    assert union_seconds([(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)]) == pytest.approx(25e-6)
    assert union_seconds([(0.0, 100.0), (10.0, 20.0)]) == pytest.approx(100e-6)


def test_profiling_is_asked_for_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert not profile_enabled()
    for value, expected in (("1", True), ("on", True), ("0", False), ("", False)):
        monkeypatch.setenv(PROFILE_ENV, value)
        assert profile_enabled() is expected


def test_a_phase_that_repeats_adds_its_runs_up() -> None:
    import torch

    profiler = PhaseProfiler("cpu")
    for _ in range(2):
        with profiler.phase("forward"):
            torch.ones(64, 64) @ torch.ones(64, 64)
    forward = profiler.phases["forward"]
    assert forward["runs"] == 2 and forward["wall_s"] > 0
    assert any(name == "aten::mm" for name, _, _ in forward["top_host"])


@pytest.mark.slow
def test_a_profiled_probe_measures_the_same_steps_and_profiles_one_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real probe on DeepSpeed's CPU accelerator with MEMPLAN_PROFILE=1: its measured steps are those it
    would measure anyway, and every phase of the extra step has its host operators in ``extra["profile"]``."""
    from probes import run_probe

    monkeypatch.setenv(PROFILE_ENV, "1")
    workload = {"kind": "sft", "model": "tiny", "seq_len": 16, "global_batch": 2, "dtype": "fp32"}
    workload.update(attn_impl="sdpa", hf_configs={"model": LLAMA})
    hardware = {"gpu": "generic-24G", "gpu_memory_bytes": 24 * 2**30, "gpus": 1, "nodes": 1}
    request = ProbeRequest(
        workload, {"zero_stage": 1, "micro_batch": 2}, hardware, device="cpu", steps=3, timeout_s=1800.0
    )
    result = run_probe(request)
    assert result.outcome == "ok", f"{result.message}\n{result.extra.get('traceback', '')}"
    extra = result.extra
    assert extra["warmup_steps"] == 1 and extra["measured_steps"] == 2 and len(extra["step_time_s"]["steps"]) == 2
    profile = extra["profile"]
    assert set(profile) == {"forward", "backward", "optimizer_step"}
    host_ops = {name for name, _, _ in profile["forward"]["top_host"]}
    assert "aten::mm" in host_ops or "aten::addmm" in host_ops or "aten::linear" in host_ops
    assert all(phase["wall_s"] > 0 and phase["host_ops"] > 0 for phase in profile.values())

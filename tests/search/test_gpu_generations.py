"""Generation-specific paths: no bf16 before compute capability 8.0, the sdpa kernel each GPU runs and the
activation bytes that follow it, and H100/A100 predictions unchanged by the per-generation catalog."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields, replace
from typing import Any

import pytest

from planner.job.inputs import JobSpec, resolve
from search import DEFAULT_COEFFICIENTS as COEF
from search import predict
from search.model.activations import activations, layer_saved_tensors
from search.model.kernels import (
    SDPA_EFFICIENT,
    SDPA_MATH,
    attention_impl,
    efficient_lse_padding,
    sdpa_kernel,
    sdpa_kernel_of,
)
from store.errors import InputError
from store.gpus import generic_gpu, get_gpu, gpu_names
from store.models import get_model
from store.records import GPU_FRACTION_FIELDS, GPUSpec, RLHFStrategy, Strategy

OPT = get_model("opt-1.3b")
UNCHANGED = ("H100-80G", "H200", "A100-80G", "A100-40G")
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(GPUSpec)}


def _as_before(gpu: GPUSpec) -> GPUSpec:
    """The entry as the catalog had it before the fractions were split by generation: GPUSpec's defaults."""
    return replace(gpu, **{name: _DEFAULTS[name] for name in GPU_FRACTION_FIELDS})


# --- bf16 ------------------------------------------------------------------------------------------------------


def test_bf16_on_a_v100_is_refused_with_one_line_and_exit_2() -> None:
    args = ["-m", "planner", "recommend", "--model", "opt-1.3b", "--gpu", "V100-32G", "--dtype", "bf16"]
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bf16" in lines[0] and "compute capability 7.0" in lines[0], lines
    assert done.stdout == ""


@pytest.mark.parametrize("gpu", ["V100-16G", "V100-32G", "T4"])
def test_the_default_dtype_without_bf16_is_fp16_and_stated(gpu: str) -> None:
    job = resolve(JobSpec(model="opt-125m", workload="sft", gpu=gpu))
    assert job.workload.dtype == "fp16"
    assert any("fp16" in r and "bf16" in r for r in job.readings)
    with pytest.raises(InputError, match="compute capability"):
        resolve(JobSpec(model="opt-125m", workload="sft", gpu=gpu, dtype="bf16"))


def test_bf16_stays_the_default_from_compute_capability_8() -> None:
    for name in gpu_names():
        if get_gpu(name).has_bf16:
            assert resolve(JobSpec(model="opt-125m", workload="sft", gpu=name)).workload.dtype == "bf16"


# --- sdpa kernels ----------------------------------------------------------------------------------------------


def test_sdpa_kernel_per_compute_capability_and_dtype() -> None:
    v100, t4, a100, h100, a10 = ((7, 0), (7, 5), (8, 0), (9, 0), (8, 6))
    assert sdpa_kernel(v100, "fp16", 64) == "efficient"  # no flash before sm80
    assert sdpa_kernel(t4, "fp16", 64) == "efficient"
    assert sdpa_kernel(v100, "fp32", 64) == "efficient"
    assert sdpa_kernel(v100, "bf16", 64) == "math"  # no memory-efficient bf16 before sm80 (bf16 is refused anyway)
    for cc in (a100, h100, a10):
        assert sdpa_kernel(cc, "bf16", 128) == "flash" and sdpa_kernel(cc, "fp16", 64) == "flash"
        assert sdpa_kernel(cc, "fp32", 64) == "efficient"  # fp32: no flash on any GPU
        assert sdpa_kernel(cc, "bf16", 64, masked=True) == "efficient"  # an explicit mask: no flash
    assert sdpa_kernel(a10, "bf16", 256) == "efficient"  # sm86-89 flash backward refuses head_dim > 192
    assert sdpa_kernel(h100, "bf16", 256) == "flash"
    assert sdpa_kernel((6, 0), "fp16", 60) == "math"  # not a multiple of the GEMM alignment
    assert sdpa_kernel((4, 0), "fp32", 64) == "math"  # below sm50: no fused kernel
    assert sdpa_kernel(None, "bf16", 64) == "flash"  # unknown GPU: taken as a current one


def test_v100_fp16_reads_the_memory_efficient_path_and_fp32_the_non_flash_one() -> None:
    v100 = get_gpu("V100-32G")
    impl = attention_impl("sdpa", "fp16", v100.compute_capability, OPT.head_dim)
    assert impl == SDPA_EFFICIENT and sdpa_kernel_of(impl, "fp16", OPT.head_dim) == "efficient"
    fp32 = attention_impl("sdpa", "fp32", v100.compute_capability, OPT.head_dim)
    assert sdpa_kernel_of(fp32, "fp32", OPT.head_dim) == "efficient"  # what the fp32 sdpa terms were traced with
    h100 = get_gpu("H100-80G")
    assert sdpa_kernel_of(attention_impl("sdpa", "fp32", h100.compute_capability, 64), "fp32", 64) == "efficient"
    assert attention_impl("eager", "fp16", v100.compute_capability, 64) == "eager"


def test_the_memory_efficient_kernels_padded_log_sum_exp_follows_into_the_activations() -> None:
    """The flash kernel saves b x heads x s fp32 log-sum-exp values, the memory-efficient one pads s to 32 rows:
    the V100's activations grow by exactly that per layer off multiples of 32, and not at them."""
    impl = attention_impl("sdpa", "fp16", get_gpu("V100-32G").compute_capability, OPT.head_dim)
    for seq_len in (500, 512):
        flash = activations(OPT, 4, seq_len, "fp16", "sdpa", False, COEF)
        efficient = activations(OPT, 4, seq_len, "fp16", impl, False, COEF)
        padded = -(-seq_len // 32) * 32
        pad = 4 * 4 * OPT.num_heads * (padded - seq_len)
        assert efficient_lse_padding(OPT, 4, seq_len, "fp16", impl) == pad
        assert efficient.saved - flash.saved == OPT.num_layers * pad
        assert sum(layer_saved_tensors(OPT, 4, seq_len, "fp16", impl, COEF)) - flash.layer == pad
    # checkpointed layers keep their inputs only
    ckpt = activations(OPT, 4, 500, "fp16", impl, True, COEF)
    assert ckpt.saved == activations(OPT, 4, 500, "fp16", "sdpa", True, COEF).saved


def test_the_math_path_materialises_the_scores() -> None:
    """sdpa's math path keeps the fp32 softmax over b x heads x s x s; the fused kernels keep none of it."""
    b, s = 2, 512
    fused = activations(OPT, b, s, "fp16", "sdpa", False, COEF)
    math = activations(OPT, b, s, "fp16", SDPA_MATH, False, COEF)
    scores = b * OPT.num_heads * s * s
    assert math.saved - fused.saved >= OPT.num_layers * 4 * scores
    assert math.layer > fused.layer


# --- H100 and A100 unchanged -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", UNCHANGED)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_hopper_and_a100_read_the_traced_sdpa_kernel(name: str, dtype: str) -> None:
    cc = get_gpu(name).compute_capability
    for head_dim in (64, 80, 128):
        assert attention_impl("sdpa", dtype, cc, head_dim) == "sdpa"
    assert attention_impl("sdpa", dtype, generic_gpu(24 * 2**30).compute_capability, 128) == "sdpa"


@pytest.mark.parametrize("gpu", [*UNCHANGED, "generic"])
@pytest.mark.parametrize("kind", ["sft", "ppo"])
def test_hopper_and_a100_predictions_are_unchanged(gpu: str, kind: str) -> None:
    """The prediction with the catalog entry as it is now equals the one with the entry as it was (every
    fraction at GPUSpec's defaults, which every GPU had before): the per-generation catalog moves no H100, H200,
    A100 or generic (A100 rates) prediction."""
    sft = kind == "sft"
    spec = JobSpec(
        model="opt-1.3b",
        workload=kind,
        gpu=None if gpu == "generic" else gpu,
        gpu_mem="80G" if gpu == "generic" else None,
        seq_len=512 if sft else None,
        batch=None if sft else 4,
    )
    job = resolve(spec)
    strategy: Strategy | RLHFStrategy
    if sft:
        strategy = Strategy.from_dict({"zero_stage": 2, "micro_batch": 4, "grad_accum": 1})
    else:
        trained = {"zero_stage": 2, "gradient_checkpointing": True}
        strategy = RLHFStrategy.from_dict(
            {
                "actor": trained,
                "critic": trained,
                "hybrid_engine": True,
                "generation_batch": 4,
                "micro_batch": 4,
                "grad_accum": 1,
            }  # fmt: skip
        )
    before = replace(job.hardware, gpu=_as_before(job.hardware.gpu))
    assert predict(job.workload, strategy, job.hardware, COEF) == predict(job.workload, strategy, before, COEF)


def test_the_v100_prediction_moved_with_its_own_fractions() -> None:
    """On a V100 the carried Hopper fractions are gone: its fp16 GEMMs reach a smaller share of the peak, so the
    same step takes longer than it did with them (direction from the mechanism, no number fitted)."""
    job = resolve(JobSpec(model="opt-1.3b", workload="sft", gpu="V100-32G", seq_len=512))
    strategy = Strategy.from_dict({"zero_stage": 2, "micro_batch": 4, "grad_accum": 1})
    now = predict(job.workload, strategy, job.hardware, COEF)
    before = predict(job.workload, strategy, replace(job.hardware, gpu=_as_before(job.hardware.gpu)), COEF)
    assert now.step_time_s > before.step_time_s
    assert now.peak_allocated_bytes == before.peak_allocated_bytes  # fractions are time, not memory


def test_host_s_per_kernel_says_it_is_the_hosts_figure() -> None:
    reason = next(f.metadata["reason"] for f in fields(COEF) if f.name == "host_s_per_kernel")
    assert "host CPU's figure, not the GPU's" in reason and "H100 host" in reason


def test_a_v100_plan_carries_the_kernel_sdpa_runs_there() -> None:
    """The predicted step of a V100 job reads the memory-efficient kernel's padded log-sum-exp (the activations
    above); the same job on a GPU that runs flash does not: the plan follows the GPU, not the trace's kernel."""
    v100 = get_gpu("V100-32G")
    as_ampere = replace(v100, compute_capability=(8, 0))
    strategy = Strategy(zero_stage=2, micro_batch=4, grad_accum=1)
    peaks = {}
    job = resolve(JobSpec(model="opt-1.3b", workload="sft", gpu="V100-32G", batch=4, seq_len=500))
    for gpu in (v100, as_ampere):
        peaks[gpu.compute_capability] = predict(job.workload, strategy, replace(job.hardware, gpu=gpu), COEF)
    pad = efficient_lse_padding(OPT, 4, 500, "fp16", attention_impl("sdpa", "fp16", v100.compute_capability, 64))
    assert pad > 0
    forward = {cc: next(p for p in prediction.phases if p.name == "forward") for cc, prediction in peaks.items()}
    grown = forward[v100.compute_capability].peak_allocated_bytes - forward[(8, 0)].peak_allocated_bytes
    assert grown == OPT.num_layers * pad  # every layer's saved padding is live at the forward's peak


def test_flash_attention_2_on_a_volta_is_refused_and_a_frameworks_default_falls_back() -> None:
    """FlashAttention-2 runs from compute capability 8.0: asked for on a V100 it is one line and exit 2; as
    OpenRLHF's own default it is planned with sdpa, and the plan says why."""
    done = subprocess.run(
        [sys.executable, "-m", "planner", "recommend", "--model", "opt-1.3b", "--gpu", "V100-32G",
         "--workload", "sft", "--attn-impl", "flash_attention_2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "flash_attention_2" in done.stderr and "8.0" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    job = resolve(JobSpec(model="opt-1.3b", workload="ppo", gpu="V100-32G", framework="openrlhf"))
    assert job.workload.attn_impl == "sdpa"
    assert any("cannot run flash_attention_2" in line for line in job.readings)
    assert resolve(
        JobSpec(model="opt-1.3b", workload="ppo", gpu="A100-80G", framework="openrlhf")
    ).workload.attn_impl == ("flash_attention_2")

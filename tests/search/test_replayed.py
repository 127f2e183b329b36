"""A step's stream replayed through the allocator port (search.step.replayed): reserved per phase and the
cost of empty_cache, from the allocator's rules."""

from __future__ import annotations

from search.coefficients import Coefficients
from search.single.predict import single_step
from search.step.replayed import replay_step
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

COEF = Coefficients()


def _step(zero_stage: int = 2, grad_accum: int = 2) -> object:
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)
    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=256, global_batch=2 * grad_accum)
    return single_step(workload, Strategy(zero_stage=zero_stage, micro_batch=2, grad_accum=grad_accum), hardware, COEF)


def test_every_phase_reserves_at_least_what_it_allocates() -> None:
    """The allocator rounds and caches: reserved >= allocated (rounded) >= the cost model's live bytes."""
    for stage in (0, 1, 2, 3):
        step = _step(stage)
        replayed = replay_step(step, "never", "default", COEF)
        for phase, r in zip(step.phases, replayed.phases, strict=True):  # type: ignore[attr-defined]
            assert r.reserved >= r.allocated >= step.resident_bytes + phase.live  # type: ignore[attr-defined]


def test_never_emptying_the_cache_costs_nothing_in_a_steady_step() -> None:
    """Without empty_cache the measured (second) step reuses the first step's segments: no cudaMalloc, no
    cudaFree, so the policy costs no time; after every phase the calls release segments and the step maps
    them again, and that costs the calls, the cudaFrees and the cudaMallocs the replay counts."""
    step = _step()
    never = replay_step(step, "never", "default", COEF)
    assert sum(p.cuda_mallocs + p.cuda_frees for p in never.phases) == 0
    assert never.cache_seconds == 0.0
    each = replay_step(step, "after-phase", "default", COEF)
    frees = sum(p.cuda_frees for p in each.phases)
    mallocs = sum(p.cuda_mallocs for p in each.phases)
    assert frees > 0 and mallocs > 0
    runs = 2 * 2 + 1  # forward and backward per micro-step, then the optimizer step
    expected = runs * COEF.empty_cache_call_s + frees * COEF.cuda_free_s + mallocs * COEF.cuda_malloc_s
    assert abs(each.cache_seconds - expected) < 1e-12


def test_emptying_the_cache_never_raises_the_peak() -> None:
    """Releasing cached segments after every phase leaves each phase at most what it reserved without."""
    step = _step(0)
    never = replay_step(step, "never", "default", COEF)
    each = replay_step(step, "after-phase", "default", COEF)
    assert max(p.reserved for p in each.phases) <= max(p.reserved for p in never.phases)


def test_a_device_too_small_for_the_cache_makes_the_allocator_retry_then_run_out() -> None:
    """torch frees its cache and retries a failed cudaMalloc (CUDACachingAllocator.cpp ``malloc``): on some
    device between the step's allocated and reserved peaks the replay retries and fits (not on every one:
    which blocks the retry can free depends on where the live tensors sit); below the allocated peak it
    runs out, and the report names the phase."""
    step = _step(3)
    free = replay_step(step, "never", "default", COEF)
    allocated = max(p.allocated for p in free.phases)
    reserved = max(p.reserved for p in free.phases)
    assert reserved > allocated + 4 * 2**20  # room for a device in between
    between = [allocated + (reserved - allocated) * share // 50 + 2**21 for share in range(50)]
    tried = [(device, replay_step(step, "never", "default", COEF, device_bytes=device)) for device in between]
    fitting = [(d, r) for d, r in tried if r.oom_phase == "" and sum(p.alloc_retries for p in r.phases)]
    assert fitting, [(d, r.oom_phase) for d, r in tried]
    device, squeezed = fitting[0]
    assert max(p.reserved for p in squeezed.phases) <= device
    assert sum(p.alloc_retries for p in squeezed.phases) >= 1  # every step, once the cache fills the device
    frees = sum(p.cuda_frees for p in squeezed.phases)
    assert frees > 0 and squeezed.cache_seconds >= frees * COEF.cuda_free_s  # the retries' cudaFrees cost time
    small = replay_step(step, "never", "default", COEF, device_bytes=allocated // 2)
    assert small.oom_phase in ("setup", "forward", "backward", "optimizer_step")
    assert small.to_dict()["oom_phase"] == small.oom_phase

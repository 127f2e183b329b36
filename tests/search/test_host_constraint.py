"""Host memory is a hard constraint on every search path: a plan over ``--cpu-mem`` is never chosen.

Each case first finds the plan chosen with plenty of host memory (an offload plan), then gives the host one
byte less than that plan needs: every path must choose another plan within the host budget, and the first
plan, which still fits the GPU, must be predicted not to fit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from search import DEFAULT_COEFFICIENTS as COEF
from search import screen
from search.choose.candidates import Candidate, SearchResult
from search.choose.rlhf_search import exhaustive_rlhf, search_rlhf
from search.choose.single_search import exhaustive_single, search_single
from store.gpus import generic_gpu
from store.models import get_model
from store.records import Hardware, RLHFStrategy, Strategy, Workload

GiB = 2**30


def _hw(gpu_gib: int, gpus: int) -> Hardware:
    spec = generic_gpu(gpu_gib * GiB)
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=gpus, cpu_memory_bytes=1024 * GiB)


def _offloads(strategy: Strategy | RLHFStrategy) -> bool:
    if isinstance(strategy, Strategy):
        return strategy.offload_optimizer != "none"
    trained = [strategy.actor] + ([strategy.critic] if strategy.critic else [])
    return any(m.offload_optimizer != "none" for m in trained) or "cpu" in (
        strategy.reference.offload,
        strategy.reward.offload,
    )


def _within_host(result: SearchResult | Candidate | None, hardware: Hardware) -> Candidate:
    """The chosen plan fits host memory, and every candidate marked fitting does too."""
    if isinstance(result, SearchResult):
        for candidate in result.ranked:
            assert not candidate.prediction.fits or candidate.prediction.host_bytes <= hardware.cpu_memory_bytes
        result = result.best
    assert result is not None
    assert result.prediction.fits
    assert result.prediction.host_bytes <= hardware.cpu_memory_bytes == result.prediction.host_budget_bytes
    return result


# --- single model: qwen3-0.6b on 4 x 6 GiB. With plenty of host memory, ZeRO-1 with the optimizer on the host
# runs 8 samples per GPU at once; without it, only ZeRO-3 fits the GPUs, and its per-module hooks cost more time.
SINGLE = Workload(kind="sft", model=get_model("qwen3-0.6b"), seq_len=512, global_batch=32)
SINGLE_HW = _hw(6, 4)


@pytest.fixture(scope="module")
def single_roomy() -> Candidate:
    best = search_single(SINGLE, SINGLE_HW, COEF).best
    assert best is not None and _offloads(best.strategy)
    return best


@pytest.mark.parametrize("path", ["grid", "tpe", "exhaustive"])
def test_single_model_search_rejects_plans_over_the_host_budget(single_roomy: Candidate, path: str) -> None:
    tight = replace(SINGLE_HW, cpu_memory_bytes=single_roomy.prediction.host_bytes - 1)
    rejected = screen(SINGLE, single_roomy.strategy, tight)
    assert rejected.fits_gpu and not rejected.fits_host and not rejected.fits
    if path == "exhaustive":
        chosen = _within_host(exhaustive_single(SINGLE, tight, COEF), tight)
    else:
        chosen = _within_host(search_single(SINGLE, tight, COEF, sampler=path), tight)
    assert chosen.strategy != single_roomy.strategy
    if path != "tpe":  # the exact paths find the fastest plan that fits: no offload, slower than the rejected one
        assert not _offloads(chosen.strategy)
        assert chosen.prediction.step_time_s > single_roomy.prediction.step_time_s


# --- RLHF: remax with opt-350m on one 4 GiB GPU. With plenty of host memory the actor's optimizer (ZeRO-1)
# and the reference go to the host; one byte less and the exact paths keep the reference on the GPU (the
# actor moves to ZeRO-3 to make room, its optimizer still on the host): slower, within the budget.
RLHF = Workload(kind="remax", model=get_model("opt-350m"), seq_len=256, global_batch=4, prompt_len=128, gen_len=128)
RLHF_HW = _hw(4, 1)


@pytest.fixture(scope="module")
def rlhf_roomy() -> Candidate:
    best = search_rlhf(RLHF, RLHF_HW, COEF).best
    assert best is not None and _offloads(best.strategy)
    return best


@pytest.mark.parametrize("path", ["grid", "bound", "tpe", "exhaustive"])
def test_rlhf_search_rejects_plans_over_the_host_budget(rlhf_roomy: Candidate, path: str) -> None:
    tight = replace(RLHF_HW, cpu_memory_bytes=rlhf_roomy.prediction.host_bytes - 1)
    rejected = screen(RLHF, rlhf_roomy.strategy, tight)
    assert rejected.fits_gpu and not rejected.fits_host and not rejected.fits
    if path == "exhaustive":
        chosen = _within_host(exhaustive_rlhf(RLHF, tight, COEF), tight)
    else:
        chosen = _within_host(search_rlhf(RLHF, tight, COEF, sampler=path, n_trials=24), tight)
    assert chosen.strategy != rlhf_roomy.strategy
    if path != "tpe":  # grid, the bound walk and the exhaustive walk are exact: the same plan
        exact = exhaustive_rlhf(RLHF, tight, COEF)
        assert exact is not None and chosen.strategy == exact.strategy
        assert chosen.prediction.step_time_s > rlhf_roomy.prediction.step_time_s

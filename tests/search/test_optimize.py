"""The Optuna search finds the optimum that exhaustive enumeration of the whole space finds (both ranking by the
screen, the fragment coefficients; tests/search/test_confirm.py checks the answer the replay confirms)."""

from __future__ import annotations

import pytest

from search import DEFAULT_COEFFICIENTS, exhaustive, screen_search, search
from store.gpus import generic_gpu, get_gpu
from store.models import get_model
from store.records import Hardware, Workload

GiB = 2**30

CASES = [
    # (model, workload, gpu, gpu memory GiB or None, gpus, nodes, global batch, seq len, host GiB)
    ("opt-1.3b", "sft", None, 24, 1, 1, 8, 512, 64),
    ("opt-1.3b", "sft", None, 24, 1, 1, 8, 512, 24),
    ("gpt2-medium", "reward", "RTX-4090", None, 1, 1, 16, 1024, 64),
    ("qwen2.5-0.5b", "dpo", "L4", None, 1, 1, 8, 1024, 32),
    ("llama-3.2-1b", "sft", "A100-40G", None, 4, 1, 32, 2048, 256),
    ("llama-3.1-8b", "sft", "H100-80G", None, 8, 1, 64, 4096, 1024),
    ("opt-6.7b", "sft", "A10", None, 8, 2, 64, 512, 512),
    ("mistral-7b", "dpo", "A100-80G", None, 8, 1, 32, 1024, 512),
    ("opt-13b", "sft", "V100-32G", None, 8, 1, 16, 512, 256),
]


def _job(case: tuple) -> tuple[Workload, Hardware]:
    model, kind, gpu_name, mem, gpus, nodes, batch, seq, host = case
    gpu = get_gpu(gpu_name) if gpu_name else generic_gpu(mem * GiB)
    hardware = Hardware(gpu=gpu, gpu_memory_bytes=gpu.memory_bytes, gpus=gpus, nodes=nodes, cpu_memory_bytes=host * GiB)
    dtype = "fp16" if gpu.name.startswith("V100") else "bf16"
    return Workload(kind=kind, model=get_model(model), seq_len=seq, global_batch=batch, dtype=dtype), hardware


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2] or c[3]}x{c[4]}x{c[5]}")
@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_search_finds_exhaustive_optimum(case: tuple, sampler: str) -> None:
    workload, hardware = _job(case)
    expected = exhaustive(workload, hardware, DEFAULT_COEFFICIENTS)
    found = screen_search(workload, hardware, DEFAULT_COEFFICIENTS, sampler=sampler).best
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert found.prediction.step_time_s == pytest.approx(expected.prediction.step_time_s, rel=1e-12)
    assert found.prediction.fits


def test_spread_has_feasible_and_infeasible_cases() -> None:
    """The spread above means something only if it holds both outcomes and several winning layouts."""
    winners = [exhaustive(*_job(case), DEFAULT_COEFFICIENTS) for case in CASES]
    assert any(w is None for w in winners) and sum(w is not None for w in winners) >= 5
    layouts = {(w.strategy.zero_stage, w.strategy.offload_optimizer) for w in winners if w}
    assert len(layouts) >= 3


def test_search_is_deterministic() -> None:
    workload, hardware = _job(CASES[4])
    first = search(workload, hardware, DEFAULT_COEFFICIENTS, sampler="tpe", seed=3)
    second = search(workload, hardware, DEFAULT_COEFFICIENTS, sampler="tpe", seed=3)
    assert [c.strategy for c in first.ranked] == [c.strategy for c in second.ranked]


def test_every_ranked_candidate_keeps_the_global_batch() -> None:
    workload, hardware = _job(CASES[4])
    for candidate in search(workload, hardware, DEFAULT_COEFFICIENTS).ranked:
        s = candidate.strategy
        assert s.micro_batch * s.grad_accum * hardware.world_size == workload.global_batch


def test_feasible_ranking_is_by_step_time() -> None:
    workload, hardware = _job(CASES[0])
    times = [c.prediction.step_time_s for c in search(workload, hardware, DEFAULT_COEFFICIENTS).feasible]
    assert times == sorted(times)

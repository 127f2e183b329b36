"""The RLHF search finds what walking the whole space finds; its shortcuts (exact inner resolution by
branch and bound, per-model bounds of whole points) never cut off a better strategy."""

from __future__ import annotations

import itertools

import pytest

from search import (
    DEFAULT_COEFFICIENTS,
    exhaustive,
    exhaustive_rlhf,
    predict,
    screen_rlhf,
    screen_search,
    search_rlhf,
)
from search.choose.candidates import Candidate
from search.choose.rlhf_search import best_inner_rlhf
from search.choose.rlhf_space import (
    batch_choices,
    cache_choices,
    rlhf_outer_points,
    rlhf_strategy_at,
    role_bytes,
    role_live_floor,
    role_seconds,
    shared_bytes,
    shared_seconds,
)
from search.rlhf.job import rlhf_context
from search.rlhf.predict import rlhf_step
from search.rlhf.step import reserved_floor, step_halves
from store.gpus import generic_gpu, get_gpu
from store.models import get_model as catalog_model
from store.models import with_layers
from store.records import Hardware, ModelSpec, Workload

GiB = 2**30
C = DEFAULT_COEFFICIENTS
DS = ("hybrid-engine",)  # DeepSpeed's own generation: rollout engines have their own tests (test_rollout_search.py)

CASES = {
    # DeepSpeed-Chat's OPT-1.3b actor with OPT-350m critic and reward model on one 24 GB GPU
    "opt-1.3b-ppo-24G": ("ppo", "opt-1.3b", "opt-350m", None, 24, 1, 8, 1, 64),
    "opt-125m-grpo-16G": ("grpo", "opt-125m", None, None, 16, 1, 4, 4, 32),
    "opt-1.3b-ppo-2xRTX-4090": ("ppo", "opt-1.3b", "opt-350m", "RTX-4090", None, 2, 8, 1, 64),
    "opt-1.3b-remax-2xL4": ("remax", "opt-1.3b", "opt-350m", "L4", None, 2, 8, 1, 32),
}


def _job(name: str, layers: int | None = None) -> tuple[Workload, Hardware]:
    """A case's job; with ``layers``, its models cut to that many decoder layers."""
    kind, actor, small, gpu_name, mem, gpus, batch, samples, host = CASES[name]

    def get_model(model: str) -> ModelSpec:
        return catalog_model(model) if layers is None else with_layers(catalog_model(model), layers)

    gpu = get_gpu(gpu_name) if gpu_name else generic_gpu(mem * GiB)
    hardware = Hardware(gpu=gpu, gpu_memory_bytes=gpu.memory_bytes, gpus=gpus, cpu_memory_bytes=host * GiB)
    workload = Workload(
        kind=kind,
        model=get_model(actor),
        seq_len=512,
        global_batch=batch,
        prompt_len=256,
        gen_len=256,
        critic_model=get_model(small) if small and kind == "ppo" else None,
        reward_model=get_model(small) if small else None,
        samples_per_prompt=samples,
    )
    return workload, hardware


@pytest.fixture(scope="module")
def optima() -> dict[str, Candidate | None]:
    return {name: exhaustive_rlhf(*_job(name), C, rollouts=DS) for name in CASES}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("sampler", ["auto", "bound"])
def test_search_finds_the_exhaustive_optimum(name: str, sampler: str, optima: dict[str, Candidate | None]) -> None:
    workload, hardware = _job(name)
    expected = optima[name]
    found = search_rlhf(workload, hardware, C, sampler=sampler, rollouts=DS).best
    if expected is None:
        assert found is None
        return
    assert found is not None and found.prediction.fits
    assert found.prediction.step_time_s == expected.prediction.step_time_s
    assert found.strategy == expected.strategy


def test_the_spread_means_something(optima: dict[str, Candidate | None]) -> None:
    """Every case fits somewhere, and the winners differ in layout (not one answer for all)."""
    winners = list(optima.values())
    assert all(w is not None for w in winners)
    layouts = {(w.strategy.actor, w.strategy.critic, w.strategy.reference, w.strategy.reward) for w in winners}
    assert len(layouts) >= 3


def test_search_is_deterministic_with_a_seed() -> None:
    workload, hardware = _job("opt-1.3b-ppo-2xRTX-4090")
    for sampler in ("auto", "tpe"):
        first = search_rlhf(workload, hardware, C, seed=7, sampler=sampler, n_trials=24, rollouts=DS)
        second = search_rlhf(workload, hardware, C, seed=7, sampler=sampler, n_trials=24, rollouts=DS)
        assert [c.strategy for c in first.ranked] == [c.strategy for c in second.ranked]
        assert first.sampler == ("bound" if sampler == "auto" else "tpe")


def test_generic_entry_points_route_rlhf_workloads(optima: dict[str, Candidate | None]) -> None:
    workload, hardware = _job("opt-125m-grpo-16G")
    assert (
        screen_search(workload, hardware, C, rollouts=DS).best == search_rlhf(workload, hardware, C, rollouts=DS).best
    )
    assert exhaustive(workload, hardware, C, rollouts=DS) == optima["opt-125m-grpo-16G"]


def test_ranked_candidates_keep_every_batch_exact_and_fastest_first() -> None:
    workload, hardware = _job("opt-1.3b-ppo-24G")
    result = search_rlhf(workload, hardware, C, rollouts=DS)
    prompts = workload.global_batch // hardware.world_size
    for candidate in result.ranked:
        s = candidate.strategy
        assert prompts % s.generation_batch == 0
        assert s.micro_batch * s.grad_accum == prompts * workload.samples_per_prompt
        assert candidate.prediction == screen_rlhf(workload, s, hardware, C)
    times = [c.prediction.step_time_s for c in result.feasible]
    assert times == sorted(times) and len(times) >= 2
    fastest = result.fastest_ignoring_memory
    assert fastest is not None and fastest.prediction.step_time_s <= times[0]


def test_inner_resolution_equals_trying_every_inner_choice() -> None:
    """best_inner_rlhf's branch and bound returns the first strategy of least score in enumeration order."""
    for name in ("opt-1.3b-ppo-24G", "opt-125m-grpo-16G"):
        workload, hardware = _job(name)
        points = list(rlhf_outer_points(workload, hardware))
        for point in points[:: max(1, len(points) // 24)]:
            brute = min(
                (
                    Candidate(s, screen_rlhf(workload, s, hardware, C))
                    for s in (
                        rlhf_strategy_at(point, batches, cache)
                        for batches in batch_choices(workload, hardware)
                        for cache in cache_choices()
                    )
                ),
                key=lambda c: c.score,
            )
            found = best_inner_rlhf(point, workload, hardware, C)
            assert (found.score, found.strategy) == (brute.score, brute.strategy)


def test_per_model_pieces_bound_whole_points() -> None:
    """What the bound walk adds up per model is what the step holds: exact time and resident bytes, and a
    memory floor no policy or allocator goes under, in the replay as in the screen (issue 42: the walk prunes a
    point on it, so it must be a lower bound of the replay's peak reserved, not the screen's). The job's models
    are cut to two layers: the same points and batch splits, a tenth of the allocator events to replay."""
    workload, hardware = _job("opt-1.3b-ppo-2xRTX-4090", layers=2)
    ctx = rlhf_context(workload, hardware, C)
    points = list(rlhf_outer_points(workload, hardware))
    replayed = 0
    policies = list(cache_choices())
    pairs = itertools.product(points[::397], batch_choices(workload, hardware))
    for pair_index, (point, batches) in enumerate(pairs):
        strategy = rlhf_strategy_at(point, batches)
        step = rlhf_step(workload, strategy, hardware, C)
        roles = [("actor", point.actor), ("critic", point.critic), ("reference", point.reference)]
        roles.append(("reward", point.reward))
        seconds = shared_seconds(ctx, batches) + sum(
            role_seconds(ctx, role, block, point.hybrid_engine, False, batches) for role, block in roles
        )
        assert seconds == pytest.approx(step.base_time_s, rel=1e-12)
        assert shared_bytes(ctx) + sum(role_bytes(ctx, role, block)[0] for role, block in roles) == step.resident_bytes
        models, inference, training = step_halves(ctx, strategy)
        floor = reserved_floor(models, (inference, training), C, workload.dtype)
        own = max(role_live_floor(ctx, role, block, point.hybrid_engine, batches) for role, block in roles)
        assert step.resident_bytes + own <= floor
        for n, (policy, allocator) in enumerate(policies):
            variant = strategy.with_(empty_cache=policy, allocator=allocator)
            assert screen_rlhf(workload, variant, hardware, C).peak_reserved_bytes >= floor
            # one policy in ten replayed, a different one at each (point, batches), so that every policy is
            # replayed at about ten points (a replay costs a screen's hundredfold: all 540 took 130 CPU s)
            if n == pair_index % len(policies):
                replayed += 1
                assert predict(workload, variant, hardware, C).peak_reserved_bytes >= step.resident_bytes + own
    assert replayed >= 100


def test_ppo_search_is_fast() -> None:
    """``planner recommend`` for PPO stays interactive because the bound walk resolves few of the outer points
    (20 of 2,048 here); counted in points, not seconds, so a busy machine cannot fail it
    (``benchmarks/latency.py`` times the command)."""
    workload, hardware = _job("opt-1.3b-ppo-24G")
    points = len(list(rlhf_outer_points(workload, hardware)))
    result = search_rlhf(workload, hardware, C, rollouts=DS)
    assert result.sampler == "bound"
    assert result.trials <= points // 50
    assert result.best is not None

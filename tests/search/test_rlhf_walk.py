"""The RLHF bound walk (search.choose.rlhf_walk): its bounds never exceed a point's score, the best and the
alternatives it ranks are those of walking every point, and a search asked for no closest plan stops early."""

from __future__ import annotations

import pytest
from small_jobs import grpo_opt125m

from search import DEFAULT_COEFFICIENTS, search_rlhf
from search.choose.candidates import INFEASIBLE_PENALTY_S, Candidate
from search.choose.engine_inner import engine_bound
from search.choose.rlhf_search import best_inner_rlhf
from search.choose.rlhf_space import rlhf_outer_points
from search.choose.rlhf_tpe import rlhf_key
from search.choose.rlhf_walk import RLHF_ALTERNATIVES, point_bounds
from search.choose.rollout_space import preference, searched_generations
from store.gpus import generic_gpu
from store.models import get_model
from store.records import Hardware, Workload

C = DEFAULT_COEFFICIENTS
GiB = 2**30


def _ppo_24g() -> tuple[Workload, Hardware]:
    """``planner recommend --model opt-1.3b --gpu-mem 24G``'s job (its host memory fixed)."""
    gpu = generic_gpu(24 * GiB)
    hardware = Hardware(gpu=gpu, gpu_memory_bytes=gpu.memory_bytes, gpus=1, cpu_memory_bytes=23 * GiB)
    workload = Workload(
        kind="ppo", model=get_model("opt-1.3b"), seq_len=512, global_batch=8, prompt_len=256, gen_len=256,
        critic_model=get_model("opt-350m"), reward_model=get_model("opt-350m"),
    )  # fmt: skip
    return workload, hardware


@pytest.fixture(scope="module")
def every_point() -> list[tuple[float, Candidate]]:
    """Every outer point of the GRPO job resolved, with its bound from per-model pieces, in the search's order."""
    workload, hardware = grpo_opt125m()
    points = list(rlhf_outer_points(workload, hardware, (0,), searched_generations(workload, hardware)))
    bounds = point_bounds(workload, hardware, C, points)
    return [(bound, best_inner_rlhf(p, workload, hardware, C)) for bound, p in zip(bounds, points, strict=True)]


def test_the_bounds_never_exceed_the_score(every_point: list[tuple[float, Candidate]]) -> None:
    workload, hardware = grpo_opt125m()
    points = list(rlhf_outer_points(workload, hardware, (0,), searched_generations(workload, hardware)))
    for point, (bound, candidate) in zip(points, every_point, strict=True):
        assert bound <= candidate.score
        if point.rollout is not None:
            assert engine_bound(point, workload, hardware, C) <= candidate.score


def _fitting_in_order(every_point: list[tuple[float, Candidate]]) -> list[Candidate]:
    indexed = list(enumerate(c for _, c in every_point))
    return [c for _, c in sorted(indexed, key=lambda ic: (*preference(ic[1]), ic[0])) if c.prediction.fits]


def test_the_best_and_the_alternatives_are_those_of_every_point(every_point: list[tuple[float, Candidate]]) -> None:
    """The bound walk ranks the ``RLHF_ALTERNATIVES`` best fitting points (the best among them) exactly."""
    workload, hardware = grpo_opt125m()
    whole = _fitting_in_order(every_point)
    found = search_rlhf(workload, hardware, C).feasible
    assert len(whole) >= RLHF_ALTERNATIVES
    assert found[:RLHF_ALTERNATIVES] == tuple(whole[:RLHF_ALTERNATIVES])


@pytest.mark.parametrize("alternatives", [0, 8])
def test_asked_for_more_alternatives_the_walk_ranks_that_many_exactly(
    every_point: list[tuple[float, Candidate]], alternatives: int
) -> None:
    """``recommend --top N`` passes N: the best and N alternatives are those of walking every point, and fewer
    asked for resolve no more points than the default."""
    workload, hardware = grpo_opt125m()
    whole = _fitting_in_order(every_point)
    result = search_rlhf(workload, hardware, C, alternatives=alternatives)
    assert len(whole) > alternatives + 1
    assert result.feasible[: alternatives + 1] == tuple(whole[: alternatives + 1])
    default = search_rlhf(workload, hardware, C)
    assert (result.trials <= default.trials) if alternatives < RLHF_ALTERNATIVES else (result.trials >= default.trials)


def test_the_engine_points_resolved_for_the_default_recommend_stay_few() -> None:
    """The LoRA search of ``recommend``'s default PPO job: once the alternatives fit, engine points whose pairs
    cannot reach them are passed over (vLLM and SGLang tie in time, the per-model bound is loose across
    splits): 36 points of 4,096 (162 without), counted in points so a busy machine cannot fail it."""
    workload, hardware = _ppo_24g()
    result = search_rlhf(workload, hardware, C, lora_ranks=(16,))
    assert result.best is not None and result.best.strategy.rollout is not None
    assert result.trials <= 48


def test_a_search_for_no_closest_plan_stops_where_the_bounds_prove_nothing_fits() -> None:
    workload, hardware = grpo_opt125m(gpu_memory=1 * GiB)
    ranked = search_rlhf(workload, hardware, C)
    assert ranked.best is None and ranked.ranked and ranked.ranked[0].score >= INFEASIBLE_PENALTY_S
    unranked = search_rlhf(workload, hardware, C, closest=False)
    assert unranked.best is None and unranked.ranked == () and unranked.trials == 0
    # where something fits, the same search either way
    workload, hardware = grpo_opt125m()
    assert search_rlhf(workload, hardware, C, closest=False) == search_rlhf(workload, hardware, C)


def test_keys_of_the_points_are_unique() -> None:
    """The walk indexes points by their place in ``rlhf_outer_points``: no two share a key."""
    workload, hardware = _ppo_24g()
    points = list(rlhf_outer_points(workload, hardware, (0, 16), searched_generations(workload, hardware)))
    assert len({rlhf_key(p) for p in points}) == len(points)

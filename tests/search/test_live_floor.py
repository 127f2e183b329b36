"""The stream's floors (search.choose.live_floor) are lower bounds of the replay's peak reserved: the live floor
the same for every ``empty_cache`` and allocator variant of a step, the policy's floor (what the phases leave
cached, by CUDA stream and pool, between ``empty_cache`` calls) for each policy and allocator; and the
confirmation that skips replays on them ranks the same plans as one that replays them (issue 42: ``recommend``
no slower, no fitting plan pruned)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
from fake_predictions import prediction as made
from small_jobs import grpo_opt125m

from planner.planning.predicting import _job
from search import DEFAULT_COEFFICIENTS as C
from search import predict
from search.choose.candidates import Candidate
from search.choose.confirm import cannot_fit, near_fit, resolve
from search.choose.live_floor import cached_floor, measured_live_floor, strategy_floor
from search.choose.optimize import single_variants
from search.choose.single_space import all_strategies
from search.prediction import Prediction
from search.rlhf.predict import rlhf_step
from search.single.predict import checked_step, screen_single_model
from store.phases import EMPTY_CACHE_AFTER
from store.records import Hardware, RLHFStrategy, Strategy, Workload

GiB = 2**30
EVERY = 29  # a few dozen strategies a job: every ZeRO stage, offload, checkpointing, micro-batch and policy met


def _opt125m_sft() -> tuple[Workload, Hardware]:
    job = _job("opt-125m", {"gpu_mem": "3G", "gpus": 2, "workload": "sft", "cpu_mem": "64G"})
    return job.workload, job.hardware


def test_the_floors_are_below_every_replay_the_live_one_one_for_every_policy_of_a_step() -> None:
    """A confirmation's steps (each ZeRO stage, offload, checkpointing, batch split), each under its own
    ``empty_cache`` policy and allocator: the live floor (one for every policy) <= the floor of every policy
    <= the policy's own floor (what the phases leave cached) <= the replay's peak reserved; the floor the search
    holds a variant to is one of the last two."""
    workload, hardware = _opt125m_sft()
    strategies = list(all_strategies(workload, hardware, (0, 8)))[::EVERY]
    assert {s.zero_stage for s in strategies} == {0, 1, 2, 3}
    assert {s.empty_cache for s in strategies} == {"never", "after-phase", "every-step"}
    assert {s.allocator for s in strategies} == {"default", "expandable-segments"}
    raised = 0
    for strategy in strategies:
        step = checked_step(workload, strategy, hardware, C)
        floors = {measured_live_floor(step, policy) for policy in EMPTY_CACHE_AFTER}
        assert len(floors) == 1, strategy.describe()  # empty_cache adds events, never a request
        every, own = cached_floor(step, strategy.empty_cache)
        reserved = predict(workload, strategy, hardware, C).peak_reserved_bytes
        assert 0 < floors.pop() <= every <= own <= reserved, strategy.describe()
        assert strategy_floor(workload, hardware, C, strategy) in (every, own)
        raised += own > every
    assert raised > 0  # what the phases leave cached raises some floors above the live bytes


def test_the_floor_of_never_prunes_a_variant_the_live_floor_let_through() -> None:
    """Without ``empty_cache`` calls the forward's cached blocks are still reserved in the later phases: a
    ``never`` variant whose live bytes fit a budget the replay overflows is proved not to fit by its floor."""
    workload, hardware = _opt125m_sft()
    pruned = 0
    for strategy in list(all_strategies(workload, hardware, (0, 8)))[:: EVERY * 3]:
        variant = replace(strategy, empty_cache="never", allocator="default")
        step = checked_step(workload, variant, hardware, C)
        live, own = cached_floor(step, "never")
        if own <= live:
            continue
        budget = (live + own) // 2
        screened = screen_single_model(workload, variant, hardware, C)
        if not near_fit(screened):
            continue  # the screen's own floor rules it out already
        assert strategy_floor(workload, hardware, C, variant) == own
        assert cannot_fit(variant, screened, partial(strategy_floor, workload, hardware, C), budget)
        assert not cannot_fit(variant, screened, lambda _, floor=live: floor, budget)  # the live floor let it through
        assert predict(workload, variant, hardware, C).peak_reserved_bytes > budget  # and the replay overflows
        pruned += 1
    assert pruned >= 3


def test_the_floor_is_below_the_replay_of_rlhf_steps_with_and_without_an_engine() -> None:
    workload, hardware = grpo_opt125m()
    from search import search_rlhf  # the search's own points: DeepSpeed's generate and a rollout engine's

    ranked = (
        search_rlhf(workload, hardware, C).ranked[:4]
        + search_rlhf(workload, hardware, C, rollouts=("hybrid-engine",)).ranked[:4]
    )
    engines = {c.strategy.rollout is not None for c in ranked if isinstance(c.strategy, RLHFStrategy)}
    assert engines == {True, False}
    for candidate in ranked:
        strategy = candidate.strategy
        assert isinstance(strategy, RLHFStrategy)
        replayed = predict(workload, strategy, hardware, C)
        floor = measured_live_floor(rlhf_step(workload, strategy, hardware, C), strategy.empty_cache)
        assert 0 < floor <= replayed.peak_reserved_bytes, strategy
        never = replace(strategy, empty_cache="never", allocator="default")
        own = strategy_floor(workload, hardware, C, never)
        assert floor <= own <= predict(workload, never, hardware, C).peak_reserved_bytes, strategy


def test_resolve_skips_a_variant_whose_floor_overflows_the_points_budget() -> None:
    """Variants: 1 the search's choice, replayed, does not fit; 2 faster on the screen, its floor above the
    budget the replay of 1 said (never replayed); 3 floor within it (replayed, fits)."""
    variants = [Strategy(micro_batch=m) for m in (1, 2, 3)]

    screened = {1: made(1.0, 9.0), 2: made(0.5, 10.5), 3: made(0.8, 9.8)}
    replayed = {1: made(1.0, 10.5), 2: made(0.5, 9.0), 3: made(0.8, 9.9)}
    floors = {1: 9 * GiB, 2: 11 * GiB, 3: 9 * GiB}
    asked: list[int] = []

    def replay(s: Strategy | RLHFStrategy) -> Prediction:
        asked.append(s.micro_batch)
        return replayed[s.micro_batch]

    def floor(s: Strategy | RLHFStrategy) -> int:
        return floors[s.micro_batch]

    first = Candidate(variants[0], screened[1])
    best, _, _ = resolve(variants, lambda s: screened[s.micro_batch], replay, first, floor=floor)
    assert best is not None and best.strategy.micro_batch == 3 and 2 not in asked
    asked.clear()
    without, _, _ = resolve(variants, lambda s: screened[s.micro_batch], replay, first)
    assert 2 in asked  # without the floor, the replay of 2 is what rules it out (here it even "fits")
    assert without is not None and without.strategy.micro_batch == 2
    asked.clear()
    resolve(variants, lambda s: screened[s.micro_batch], replay, first, floor=lambda s: 11 * GiB, needed=False)
    assert asked == []  # nothing could fit and nothing is needed: no replay at all


@pytest.mark.parametrize(("model", "gpu", "kind"), [("opt-125m", "3G", "sft"), ("gpt2", "4G", "dpo")])
def test_resolving_with_the_floor_keeps_every_plan_that_fits(model: str, gpu: str, kind: str) -> None:
    """Points of a boundary job resolved with and without the floor: a point that fits still fits, as fast."""
    job = _job(model, {"gpu_mem": gpu, "gpus": 2, "workload": kind, "cpu_mem": "64G"})
    workload, hardware = job.workload, job.hardware
    points = {replace(s, micro_batch=1, grad_accum=1, empty_cache="never", allocator="default", loss="hf")
              for s in all_strategies(workload, hardware, (0,))}  # fmt: skip
    fits = 0
    for point in sorted(points, key=lambda s: s.describe())[::3]:
        variants = single_variants(workload, hardware, point)

        def screen(s: Strategy | RLHFStrategy) -> Prediction:
            assert isinstance(s, Strategy)
            return screen_single_model(workload, s, hardware, C)

        def replay(s: Strategy | RLHFStrategy) -> Prediction:
            return predict(workload, s, hardware, C)

        def floor(s: Strategy | RLHFStrategy) -> int:
            return strategy_floor(workload, hardware, C, s)

        plain, _, _ = resolve(variants, screen, replay)
        floored, _, _ = resolve(variants, screen, replay, floor=floor)
        assert (plain is None) == (floored is None)
        if plain is not None and floored is not None:
            assert floored.prediction.fits == plain.prediction.fits, point.describe()
            if plain.prediction.fits:
                fits += 1
                assert floored.score <= plain.score, point.describe()  # its replays go to what can fit
    assert fits > 0

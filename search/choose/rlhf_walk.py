"""The bound walk of the RLHF search: outer points resolved best lower bound first until none left can win.

A point's step time is the sum of its models' times, each depending only on that model's block (and the batch
split), so the sum of each model's least time over the splits bounds it from below; its resident bytes and host
memory, also sums over models, plus the most that any one model's moments must add, bound its memory
(:func:`point_bounds`). :func:`bound_walk` resolves points in order of that bound. Once the
``RLHF_ALTERNATIVES`` best that fit are known, an engine point's bound is first tightened to the least of its
pairs' bounds (:func:`search.choose.engine_inner.engine_bound`: joint over the batch split and the engine's
knobs, where the per-model bound takes each model's least on its own) and the point goes back in line: points
that cannot reach the alternatives are then passed over without building a step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from search.choose.candidates import INFEASIBLE_PENALTY_S, Candidate, penalized_score
from search.choose.engine_inner import engine_bound
from search.choose.rlhf_space import (
    RLHFOuterPoint,
    batch_choices,
    role_bytes,
    role_init_cached,
    role_live_floor,
    role_seconds,
    shared_bytes,
    shared_seconds,
)
from search.choose.rollout_space import (
    engine_actor_seconds,
    engine_floor_bytes,
    fastest_knobs,
    knob_variants,
    offloadable_bound,
    smallest_knobs,
)
from search.coefficients import Coefficients
from search.rlhf.job import RLHFContext, rlhf_context
from search.step.assemble import gpu_budget_bytes
from store.records import FrozenModelStrategy, Hardware, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy

RLHF_ALTERNATIVES = 4  # fitting points the bound walk ranks exactly by default: the best and 3 alternatives

# what a model, or the models of a point so far, add to its bound: (seconds, resident bytes, most live bytes,
# offloaded host bytes, 16-bit bytes while loading, bytes its engine init leaves cached, bytes offload_states moves)
Part = tuple[float, int, int, float, int, int, int]


@lru_cache(maxsize=4096)
def _role_part(
    ctx: RLHFContext,
    role: str,
    block: TrainedModelStrategy | FrozenModelStrategy,
    hybrid_engine: bool,
    rollout: RolloutStrategy | None,
) -> Part:
    """One model's share of a point's bound: its least seconds and least live bytes over the batch splits (cached
    by value: the confirmation asks :func:`point_bounds` one candidate's point at a time, each its own blocks)."""
    splits = batch_choices(ctx.workload, ctx.hardware)
    if role == "actor" and rollout is not None:
        assert isinstance(block, TrainedModelStrategy)
        fastest = fastest_knobs(rollout)
        seconds = min(engine_actor_seconds(ctx, block, fastest, split) for split in splits)
    else:
        seconds = min(role_seconds(ctx, role, block, hybrid_engine, False, split) for split in splits)
    live = min(role_live_floor(ctx, role, block, hybrid_engine, split, rollout is None) for split in splits)
    resident, host, loading = role_bytes(ctx, role, block)
    cached = role_init_cached(ctx, role, block)
    return seconds, resident, live, host, loading, cached, offloadable_bound(ctx, role, block)


def _add(total: Part | None, part: Part) -> Part:
    """``total`` with one more model: sums in the models' order (actor, critic, reference, reward), maxima."""
    if total is None:
        return part
    seconds, resident, live, host, loading, cached, movable = total
    return (
        seconds + part[0],
        resident + part[1],
        max(live, part[2]),
        host + part[3],
        max(loading, part[4]),
        max(cached, part[5]),
        movable + part[6],
    )


@lru_cache(maxsize=64)
def _shared_terms(ctx: RLHFContext) -> tuple[int, float, float, int]:
    """What every point of :func:`point_bounds` shares: (the largest usable bytes, the least shared seconds with
    DeepSpeed's generation and with an engine's, the shared bytes)."""
    hardware, coef = ctx.hardware, ctx.coef
    # the most any strategy's usable bytes can be (its measured spread only lowers them): the memory part of the
    # bound is a lower bound of the replay's peak reserved (resident and live bytes: no fragments, nothing
    # cached), held against the largest budget, so a point it penalizes cannot fit by the replay
    budget = gpu_budget_bytes(hardware, replace(coef, reserved_spread=0.0))
    splits = batch_choices(ctx.workload, hardware)
    least_shared = min(shared_seconds(ctx, split) for split in splits)
    # an engine's rollout is one call, where DeepSpeed's generation pays the per-call overhead for every batch
    least_engine_shared = min(
        shared_seconds(ctx, split)
        - coef.step_overhead_s * (ctx.job.prompts_per_gpu // split[0] * ctx.job.generate_passes - 1)
        for split in splits
    )
    return budget, least_shared, least_engine_shared, shared_bytes(ctx)


def point_bounds(
    workload: Workload, hardware: Hardware, coef: Coefficients, points: list[RLHFOuterPoint]
) -> list[float]:
    """A lower bound of each point's score (``best_inner_rlhf``'s), from per-model pieces.

    The pieces of a point's first models are shared by the many points that differ only in their later models:
    they are added once (memos keyed by the identity of the blocks, which the points share), in the same order
    as a sum over the point's models would add them, so each bound is the same float.
    """
    ctx = rlhf_context(workload, hardware, coef)
    budget, least_shared, least_engine_shared, constant = _shared_terms(ctx)
    host_budget = hardware.cpu_memory_bytes
    parts: dict[tuple[Any, ...], Part] = {}  # by (role, identity of the block, generation): one model's piece
    prefixes: dict[tuple[Any, ...], Part] = {}  # by the identities of a point's first blocks: their pieces added
    engine_floors: dict[int, tuple[bool, int]] = {}  # by the identity of the rollout

    def part(role: str, block: TrainedModelStrategy | FrozenModelStrategy, p: RLHFOuterPoint) -> Part:
        key = (role, id(block), p.hybrid_engine, id(p.rollout)) if role == "actor" else (role, id(block))
        found = parts.get(key)
        if found is None:
            found = parts[key] = _role_part(ctx, role, block, p.hybrid_engine, p.rollout)
        return found

    bounds = []
    for p in points:
        rollout = p.rollout
        head = (id(p.actor), id(p.critic), p.hybrid_engine, id(rollout))
        trainer = prefixes.get(head)
        if trainer is None:
            trainer = part("actor", p.actor, p)
            if p.critic is not None:
                trainer = _add(trainer, part("critic", p.critic, p))
            prefixes[head] = trainer
        with_reference = (*head, id(p.reference))
        frozen = prefixes.get(with_reference)
        if frozen is None:
            frozen = prefixes[with_reference] = _add(trainer, part("reference", p.reference, p))
        reward = parts.get(("reward", id(p.reward))) or part("reward", p.reward, p)
        seconds, resident, live, host, loading, cached, movable = _add(frozen, reward)
        time = (least_shared if rollout is None else least_engine_shared) + seconds
        resident += constant
        reserved = resident + live  # what the engine init left cached may be released (empty_cache)
        if rollout is not None:  # the engine awake beside the least the trainer keeps for the rollout
            if id(rollout) not in engine_floors:
                smallest = smallest_knobs(rollout)
                engine_floors[id(rollout)] = (smallest.offload_training, engine_floor_bytes(ctx, smallest))
            offload, floor = engine_floors[id(rollout)]
            reserved = max(reserved, resident - movable * offload + floor)
        host_bytes = max(host, loading) * hardware.gpus
        # float sums in another order than the step's: keep the bound a hair below
        bounds.append(penalized_score(time * (1 - 1e-9), reserved, budget, int(host_bytes * (1 - 1e-9)), host_budget))
    return bounds


def bound_walk(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    by_key: dict[tuple[Any, ...], RLHFOuterPoint],
    evaluated: dict[tuple[Any, ...], Candidate],
    *,
    n_trials: int,
    resolve: Callable[[RLHFOuterPoint], Candidate],
    bounds: list[float] | None = None,
    exact: int = RLHF_ALTERNATIVES,
) -> int:
    """Exact search of the outer points, best bound first; fills ``evaluated``, returns how many it resolved.

    Points are resolved by ``resolve`` (``best_inner_rlhf``) in order of :func:`point_bounds` until no remaining
    point can beat the best found, nor the ``exact``-th best that fits (while fewer fit, until
    ``n_trials`` points are resolved). When nothing fits, it stops after ``n_trials`` points' worth (an engine
    point counts as its knob variants): the closest plan it reports is then the closest of those, not provably
    of all. Once ``exact`` points fit, an engine point's bound is tightened before it is resolved (see the
    module's docstring): the best and those alternatives are the same, fewer points are resolved.
    ``bounds``: the points' :func:`point_bounds` where the caller has them already. ``exact``: how many of the
    fastest fitting points are ranked exactly (the best counts; at least 1).
    """
    if bounds is None:
        bounds = point_bounds(workload, hardware, coef, list(by_key.values()))
    queue = sorted(zip(bounds, range(len(by_key)), by_key, strict=True))
    tightened: set[int] = set()
    best = float("inf")
    exact = max(1, exact)
    fitting: list[float] = []  # the best scores that fit, at most ``exact``
    spent = 0  # points resolved, an engine point counting as its knob variants (each costs a DeepSpeed point)
    while queue:  # a sorted list is a heap: popped in order until bounds are tightened
        bound, index, key = queue[0]
        point = by_key[key]
        if len(fitting) >= exact:
            if bound > fitting[-1]:
                break  # cannot win, nor rank among the alternatives; neither can any later point
            if point.rollout is not None and index not in tightened:
                tightened.add(index)
                tighter = engine_bound(point, workload, hardware, coef)
                if tighter > bound:
                    heapq.heapreplace(queue, (tighter, index, key))
                    continue
        elif bound > best:  # cannot win; resolve it only as a possible alternative
            if not (bound < INFEASIBLE_PENALTY_S and spent < n_trials):
                break
        elif bound >= INFEASIBLE_PENALTY_S and not fitting and spent >= n_trials:
            break  # nothing fits: the closest of ``n_trials`` points' worth is the answer, not provably the closest
        heapq.heappop(queue)
        spent += 1 if point.rollout is None else len(knob_variants(point.rollout))
        candidate = evaluated[key] = resolve(point)
        best = min(best, candidate.score)
        if candidate.prediction.fits:
            fitting = sorted([*fitting, candidate.score])[:exact]
    return len(evaluated)

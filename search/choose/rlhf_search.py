"""The search over RLHF strategies: least predicted step time such that peak reserved and host memory fit.

Outer points (model layouts, hybrid engine; see ``search.choose.rlhf_space``) are resolved exactly over their inner
knobs by ``best_inner_rlhf``. Small spaces are walked whole (``grid``); larger ones by ``bound``: the step
time of a point is a sum over its models, and its memory is bounded below by per-model bytes, so points are
resolved best bound first until none left can win, which finds the exhaustive optimum at a fraction of the
cost. ``tpe`` runs a seeded multivariate Optuna TPE study over the same knobs instead (a trial budget, no
guarantee). Scores and ranking are those of ``search.choose.candidates``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from search.choose.candidates import INFEASIBLE_PENALTY_S, Candidate, SearchResult, penalized_score
from search.choose.engine_inner import best_inner_engine
from search.choose.rlhf_space import (
    RLHFOuterPoint,
    batch_choices,
    cache_choices,
    frozen_blocks,
    rlhf_outer_points,
    rlhf_strategy_at,
    role_blocks,
    trained_layouts,
)
from search.choose.rlhf_tpe import rlhf_key, tpe_rlhf
from search.choose.rlhf_walk import RLHF_ALTERNATIVES, bound_walk, point_bounds
from search.choose.rollout_space import (
    ROLLOUT_FAMILIES,
    engine_actor_seconds,
    fastest_knobs,
    preference,
    searched_generations,
)
from search.coefficients import Coefficients
from search.rlhf.engine import engine_limits, replica_sequences, utilization_span
from search.rlhf.job import RLHFContext, rlhf_context
from search.rlhf.predict import rlhf_step, screen_rlhf
from search.rlhf.step import reserved_floor, step_halves, step_of, step_time
from search.step.assemble import gpu_budget_bytes, score_step, screen_step
from store.records import Hardware, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy

RLHF_TPE_TRIALS = 96


def best_inner_rlhf(point: RLHFOuterPoint, workload: Workload, hardware: Hardware, coef: Coefficients) -> Candidate:
    """The best inner choice of an outer point, exactly: the least score over every (generation batch,
    micro-batch, empty_cache, allocator), the first in ``batch_choices`` x ``cache_choices`` order among equals.

    Branch and bound. A batch split can do no better than its step time without empty_cache when its least
    reserved bytes (``after-phase`` with expandable segments) fit, else than the penalty of that overflow;
    splits are visited by that bound until no remaining one can win, and within a split the cache choices
    stop at the first that reaches the bound.
    """
    if point.rollout is not None:
        return best_inner_engine(point, workload, hardware, coef)
    ctx = rlhf_context(workload, hardware, coef)
    budget, host_budget = gpu_budget_bytes(hardware, coef), hardware.cpu_memory_bytes
    splits = []
    for i, batches in enumerate(batch_choices(workload, hardware)):
        strategy = rlhf_strategy_at(point, batches)
        models, inference, training = step_halves(ctx, strategy)
        seconds = sum(step_time(inference, training).values())  # exactly the step's base_time_s
        floor = reserved_floor(models, (inference, training), coef, workload.dtype)
        splits.append((penalized_score(seconds, floor, budget, models.host_bytes, host_budget), i, strategy))
    splits.sort(key=lambda split: split[:2])
    best: tuple[float, int, int] | None = None
    steps = {}
    for bound, i, strategy in splits:
        if best is not None and (bound, i) > best[:2]:
            break  # this split and the later ones can at best tie with a later index
        steps[i] = step = step_of(ctx, strategy)
        for j, (policy, allocator) in enumerate(cache_choices(point.rollout)):
            reserved, seconds = score_step(step, policy, allocator, coef)
            score = penalized_score(seconds, reserved, budget, step.host_bytes, host_budget)
            if best is None or (score, i, j) < best:
                best = (score, i, j)
            if score == bound:
                break  # later choices of this split can at best tie
    assert best is not None
    _, i, j = best
    policy, allocator = cache_choices(point.rollout)[j]
    strategy = next(split[2] for split in splits if split[1] == i)
    prediction = screen_step(steps[i], policy, allocator, hardware, coef)
    return Candidate(strategy.with_(empty_cache=policy, allocator=allocator), prediction)


def search_rlhf(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    seed: int = 0,
    lora_ranks: tuple[int, ...] = (0,),
    n_trials: int = RLHF_TPE_TRIALS,
    sampler: str = "auto",
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
    closest: bool = True,
    alternatives: int = RLHF_ALTERNATIVES - 1,
) -> SearchResult:
    """The search over an RLHF step's outer knobs, inner knobs resolved exactly per point (``best_inner_rlhf``).

    Outer knobs: actor layout and checkpointing, critic layout and checkpointing (PPO), reference and reward
    blocks, generation (DeepSpeed's hybrid engine, HF generate, or a vLLM/SGLang engine option of the families
    in ``rollouts``: "hybrid-engine" stands for DeepSpeed's own generation), LoRA rank. ``sampler``:

    - ``grid``: every point once, in order. Walked directly: Optuna's GridSampler rescans all trials after each
      one, which costs more than the predictions here.
    - ``bound`` (auto): exact too, best bound first (see ``search.choose.rlhf_walk``): the best and the
      next ``alternatives`` fitting points are exact; ``n_trials`` caps the points resolved only to rank
      alternatives.
    - ``tpe``: a seeded multivariate Optuna TPE study of ``n_trials`` trials (no guarantee of the optimum).

    Ranked fastest first (each evaluated point's best candidate); deterministic for a seed. When nothing fits,
    the closest points rank first; with ``closest`` False, a search whose bounds (``search.choose.rlhf_walk``)
    prove that nothing can fit returns at once, nothing ranked (for callers that read only ``best``).
    """
    generations = searched_generations(workload, hardware, rollouts)
    points = list(rlhf_outer_points(workload, hardware, lora_ranks, generations))
    by_key = {rlhf_key(p): p for p in points}
    if sampler == "auto":
        # the bound walk is exact too (its memory bound is a lower bound of the replay's: rlhf_space.role_live_floor)
        # and resolves a few of the points: DeepSpeed-Chat's PPO on one RTX 4090, 18 of 256 (issue 42)
        sampler = "bound"
    bounds = None
    if sampler == "bound" or not closest:
        bounds = point_bounds(workload, hardware, coef, list(by_key.values()))
        if not closest and min(bounds, default=INFEASIBLE_PENALTY_S) >= INFEASIBLE_PENALTY_S:
            return SearchResult(ranked=(), trials=0, sampler=sampler)
    evaluated: dict[tuple[Any, ...], Candidate] = {}
    if sampler == "grid":
        for key, point in by_key.items():
            evaluated[key] = best_inner_rlhf(point, workload, hardware, coef)
        trials = len(points)
    elif sampler == "bound":
        trials = bound_walk(
            workload,
            hardware,
            coef,
            by_key,
            evaluated,
            n_trials=n_trials,
            resolve=lambda point: best_inner_rlhf(point, workload, hardware, coef),
            bounds=bounds,
            exact=alternatives + 1,
        )
    else:
        trials = tpe_rlhf(
            workload,
            hardware,
            lambda point: best_inner_rlhf(point, workload, hardware, coef),
            by_key,
            evaluated,
            seed=seed,
            n_trials=n_trials,
        )
    order = {key: i for i, key in enumerate(by_key)}
    # equal times: vLLM before SGLang (their time models are alike, and every framework runs vLLM), then the
    # one with more headroom, then the simpler (earlier) layout
    ranked = sorted(evaluated.items(), key=lambda kv: (*preference(kv[1]), order[kv[0]]))
    return SearchResult(
        ranked=tuple(c for _, c in ranked),
        trials=trials,
        sampler=sampler,
        fastest_ignoring_memory=fastest_rlhf_ignoring_memory(workload, hardware, coef, lora_ranks, rollouts),
    )


def fastest_rlhf_ignoring_memory(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    lora_ranks: tuple[int, ...] = (0,),
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
) -> Candidate | None:
    """The fastest RLHF strategy if memory were unlimited (largest batches, no empty_cache).

    Step time is a sum of per-model times, each depending only on that model's block (the actor's also on
    how it generates), so each model's fastest block is chosen on its own: a few dozen predictions. Engines
    count colocated, with their fastest knobs: one on GPUs of its own changes every model's share of the batch.
    An engine keeps a real size (:func:`engine_at_real_size`): unlimited memory is the trainer's, not a KV cache
    as large as the number it is given (issue 42: "4252017667.50 GiB peak").
    """
    batches = batch_choices(workload, hardware)[0]
    blocks = frozen_blocks(hardware)
    ctx = rlhf_context(workload, hardware, coef)
    fastest: Candidate | None = None
    for rank in lora_ranks:
        layouts = trained_layouts(workload, hardware, rank)
        point = RLHFOuterPoint(layouts[0], layouts[0] if workload.has_critic else None, blocks[0], blocks[0], True)

        def role_time(p: RLHFOuterPoint, role: str) -> float:
            return rlhf_step(workload, rlhf_strategy_at(p, batches), hardware, coef).role_time[role]

        generations: list[tuple[bool, RolloutStrategy | None]] = []
        for he, r in searched_generations(workload, hardware, rollouts):
            sized = r if r is None else engine_at_real_size(ctx, fastest_knobs(r)) if r.colocated else False
            if sized is not False:
                generations.append((he, sized))
        actor_options = [(a, he, r) for a in layouts for he, r in generations]

        def actor_time(
            option: tuple[TrainedModelStrategy, bool, RolloutStrategy | None], point: RLHFOuterPoint = point
        ) -> float:
            actor, he, rollout = option
            if rollout is not None:  # with memory unlimited every sequence runs at once: the engine's bound is exact
                return engine_actor_seconds(ctx, actor, rollout, batches)
            return role_time(replace(point, actor=actor, hybrid_engine=he, rollout=None), "actor")

        actor, he, rollout = min(actor_options, key=actor_time)
        point = replace(point, actor=actor, hybrid_engine=he, rollout=rollout)
        if workload.has_critic:
            point = replace(point, critic=min(layouts, key=lambda c: role_time(replace(point, critic=c), "critic")))
        # one block for a model the workload does not hold (role_blocks)
        references, rewards = role_blocks(workload, hardware, "reference"), role_blocks(workload, hardware, "reward")
        point = replace(
            point, reference=min(references, key=lambda b: role_time(replace(point, reference=b), "reference"))
        )
        point = replace(point, reward=min(rewards, key=lambda b: role_time(replace(point, reward=b), "reward")))
        strategy = rlhf_strategy_at(point, batches)
        candidate = Candidate(strategy, screen_rlhf(workload, strategy, hardware, coef))
        if fastest is None or candidate.prediction.step_time_s < fastest.prediction.step_time_s:
            fastest = candidate
    return fastest


def exhaustive_rlhf(
    workload: Workload,
    hardware: Hardware,
    coef: Coefficients,
    *,
    lora_ranks: tuple[int, ...] = (0,),
    rollouts: tuple[str, ...] = ROLLOUT_FAMILIES,
) -> Candidate | None:
    """The fastest fitting RLHF strategy over every outer point (each resolved by ``best_inner_rlhf``)."""
    best: Candidate | None = None
    generations = searched_generations(workload, hardware, rollouts)
    for point in rlhf_outer_points(workload, hardware, lora_ranks, generations):
        candidate = best_inner_rlhf(point, workload, hardware, coef)
        if candidate.prediction.fits and (best is None or preference(candidate) < preference(best)):
            best = candidate
    return best


def engine_at_real_size(ctx: RLHFContext, rollout: RolloutStrategy) -> RolloutStrategy | Literal[False]:
    """``rollout`` at the least ``gpu_memory_utilization`` whose KV cache holds the sequences a replica runs at
    once, started on an empty GPU of the job's (what the yardstick of :func:`fastest_rlhf_ignoring_memory` plans
    the engine at); False where no utilization of this GPU holds them (the engine cannot run the rollout here)."""
    w, hw = ctx.workload, ctx.hardware
    limits = engine_limits(rollout.engine, hw.gpu_memory_bytes, hw.gpu.name, w.framework)
    running = min(replica_sequences(ctx, rollout), limits.max_num_seqs)
    fitting = utilization_span(ctx, rollout, running, hw.gpu_memory_bytes, hw.gpu_memory_bytes)
    return False if fitting is None else rollout.with_(gpu_memory_utilization=fitting[0])

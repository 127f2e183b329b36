"""The inner knobs of an RLHF point whose rollout runs on a vLLM or SGLang engine, resolved exactly.

For each knob variant of the engine (:func:`search.choose.rollout_space.knob_variants`) and each batch split,
a lower bound of its score comes from the cached pieces without resolving the engine's memory: seconds from the
scoring and training halves, the rollout with every sequence running at once, the weight sync, sleep and wake,
and DeepSpeed's offload_states; bytes from the resident ones, the halves' live bytes and the least the engine
takes awake, without fragments. Pairs are built into steps in order of that bound until none left can beat the
best score found, and each built step tries every ``empty_cache`` policy and allocator. A point none of whose
pairs can fit builds only its ``INFEASIBLE_PAIRS`` most promising ones: its score then says how close it comes
among those, which is all a plan that does not fit is ranked by.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from search.choose.candidates import INFEASIBLE_PENALTY_S, Candidate, penalized_score
from search.choose.rlhf_space import (
    RLHFOuterPoint,
    batch_choices,
    cache_choices,
    rlhf_strategy_at,
    role_seconds,
    shared_seconds,
)
from search.choose.rollout_space import engine_floor_bytes, engine_seconds, knob_variants
from search.coefficients import Coefficients
from search.rlhf.engine_step import engine_step_of, offloadable_states, trainer_hardware
from search.rlhf.job import RLHFContext, rlhf_context
from search.rlhf.models import place_models
from search.rlhf.scoring_phase import scoring_half
from search.rlhf.step import reserved_floor, training_half
from search.rollout.timing import (
    offload_states_seconds,
)
from search.step.assemble import gpu_budget_bytes, score_step, screen_step
from store.errors import InputError
from store.records import (
    FrozenModelStrategy,
    Hardware,
    RLHFStrategy,
    Strategy,
    TrainedModelStrategy,
    Workload,
)
from store.rollout import RolloutStrategy

MOVING = RolloutStrategy(offload_training=True)  # any engine that offloads the trainer's states for its turn
# the screen's allocated bytes over the replay's peak reserved, at most (search.choose.confirm.FLOOR_SLACK)
REPLAY_SLACK = 0.02
INFEASIBLE_PAIRS = 12  # pairs built for a point none of whose pairs can fit (its score only ranks how close it is)


@lru_cache(maxsize=65536)
def _trainer_bounds(
    ctx: RLHFContext,
    actor: TrainedModelStrategy,
    critic: TrainedModelStrategy | None,
    reference: FrozenModelStrategy,
    reward: FrozenModelStrategy,
    ema: bool,
    batches: tuple[int, int, int],
) -> tuple[float, int, int, int, int, int]:
    """The trainer's share of :func:`step_bounds`, the same for every engine variant: (seconds of the scoring
    and training halves, their least reserved bytes, resident bytes, their most live bytes, host bytes, the
    bytes offload_states can move)."""
    generation_batch, micro_batch, grad_accum = batches
    models = place_models(ctx, actor, critic, reference, reward, ema)
    scoring = scoring_half(ctx, models, generation_batch, 1, micro_batch, grad_accum, rollout_engine=True)
    training = training_half(ctx, actor, critic, ema, micro_batch, grad_accum)
    seconds = sum(scoring.time.values()) + sum(training.time.values())
    floor = reserved_floor(models, (scoring, training), ctx.coef, ctx.workload.dtype)
    movable = offloadable_states(models, MOVING)
    resident = sum(models.resident.values())
    return seconds, floor, resident, max(scoring.live, training.live), models.host_bytes, movable


def step_bounds(ctx: RLHFContext, s: RLHFStrategy) -> tuple[float, int, int]:
    """Lower bounds of the step seconds, peak reserved bytes and host bytes of ``s`` (an engine strategy)
    before its engine is resolved: no fragments beyond the least any policy leaves, the engine at the least it
    can take."""
    assert s.rollout is not None
    point = RLHFOuterPoint(s.actor, s.critic, s.reference, s.reward, False, s.rollout)
    return _bounds(ctx, point, s.rollout, (s.generation_batch, s.micro_batch, s.grad_accum), s.ema)


def fewest_seconds(workload: Workload, hardware: Hardware, coef: Coefficients, s: Strategy | RLHFStrategy) -> float:
    """A lower bound of the screened seconds of ``s`` without ``empty_cache`` calls, cheaper than its screen:
    :func:`step_bounds`'s for a strategy whose rollout runs on an engine (its trainer's share is cached per
    point and batch split), :func:`generation_seconds` for DeepSpeed's own generation, 0.0 (no bound) for a
    single-model strategy and for a batch split the job cannot run. The confirmation passes over the steps it
    puts at or above a point's best replayed seconds (:func:`search.choose.confirm.resolve`)."""
    if not isinstance(s, RLHFStrategy):
        return 0.0
    try:
        if s.rollout is None:
            return generation_seconds(rlhf_context(workload, hardware, coef), s)
        ctx = rlhf_context(workload, trainer_hardware(hardware, s.rollout), coef)
        return step_bounds(ctx, s)[0]
    except InputError:
        return 0.0


def generation_seconds(ctx: RLHFContext, s: RLHFStrategy) -> float:
    """The seconds of ``s`` (DeepSpeed's own generation) without ``empty_cache`` calls, a hair below: each model's
    seconds at its batch split (:func:`search.choose.rlhf_space.role_seconds`, the step's ``role_time`` of that
    model, which no other model's block changes) and the shared ones (``shared_seconds``), the pieces the bound
    walk takes the least of over the splits (:func:`search.choose.rlhf_walk.point_bounds`), summed in another
    order than the step's."""
    batches = (s.generation_batch, s.micro_batch, s.grad_accum)
    blocks = (("actor", s.actor), ("critic", s.critic), ("reference", s.reference), ("reward", s.reward))
    seconds = shared_seconds(ctx, batches)
    for role, block in blocks:
        if block is not None:
            seconds += role_seconds(ctx, role, block, s.hybrid_engine, s.ema, batches)
    return seconds * (1 - 1e-9)


def _bounds(
    ctx: RLHFContext, point: RLHFOuterPoint, rollout: RolloutStrategy, batches: tuple[int, int, int], ema: bool
) -> tuple[float, int, int]:
    trainer = _trainer_bounds(ctx, point.actor, point.critic, point.reference, point.reward, ema, batches)
    return _combine(ctx, trainer, _engine_part(ctx, rollout, point.actor.zero_stage == 3))


def _engine_part(ctx: RLHFContext, rollout: RolloutStrategy, zero3: bool) -> tuple[RolloutStrategy, float, int]:
    floor = engine_floor_bytes(ctx, rollout) if rollout.colocated else 0
    return rollout, engine_seconds(ctx, rollout, zero3), floor


def _combine(
    ctx: RLHFContext,
    trainer: tuple[float, int, int, int, int, int],
    engine: tuple[RolloutStrategy, float, int],
    replayed: bool = False,
) -> tuple[float, int, int]:
    """(seconds, reserved, host) bounds of a pair. ``replayed``: the reserved bound is one of the allocator
    replay's peak reserved too (the trainer's resident and live bytes, no fragments: :func:`replay_pairs`),
    not only of the screen's (the trainer's phases with their least fragments)."""
    halves, floor, resident, live, host, movable = trainer
    rollout, engine_s, engine_floor = engine
    offloaded = movable if (rollout.colocated and rollout.offload_training) else 0
    seconds = (halves + engine_s + offload_states_seconds(offloaded, ctx.hardware, ctx.coef)) * (1 - 1e-9)
    # the trainer's phases with their least fragments (what the sleeping engine keeps only adds); for the replay,
    # their live bytes alone, less the slack by which the screen's allocated bytes may exceed the replay's
    slack = 1 - REPLAY_SLACK if replayed else 1.0
    reserved = int((resident + live) * slack) if replayed else floor
    if rollout.colocated:
        reserved = max(reserved, int((resident - offloaded) * slack) + engine_floor)
        if rollout.sleep_level == 0:
            reserved = max(reserved, int((resident + live) * slack) + engine_floor)
    return seconds, reserved, host


@lru_cache(maxsize=1024)
def _pairs(ctx: RLHFContext, point: RLHFOuterPoint, replayed: bool = False) -> tuple[tuple[float, int, int], ...]:
    """(score bound, knob variant, batch split) of every pair of an engine point, least bound first; ``ctx`` is
    that of the trainer's hardware. ``replayed``: bounds of the allocator replay's scores too (see
    :func:`replay_pairs`), not only of the screen's."""
    assert point.rollout is not None
    # the replay's budget is at most the one without a spread (a replayed plan's measured spread may be smaller)
    coef = replace(ctx.coef, reserved_spread=0.0) if replayed else ctx.coef
    budget, host_budget = gpu_budget_bytes(ctx.hardware, coef), ctx.hardware.cpu_memory_bytes
    zero3 = point.actor.zero_stage == 3
    engines = [_engine_part(ctx, variant, zero3) for variant in knob_variants(point.rollout)]
    trainers = [
        _trainer_bounds(ctx, point.actor, point.critic, point.reference, point.reward, False, batches)
        for batches in batch_choices(ctx.workload, ctx.hardware)
    ]
    pairs = []
    for v, engine in enumerate(engines):
        for i, part in enumerate(trainers):
            seconds, reserved, host = _combine(ctx, part, engine, replayed)
            pairs.append((penalized_score(seconds, reserved, budget, host, host_budget), v, i))
    return tuple(sorted(pairs))


def engine_bound(point: RLHFOuterPoint, workload: Workload, hardware: Hardware, coef: Coefficients) -> float:
    """A lower bound of the score ``best_inner_engine`` finds for ``point``, and of the score any of its variants
    replays at: the least bound of its pairs (a knob variant and a batch split each; :func:`replay_pairs`),
    tighter than the bound walk's per-model one, which takes each model's least over the splits on its own and
    the engine's fastest and smallest knobs apart."""
    assert point.rollout is not None
    return replay_pairs(rlhf_context(workload, trainer_hardware(hardware, point.rollout), coef), point)[0][0]


def replay_pairs(ctx: RLHFContext, point: RLHFOuterPoint) -> tuple[tuple[float, int, int], ...]:
    """:func:`_pairs` bounding the allocator replay's scores: memory from the trainer's resident and live bytes
    (no fragments, nothing the init left cached) against the budget without a spread. The bound walk passes a
    point over on it once enough points fit (:mod:`search.choose.rlhf_walk`), and the confirmation only replays
    the points the walk ranked: a bound from the screen's fragments passed over points the replay fits (issue
    42: qwen2.5-7b GRPO under --framework openrlhf, its ZeRO-2 point with checkpointing bounded 0.32 GiB over
    the budget, replayed fitting at 3.95 s against the plan's 4.08 s)."""
    return _pairs(ctx, point, True)


def best_inner_engine(point: RLHFOuterPoint, workload: Workload, hardware: Hardware, coef: Coefficients) -> Candidate:
    """``best_inner_rlhf`` for a point whose rollout runs on an engine: the least score over every knob variant,
    batch split, ``empty_cache`` policy and allocator (the first in that order among equals). The candidate's
    strategy carries the solved ``gpu_memory_utilization``."""
    assert point.rollout is not None
    trainer = trainer_hardware(hardware, point.rollout)
    ctx = rlhf_context(workload, trainer, coef)
    budget, host_budget = gpu_budget_bytes(trainer, coef), trainer.cpu_memory_bytes
    splits = batch_choices(workload, trainer)
    variants = knob_variants(point.rollout)
    pairs = _pairs(ctx, point)
    if pairs[0][0] >= INFEASIBLE_PENALTY_S:  # nothing here can fit: its closest of the most promising pairs
        pairs = pairs[:INFEASIBLE_PAIRS]
    best: tuple[float, int, int, int] | None = None
    chosen = None
    for bound, v, i in pairs:
        if best is not None and bound > best[0]:
            break
        strategy = rlhf_strategy_at(replace(point, rollout=variants[v]), splits[i])
        step = engine_step_of(ctx, strategy)
        for j, (policy, allocator) in enumerate(cache_choices(strategy.rollout)):
            reserved, seconds = score_step(step, policy, allocator, coef)
            score = penalized_score(seconds, reserved, budget, step.host_bytes, host_budget)
            if best is None or (score, v, i, j) < best:
                best, chosen = (score, v, i, j), (strategy, step, policy, allocator)
            if score <= bound * (1 + 1e-6):
                break  # the later cache choices of this pair can at best tie
    assert chosen is not None
    strategy, step, policy, allocator = chosen
    prediction = screen_step(step, policy, allocator, trainer, coef)
    assert strategy.rollout is not None
    solved = strategy.rollout.with_(gpu_memory_utilization=prediction.rollout["gpu_memory_utilization"])
    return Candidate(strategy.with_(empty_cache=policy, allocator=allocator, rollout=solved), prediction)

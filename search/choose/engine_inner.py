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

from search.choose.candidates import INFEASIBLE_PENALTY_S, Candidate, penalized_score
from search.choose.rlhf_space import RLHFOuterPoint, batch_choices, cache_choices, rlhf_strategy_at
from search.choose.rollout_space import engine_floor_bytes, knob_variants
from search.coefficients import Coefficients
from search.rlhf.job import RLHFContext, rlhf_context
from search.rlhf.models import place_models
from search.rlhf.step import reserved_floor, scoring_half, training_half
from search.rollout.engine import engine_limits, replica_sequences
from search.rollout.step import engine_step_of, offloadable_states, trainer_hardware
from search.rollout.timing import (
    engine_weight_bytes,
    offload_states_seconds,
    rollout_seconds,
    sleep_wake_seconds,
    weight_sync_seconds,
)
from search.step.assemble import finish_step, gpu_budget_bytes, score_step
from search.streams.sizes import weight_tensors
from store.records import Hardware, RLHFStrategy, Workload

INFEASIBLE_PAIRS = 12  # pairs built for a point none of whose pairs can fit (its score only ranks how close it is)


def step_bounds(ctx: RLHFContext, s: RLHFStrategy) -> tuple[float, int, int]:
    """Lower bounds of the step seconds, peak reserved bytes and host bytes of ``s`` (an engine strategy)
    before its engine is resolved: no fragments, the engine at the least it can take."""
    rollout = s.rollout
    assert rollout is not None
    w, job, coef, hw = ctx.workload, ctx.job, ctx.coef, ctx.hardware
    models = place_models(ctx, s.actor, s.critic, s.reference, s.reward, s.ema)
    scoring = scoring_half(ctx, models, s.generation_batch, 1)
    training = training_half(ctx, s.actor, s.critic, s.ema, s.micro_batch, s.grad_accum)
    tp = rollout.tensor_parallel
    sequences = replica_sequences(ctx, rollout)
    running = min(sequences, engine_limits(rollout.engine, hw.gpu_memory_bytes, hw.gpu.name).max_num_seqs)
    generate = job.generate_passes * rollout_seconds(
        w.model, sequences, job.prompt_len, job.gen_len, running, w.dtype, tp, rollout.enforce_eager, hw, coef
    )
    weights = int(engine_weight_bytes(w.model, w.dtype, tp))
    sleep = sleep_wake_seconds(weights, rollout.sleep_level, hw, coef) if rollout.colocated else 0.0
    offloaded = offloadable_states(models, rollout) if rollout.colocated else 0
    tensors = len(weight_tensors(w.model, w.dtype))
    zero3 = s.actor.zero_stage == 3
    sync = weight_sync_seconds(w.model, w.dtype, zero3, rollout.colocated, tp, tensors, hw, coef)
    halves = sum(scoring.time.values()) + sum(training.time.values())
    seconds = (halves + generate + sleep + offload_states_seconds(offloaded, hw, coef) + sync) * (1 - 1e-9)
    resident = sum(models.resident.values())
    # the trainer's phases with their least fragments (what the sleeping engine keeps only adds)
    reserved = reserved_floor(models, (scoring, training), coef, w.dtype)
    if rollout.colocated:
        engine = engine_floor_bytes(ctx, rollout)
        reserved = max(reserved, resident - offloaded + engine)
        if rollout.sleep_level == 0:
            reserved = max(reserved, resident + max(scoring.live, training.live) + engine)
    return seconds, reserved, models.host_bytes


def best_inner_engine(point: RLHFOuterPoint, workload: Workload, hardware: Hardware, coef: Coefficients) -> Candidate:
    """``best_inner_rlhf`` for a point whose rollout runs on an engine: the least score over every knob variant,
    batch split, ``empty_cache`` policy and allocator (the first in that order among equals). The candidate's
    strategy carries the solved ``gpu_memory_utilization``."""
    assert point.rollout is not None
    trainer = trainer_hardware(hardware, point.rollout)
    ctx = rlhf_context(workload, trainer, coef)
    budget, host_budget = gpu_budget_bytes(trainer, coef), trainer.cpu_memory_bytes
    pairs = []
    splits = batch_choices(workload, trainer)
    for v, variant in enumerate(knob_variants(point.rollout)):
        for i, batches in enumerate(splits):
            strategy = rlhf_strategy_at(replace(point, rollout=variant), batches)
            seconds, reserved, host = step_bounds(ctx, strategy)
            pairs.append((penalized_score(seconds, reserved, budget, host, host_budget), v, i, strategy))
    pairs.sort(key=lambda pair: pair[:3])
    if pairs[0][0] >= INFEASIBLE_PENALTY_S:  # nothing here can fit: its closest of the most promising pairs
        pairs = pairs[:INFEASIBLE_PAIRS]
    best: tuple[float, int, int, int] | None = None
    chosen = None
    for bound, v, i, strategy in pairs:
        if best is not None and bound > best[0]:
            break
        step = engine_step_of(ctx, strategy)
        for j, (policy, allocator) in enumerate(cache_choices()):
            reserved, seconds = score_step(step, policy, allocator, coef)
            score = penalized_score(seconds, reserved, budget, step.host_bytes, host_budget)
            if best is None or (score, v, i, j) < best:
                best, chosen = (score, v, i, j), (strategy, step, policy, allocator)
            if score <= bound * (1 + 1e-6):
                break  # the later cache choices of this pair can at best tie
    assert chosen is not None
    strategy, step, policy, allocator = chosen
    prediction = finish_step(step, policy, allocator, trainer, coef)
    assert strategy.rollout is not None
    solved = strategy.rollout.with_(gpu_memory_utilization=prediction.rollout["gpu_memory_utilization"])
    return Candidate(strategy.with_(empty_cache=policy, allocator=allocator, rollout=solved), prediction)

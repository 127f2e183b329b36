"""The RLHF strategy space: outer knobs (model layouts, hybrid engine) and inner knobs (batch splits, allocator).

Outer knobs choose where each model lives and how generation runs: the actor's and the critic's layouts
(ZeRO stage, offloads, checkpointing, LoRA rank shared by both) as for single-model training, the
reference and reward blocks (ZeRO-0, ZeRO-3, ZeRO-3 + offload) and the hybrid engine. Inner knobs scale
what a layout holds and are resolved exactly per outer point: prompts per generate call, the micro-batch
with its accumulation, the ``empty_cache`` policy and the allocator.

The last section splits a point into its models: a step's time is the sum of per-model times (each set by
that model's block alone) and its resident bytes the sum of per-model bytes, which lets the search bound a
whole point from a few dozen per-model pieces.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from search.batches import divisors as increasing_divisors
from search.choose.framework_space import framework_role_blocks, framework_runs_layouts
from search.choose.single_space import outer_points
from search.model.host import trained_host_bytes
from search.model.training_time import training_time
from search.rlhf.job import RLHFContext, rlhf_job
from search.rlhf.memory import experience_bytes, training_live
from search.rlhf.models import frozen_model, holds_role, role_micro_batch, trained_init_cached, trained_model
from search.rlhf.scoring import reference_is_actor, reference_may_be_actor, scores_actor
from search.rlhf.scoring_phase import scoring_forward
from search.rlhf.step import generation_phase
from search.rlhf.timing import ema_time, gae_seconds
from search.streams.phases import Live, trained_factor
from search.streams.workspaces import backward_workspace
from store.records import (
    ALLOCATORS,
    DTYPE_BYTES,
    EMPTY_CACHE_POLICIES,
    FrozenModelStrategy,
    Hardware,
    RLHFStrategy,
    TrainedModelStrategy,
    Workload,
)
from store.rollout import RolloutStrategy, refuses_expandable_segments
from store.workload_kinds import traits

FROZEN_BLOCKS: tuple[FrozenModelStrategy, ...] = (
    FrozenModelStrategy(0, "none"),
    FrozenModelStrategy(3, "none"),
    FrozenModelStrategy(3, "cpu"),
)
# simplest first: among equally fast choices the search keeps the earlier one
POLICIES: tuple[str, ...] = ("never", "every-step", "after-generation", "after-inference", "after-phase")
assert sorted(POLICIES) == sorted(EMPTY_CACHE_POLICIES)


@dataclass(frozen=True)
class RLHFOuterPoint:
    """One choice of the outer knobs of an RLHF step."""

    actor: TrainedModelStrategy
    critic: TrainedModelStrategy | None
    reference: FrozenModelStrategy
    reward: FrozenModelStrategy
    hybrid_engine: bool
    rollout: RolloutStrategy | None = None  # a vLLM/SGLang engine generates (then hybrid_engine is False)


def trained_layouts(workload: Workload, hardware: Hardware, lora_rank: int) -> list[TrainedModelStrategy]:
    """Every valid layout of a trained model (the single-model outer points of one LoRA rank)."""
    return [
        TrainedModelStrategy(p.zero_stage, p.offload_optimizer, p.offload_param, p.gradient_checkpointing, p.lora_rank)
        for p in outer_points(workload, hardware, (lora_rank,))
    ]


def frozen_blocks(hardware: Hardware) -> tuple[FrozenModelStrategy, ...]:
    """Blocks of a frozen model. On one GPU ZeRO-3 without offload partitions nothing: the same bytes plus a
    gathered module and never faster than ZeRO-0, so it is left out (it cannot be the unique optimum)."""
    if hardware.world_size == 1:
        return tuple(b for b in FROZEN_BLOCKS if not (b.zero_stage == 3 and b.offload == "none"))
    return FROZEN_BLOCKS


def role_blocks(workload: Workload, hardware: Hardware, role: str) -> tuple[FrozenModelStrategy, ...]:
    """The blocks searched for a frozen ``role``: :func:`frozen_blocks`, or only the first where the workload
    holds no such model (no reference at a KL coefficient of 0, no reward model with rule-based rewards): its
    block places nothing, and one stands for all."""
    blocks = frozen_blocks(hardware)
    return blocks if holds_role(workload, role) else blocks[:1]


def generation_options(
    rollouts: tuple[RolloutStrategy, ...] = (), deepspeed: bool = True
) -> tuple[tuple[bool, RolloutStrategy | None], ...]:
    """(hybrid_engine, rollout) pairs: DeepSpeed's generation with and without the hybrid engine, then each
    engine option (:func:`search.choose.rollout_space.rollout_options`)."""
    own = ((True, None), (False, None)) if deepspeed else ()
    return own + tuple((False, rollout) for rollout in rollouts)


def rlhf_outer_points(
    workload: Workload,
    hardware: Hardware,
    lora_ranks: tuple[int, ...] = (0,),
    generations: tuple[tuple[bool, RolloutStrategy | None], ...] = ((True, None), (False, None)),
) -> Iterator[RLHFOuterPoint]:
    """Every outer point in a fixed order (what the exhaustive search walks). LoRA applies to actor and critic.
    Only what the workload's framework runs: its frozen blocks beside each trained pair, the pairs its flags say
    (:mod:`search.choose.framework_space`)."""
    rlhf_job(workload, hardware)  # the workload must be an RLHF step whose batch splits over the GPUs
    references, rewards = role_blocks(workload, hardware, "reference"), role_blocks(workload, hardware, "reward")
    for rank in lora_ranks:
        layouts = trained_layouts(workload, hardware, rank)
        critics: list[TrainedModelStrategy | None] = list(layouts) if workload.has_critic else [None]
        for actor in layouts:
            for critic in critics:
                if not framework_runs_layouts(workload, actor, critic):
                    continue  # the framework's flags cannot say this pair (search.choose.framework_space)
                run_refs = framework_role_blocks(workload, "reference", actor, critic, references)
                for reference in run_refs:
                    for reward in framework_role_blocks(workload, "reward", actor, critic, rewards):
                        for hybrid_engine, rollout in generations:
                            yield RLHFOuterPoint(actor, critic, reference, reward, hybrid_engine, rollout)


def divisors(n: int) -> list[int]:
    """Divisors of ``n``, largest first."""
    return increasing_divisors(n)[::-1]


def batch_choices(workload: Workload, hardware: Hardware) -> list[tuple[int, int, int]]:
    """(generation_batch, micro_batch, grad_accum) that keep every batch exact, largest first."""
    job = rlhf_job(workload, hardware)
    sequences = job.sequences_per_gpu
    return [(g, m, sequences // m) for g in divisors(job.prompts_per_gpu) for m in divisors(sequences)]


def cache_choices(rollout: RolloutStrategy | None = None) -> list[tuple[str, str]]:
    """(empty_cache, allocator) pairs, simplest first. Beside a sleeping colocated vLLM engine the allocator stays
    ``default``: its ``CuMemAllocator`` refuses expandable segments (``store.rollout.refuses_expandable_segments``)."""
    allocators = ("default",) if refuses_expandable_segments(rollout) else ALLOCATORS
    return [(policy, allocator) for policy in POLICIES for allocator in allocators]


def rlhf_strategy_at(
    point: RLHFOuterPoint, batches: tuple[int, int, int], cache: tuple[str, str] = ("never", "default")
) -> RLHFStrategy:
    """The full strategy of an outer point with one inner choice (EMA stays off: it only costs)."""
    generation_batch, micro_batch, grad_accum = batches
    empty_cache, allocator = cache
    return RLHFStrategy(
        actor=point.actor,
        critic=point.critic,
        reference=point.reference,
        reward=point.reward,
        hybrid_engine=point.hybrid_engine,
        rollout=point.rollout,
        ema=False,
        generation_batch=generation_batch,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        empty_cache=empty_cache,
        allocator=allocator,
    )


def all_rlhf_strategies(
    workload: Workload, hardware: Hardware, lora_ranks: tuple[int, ...] = (0,)
) -> Iterator[RLHFStrategy]:
    """The whole space, outer x inner."""
    for point in rlhf_outer_points(workload, hardware, lora_ranks):
        for batches in batch_choices(workload, hardware):
            for cache in cache_choices(point.rollout):
                yield rlhf_strategy_at(point, batches, cache)


# --- per-model pieces: what the search bounds whole points with -------------------------------------------


def role_seconds(
    ctx: RLHFContext,
    role: str,
    block: TrainedModelStrategy | FrozenModelStrategy,
    hybrid_engine: bool,
    ema: bool,
    batches: tuple[int, int, int],
) -> float:
    """Seconds per step that one model costs under its block and a (generation batch, micro-batch,
    accumulation) split: the step's ``role_time[role]``, which depends on no other model's block."""
    generation_batch, micro_batch, grad_accum = batches
    if role in ("reference", "reward"):
        frozen = frozen_model(ctx, role, block)
        if frozen is None or (role == "reference" and reference_may_be_actor(ctx)):
            return 0.0  # TRL: a LoRA actor runs the reference pass, counted with the actor's seconds
        return scoring_forward(ctx, frozen, generation_batch, micro_batch)[1]
    placed = trained_model(ctx, role, block, 1)
    scores = (
        [scores_actor(ctx, grad_accum, False), reference_is_actor(ctx, placed.layout.lora_rank)]
        if role == "actor"
        else [1]
    )
    seconds = sum(scores) * scoring_forward(ctx, placed, generation_batch, micro_batch)[1]
    if role == "actor":
        seconds = generation_phase(ctx, placed, hybrid_engine, generation_batch).time_s + seconds
    w, job = ctx.workload, ctx.job
    trained = trained_model(ctx, role, block, grad_accum)
    trained_seconds = training_time(
        trained,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        seq_len=job.seq_len,
        dtype=w.dtype,
        hardware=ctx.hardware,
        coef=ctx.coef,
    )
    extra = ema_time(trained, w.dtype, ctx.hardware, ctx.coef) if (role == "actor" and ema) else 0.0
    return seconds + w.ppo_epochs * (trained_seconds.total + extra)


def shared_seconds(ctx: RLHFContext, batches: tuple[int, int, int]) -> float:
    """The per-call and per-micro-step overhead of a split, and PPO's advantage loop (the step's
    ``role_time["shared"]``)."""
    generation_batch, _, grad_accum = batches
    job, w = ctx.job, ctx.workload
    calls = job.prompts_per_gpu // generation_batch
    micro_steps = w.ppo_epochs * grad_accum * (2 if w.has_critic else 1)
    advantages = calls * gae_seconds(job.gen_len, ctx.coef) if traits(w.kind).gae_advantages else 0.0
    return ctx.coef.step_overhead_s * (calls * (job.generate_passes + 1) + micro_steps) + advantages


def role_live_floor(
    ctx: RLHFContext,
    role: str,
    block: TrainedModelStrategy | FrozenModelStrategy,
    hybrid_engine: bool,
    batches: tuple[int, int, int],
    generates: bool = True,
) -> int:
    """The least a model's own moments (its generation, scoring forward, training) add to the resident bytes
    under a split: their live bytes, which the step's stream requests beside the resident ones
    (:func:`search.streams.build.step_stream`), so a lower bound of the replay's peak reserved under every
    ``empty_cache`` policy and allocator. No fragments, nor what an engine's init left cached: an ``empty_cache``
    policy releases that, and the screen's fragment shares may overstate the replay's (issue 42: the bound walk
    pruned on them); the other model's gradients and a larger scoring factor only add."""
    coef = ctx.coef
    generation_batch, micro_batch, grad_accum = batches
    moments: list[tuple[Live, float]] = []
    if role in ("reference", "reward"):
        frozen = frozen_model(ctx, role, block)
        if frozen is None or (role == "reference" and reference_may_be_actor(ctx)):
            return 0  # a model the workload does not hold (or TRL's LoRA actor runs it): no moment of its own
        live, _, factor = scoring_forward(ctx, frozen, generation_batch, micro_batch)
        moments.append((live, factor))
    else:
        placed = trained_model(ctx, role, block, 1)
        if role != "actor" or scores_actor(ctx, grad_accum, False) or reference_is_actor(ctx, placed.layout.lora_rank):
            live, _, factor = scoring_forward(ctx, placed, generation_batch, micro_batch)
            moments.append((live, factor))
        if role == "actor" and generates:  # DeepSpeed's generation (a rollout engine's bytes only add)
            generation = generation_phase(ctx, placed, hybrid_engine, generation_batch)
            moments += [(m, generation.factor) for m in generation.moments]
        trained = trained_model(ctx, role, block, grad_accum)
        factor = trained_factor(trained, coef, training=True)
        batch = role_micro_batch(ctx, role, trained.layout.lora_rank, micro_batch)
        trained_moments = training_live(trained, None, batch)
        moments += [(m, factor) for m in trained_moments]
    return max(m.total for m, _ in moments)


def shared_bytes(ctx: RLHFContext) -> int:
    """Resident bytes that belong to no model's block: the cuBLAS workspaces (the forward's and the backward's,
    :mod:`search.streams.workspaces`) and the rollout buffer."""
    job = ctx.job
    rollout = experience_bytes(job.sequences_per_gpu, job.seq_len, ctx.workload.dtype)
    backward = sum(backward_workspace(ctx.coef).values())
    return int(ctx.coef.cublas_workspace_bytes) + backward + rollout


def role_bytes(
    ctx: RLHFContext, role: str, block: TrainedModelStrategy | FrozenModelStrategy
) -> tuple[int, float, int]:
    """(resident GPU bytes, offloaded host bytes per GPU, 16-bit bytes per GPU while loading) of one model."""
    n, d, coef = ctx.hardware.world_size, DTYPE_BYTES[ctx.workload.dtype], ctx.coef
    if role in ("reference", "reward"):
        frozen = frozen_model(ctx, role, block)
        if frozen is None or (role == "reference" and reference_may_be_actor(ctx)):
            return 0, 0, 0  # TRL: no copy where the actor is LoRA (a bound over every actor)
        return frozen.resident, frozen.host, d * frozen.params // (n if frozen.block.zero_stage == 3 else 1)
    p = trained_model(ctx, role, block, 1)
    resident = p.states.parameters + p.states.optimizer_states + p.persistent_gradients + p.buffers
    return resident, trained_host_bytes(p, coef), d * p.resident // (n if p.layout.zero_stage == 3 else 1)


def role_init_cached(ctx: RLHFContext, role: str, block: TrainedModelStrategy | FrozenModelStrategy) -> int:
    """What a trained model's engine init leaves cached (nothing for a frozen model's inference engine)."""
    if role in ("reference", "reward") or not isinstance(block, TrainedModelStrategy):
        return 0
    return trained_init_cached(trained_model(ctx, role, block, 1), ctx.workload.dtype)

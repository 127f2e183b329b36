"""The rollout engine of a step, resolved: its share of the GPU, its bytes, and how many sequences run at once.

A strategy may leave ``gpu_memory_utilization`` unset; then the planner solves for it. Every utilization in a
range works: from the least whose KV cache holds every sequence a replica generates at once (below it the
engine preempts and recomputes, or refuses to start) to the most whose footprint fits beside the trainer
while the engine is awake (above it the engine runs out of memory at start-up or at wake-up). The planner
takes the middle of that range, as far from one failure as from the other, and shows the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil, floor
from typing import Any

from search.coefficients import Coefficients
from search.rlhf.job import RLHFContext
from search.rollout.engine_memory import EngineMemory
from search.rollout.engine_setup import ENGINE_OWN_PROCESS as ENGINE_OWN_PROCESS
from search.rollout.engine_setup import EngineLimits as EngineLimits
from search.rollout.engine_setup import EngineSetup
from search.rollout.engine_setup import engine_limits as engine_limits
from search.rollout.engine_shape import EngineRefusal, context_bytes, weights_per_gpu
from search.rollout.solve import engine_memory, utilization_range
from store.records import ModelSpec
from store.rollout import RolloutStrategy


def engine_setup(
    rollout: RolloutStrategy, *, model: ModelSpec, dtype: str, gpu_memory_bytes: int, limits: EngineLimits
) -> EngineSetup:
    """One replica of ``rollout``'s engine as the planner starts it (a process of its own, the KV cache in the
    model's dtype)."""
    return EngineSetup(
        engine=rollout.engine,
        model=model,
        dtype=dtype,
        tensor_parallel=rollout.tensor_parallel,
        gpu_memory_bytes=gpu_memory_bytes,
        limits=limits,
        enforce_eager=rollout.enforce_eager,
        own_process=ENGINE_OWN_PROCESS,
    )


def engine_memory_at(
    rollout: RolloutStrategy,
    *,
    model: ModelSpec,
    dtype: str,
    gpu_memory_bytes: int,
    utilization: float,
    limits: EngineLimits,
    max_model_len: int,
    free_bytes_at_start: int,
    coef: Coefficients,
) -> EngineMemory | None:
    """One replica's bytes per GPU at ``utilization``; None where the engine would refuse to start."""
    setup = engine_setup(rollout, model=model, dtype=dtype, gpu_memory_bytes=gpu_memory_bytes, limits=limits)
    try:
        return engine_memory(
            setup, utilization, max_model_len=max_model_len, free_bytes_at_start=free_bytes_at_start, coef=coef
        )
    except EngineRefusal:
        return None


@dataclass(frozen=True)
class ResolvedEngine:
    """A rollout engine with its utilization fixed: its bytes per GPU and its share of the step's sequences."""

    rollout: RolloutStrategy  # ``gpu_memory_utilization`` filled in
    memory: EngineMemory
    sequences: int  # sequences one replica generates per step
    tokens_per_sequence: int  # prompt + generation
    max_running: int  # sequences it can run at once: its KV cache and max_num_seqs
    fitting: tuple[float, float] | None  # the utilizations that hold the rollout and fit (None: none do)
    notes: tuple[str, ...] = ()

    def report(self) -> dict[str, Any]:
        """What the plan says about its engine (``predicted.rollout`` in the JSON document)."""
        m = self.memory
        return {
            "engine": self.rollout.engine,
            "placement": self.rollout.placement,
            "tensor_parallel": self.rollout.tensor_parallel,
            "gpu_memory_utilization": self.rollout.gpu_memory_utilization,
            "fitting_utilization": list(self.fitting) if self.fitting else None,
            "sleep_level": self.rollout.sleep_level,
            "offload_training": self.rollout.offload_training,
            "enforce_eager": self.rollout.enforce_eager,
            "kv_cache_bytes": m.kv_cache,
            "kv_cache_tokens": m.kv_tokens,
            "needed_kv_tokens": self.sequences * self.tokens_per_sequence,
            "sequences_per_replica": self.sequences,
            "max_running_sequences": self.max_running,
            "weights_bytes": m.weights,
            "awake_bytes": m.awake,
            "asleep_bytes": m.asleep(self.rollout.sleep_level),
            "host_backup_bytes": m.host_backup(self.rollout.sleep_level),
        }


def utilization_span(
    ctx: RLHFContext, rollout: RolloutStrategy, running: int, room_bytes: int, free_at_start: int
) -> tuple[float, float] | None:
    """:func:`search.rollout.solve.utilization_range` for ``rollout`` on the trainer's GPU of ``ctx``: ``running``
    sequences of prompt + generation tokens at once, ``room_bytes`` beside the trainer, ``free_at_start`` free."""
    w, hw = ctx.workload, ctx.hardware
    limits = engine_limits(rollout.engine, hw.gpu_memory_bytes, hw.gpu.name, w.framework)
    setup = engine_setup(rollout, model=w.model, dtype=w.dtype, gpu_memory_bytes=hw.gpu_memory_bytes, limits=limits)
    return utilization_range(
        setup,
        sequences=running,
        tokens_per_sequence=ctx.job.seq_len,
        room_bytes=room_bytes,
        free_bytes_at_start=free_at_start,
        coef=ctx.coef,
    )


def refused_memory(
    rollout: RolloutStrategy,
    model: ModelSpec,
    dtype: str,
    gpu_memory_bytes: int,
    utilization: float,
    coef: Coefficients,
) -> EngineMemory:
    """An engine that would not start (its budget holds no KV cache): what it asks for, with its weights and
    its process's context, and a KV cache of nothing."""
    return EngineMemory(
        engine=rollout.engine,
        utilization=utilization,
        requested=ceil(gpu_memory_bytes * utilization),
        weights=weights_per_gpu(model, dtype, rollout.tensor_parallel),
        activation_peak=0,
        non_torch=0,
        kv_cache=0,
        kv_tokens=0,
        cuda_graphs=0,
        context=context_bytes(ENGINE_OWN_PROCESS, coef),
        outside=context_bytes(ENGINE_OWN_PROCESS, coef),
    )


def replica_sequences(ctx: RLHFContext, rollout: RolloutStrategy) -> int:
    """Sequences one engine replica generates per step (per generate pass).

    Colocated, a replica spans ``tensor_parallel`` training GPUs and generates their prompts; on GPUs of its
    own, the step's prompts of every node are shared among ``nodes x engine_gpus / tensor_parallel`` replicas."""
    job, w, hw = ctx.job, ctx.workload, ctx.hardware
    if rollout.colocated:
        return job.sequences_per_gpu * rollout.tensor_parallel
    replicas = hw.nodes * rollout.engine_gpus // rollout.tensor_parallel
    return ceil(w.global_batch * w.samples_per_prompt / replicas)


@lru_cache(maxsize=16384)
def resolve_engine(
    ctx: RLHFContext, rollout: RolloutStrategy, budget: int, rollout_trainer_bytes: int, trainer_peak: int
) -> ResolvedEngine:
    """The engine of ``rollout`` on the trainer of ``ctx``: ``budget`` is the GPU bytes a plan may use,
    ``rollout_trainer_bytes`` what the trainer keeps on a GPU while the engine generates, ``trainer_peak`` the
    most it holds in any phase (what an engine that never sleeps must fit beside)."""
    w, hw = ctx.workload, ctx.hardware
    sequences = replica_sequences(ctx, rollout)
    tokens = ctx.job.seq_len
    if rollout.colocated:
        beside = rollout_trainer_bytes if rollout.sleep_level else max(rollout_trainer_bytes, trainer_peak)
        room, free_at_start = budget - beside, max(0, hw.gpu_memory_bytes - beside)
    else:
        room, free_at_start = budget, hw.gpu_memory_bytes
    limits = engine_limits(rollout.engine, hw.gpu_memory_bytes, hw.gpu.name, w.framework)
    running = min(sequences, limits.max_num_seqs)

    def fitting_range(room_bytes: int) -> tuple[float, float] | None:
        return utilization_span(ctx, rollout, running, room_bytes, free_at_start)

    fitting = fitting_range(room)
    notes: list[str] = []
    if rollout.gpu_memory_utilization is not None:
        utilization = float(rollout.gpu_memory_utilization)
    elif fitting is not None:
        low, high = fitting
        utilization = floor((low + high) * 50 + 1e-6) / 100  # the middle, to the hundredth below
    else:
        least = fitting_range(2**62)  # what holds the rollout, whatever it leaves the trainer
        utilization = least[0] if least else 0.99
        notes.append(
            f"no {rollout.engine} utilization both holds the rollout's KV cache ({running} sequences of {tokens} "
            "tokens at once) and fits beside the trainer"
        )

    def memory_at(gpu_memory_bytes: int, free_bytes_at_start: int) -> EngineMemory | None:
        return engine_memory_at(
            rollout,
            model=w.model,
            dtype=w.dtype,
            gpu_memory_bytes=gpu_memory_bytes,
            utilization=utilization,
            limits=limits,
            max_model_len=tokens,
            free_bytes_at_start=free_bytes_at_start,
            coef=ctx.coef,
        )

    memory = memory_at(hw.gpu_memory_bytes, free_at_start)
    if memory is None:  # it would not start here: count what it asks for, so the plan does not fit
        notes.append(f"{rollout.engine} would refuse to start at utilization {utilization:.2f} beside the trainer")
        memory = memory_at(hw.gpu_memory_bytes, hw.gpu_memory_bytes)
    if memory is None:  # not even a whole free GPU starts it: what it asks for there, and no KV cache (issue 42)
        memory = refused_memory(rollout, w.model, w.dtype, hw.gpu_memory_bytes, utilization, ctx.coef)
    per_sequence = ceil(tokens / limits.block) * limits.block
    max_running = max(1, min(limits.max_num_seqs, memory.kv_tokens // per_sequence))
    if max_running < running:
        notes.append(
            f"the engine's KV cache holds {max_running} of the {running} sequences a replica runs at once: the "
            "rollout runs in waves"
        )
    return ResolvedEngine(
        rollout.with_(gpu_memory_utilization=utilization),
        memory,
        sequences,
        tokens,
        max_running,
        fitting,
        tuple(notes),
    )

"""The rollout engine of a step, resolved: its share of the GPU, its bytes, and how many sequences run at once.

A strategy may leave ``gpu_memory_utilization`` unset; then the planner solves for it. Every utilization in a
range works: from the least whose KV cache holds every sequence a replica generates at once (below it the
engine preempts and recomputes, or refuses to start) to the most whose footprint fits beside the trainer
while the engine is awake (above it the engine runs out of memory at start-up or at wake-up). The planner
takes the middle of that range, as far from one failure as from the other, and shows the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import Any

from search.rollout.engine_memory import (
    BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    EngineMemory,
    engine_memory,
    utilization_range,
)

from search.rlhf.job import RLHFContext
from store.rollout import RolloutStrategy

ENGINE_OWN_PROCESS = True  # OpenRLHF's engines are Ray actors: a process (and a CUDA context) of their own


@dataclass(frozen=True)
class ResolvedEngine:
    """A rollout engine with its utilization fixed: its bytes per GPU and its share of the step's sequences."""

    rollout: RolloutStrategy  # ``gpu_memory_utilization`` filled in
    memory: EngineMemory
    sequences: int  # sequences one replica generates per step
    tokens_per_sequence: int  # prompt + generation
    max_running: int  # sequences it can run at once: its KV cache and max_num_seqs
    fitting: tuple[float, float] | None  # the utilizations that hold the rollout and fit (None: none do)
    solved: bool  # the planner chose the utilization
    notes: tuple[str, ...] = ()

    def report(self) -> dict[str, Any]:
        """What the plan says about its engine (``predicted.rollout`` in the JSON document)."""
        m = self.memory
        return {
            "engine": self.rollout.engine,
            "placement": self.rollout.placement,
            "tensor_parallel": self.rollout.tensor_parallel,
            "gpu_memory_utilization": self.rollout.gpu_memory_utilization,
            "utilization_solved": self.solved,
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


def replica_sequences(ctx: RLHFContext, rollout: RolloutStrategy) -> int:
    """Sequences one engine replica generates per step (per generate pass).

    Colocated, a replica spans ``tensor_parallel`` training GPUs and generates their prompts; on GPUs of its
    own, the step's prompts of every node are shared among ``nodes x engine_gpus / tensor_parallel`` replicas."""
    job, w, hw = ctx.job, ctx.workload, ctx.hardware
    if rollout.colocated:
        return job.sequences_per_gpu * rollout.tensor_parallel
    replicas = hw.nodes * rollout.engine_gpus // rollout.tensor_parallel
    return ceil(w.global_batch * w.samples_per_prompt / replicas)


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
        room = budget - beside
        free_at_start = hw.gpu_memory_bytes - beside
    else:
        room, free_at_start = budget, hw.gpu_memory_bytes
    running = min(sequences, DEFAULT_MAX_NUM_SEQS)
    common = {
        "enforce_eager": rollout.enforce_eager,
        "own_process": ENGINE_OWN_PROCESS,
        "max_num_seqs": DEFAULT_MAX_NUM_SEQS,
        "max_num_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "max_model_len": tokens,
        "free_bytes_at_start": free_at_start,
    }
    fitting = utilization_range(
        rollout.engine,
        w.model,
        w.dtype,
        rollout.tensor_parallel,
        hw.gpu_memory_bytes,
        sequences=running,
        tokens_per_sequence=tokens,
        room_bytes=room,
        **common,
    )
    notes: list[str] = []
    solved = rollout.gpu_memory_utilization is None
    if not solved:
        utilization = float(rollout.gpu_memory_utilization)
    elif fitting is not None:
        low, high = fitting
        utilization = max(low, min(high, round((low + high) / 2 - 0.005, 2)))
    else:
        least = utilization_range(
            rollout.engine,
            w.model,
            w.dtype,
            rollout.tensor_parallel,
            hw.gpu_memory_bytes,
            sequences=running,
            tokens_per_sequence=tokens,
            room_bytes=hw.gpu_memory_bytes * 4,
            **common,
        )
        utilization = least[0] if least else 1.0
        notes.append(
            f"no {rollout.engine} gpu_memory_utilization both holds the rollout's KV cache ({running} sequences "
            f"of {tokens} tokens) and fits beside the trainer"
        )
    memory = engine_memory(
        rollout.engine, w.model, w.dtype, rollout.tensor_parallel, hw.gpu_memory_bytes, utilization, **common
    )
    per_sequence = ceil(tokens / BLOCK_SIZE) * BLOCK_SIZE
    max_running = max(1, min(DEFAULT_MAX_NUM_SEQS, memory.kv_tokens // per_sequence))
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
        solved,
        tuple(notes),
    )

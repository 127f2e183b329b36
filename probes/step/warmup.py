"""How many of a probe's steps are warm-up, and whether DeepSpeed's ZeRO-3 fetch trace was ready after them.

A probe runs ``request.steps`` steps in all (``planner probe --steps``): the first :func:`warmup_steps` are
warm-up (run, not measured), the rest are measured; at least one step is always measured.

- 1 warm-up step without ZeRO-3: it pays for the first allocations, cuBLAS handles and lazy inits.
- 2 warm-up steps when any engine runs ZeRO stage 3. Its ``PartitionedParameterCoordinator``
  (``deepspeed/runtime/zero/partitioned_param_coordinator.py``) starts with an INVALID trace; the forward
  pre-hook's ``reset_step`` turns it to RECORD at the first forward, so step 1's forward and backward are
  recorded (every parameter fetched and released on demand); at the next forward ``reset_step`` freezes
  the trace (COMPLETE) and step 2 is the first to prefetch by it, allocating the prefetch buffers on the
  way. Step 3 is the first steady one. (On an H100 the opt-1.3b ZeRO-3 step measured after one warm-up
  step was about twice the steady value.) A module order that changes (another forward path) invalidates
  the trace and it is recorded again; :func:`trace_complete` reports per stage-3 engine whether its trace
  was complete when the measured steps began (``extra["zero3_trace_complete"]``).

With fewer steps than that (``steps`` 2 and ZeRO-3) the warm-up is cut so one step is measured, and
:func:`warmup_steps` says so in a note (``extra["warmup_note"]``). Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from store.records import RLHFStrategy, Strategy

__all__ = ["WARMUP_STEPS", "ZERO3_WARMUP_STEPS", "trace_complete", "warmup_steps", "zero3_roles"]

WARMUP_STEPS = 1
ZERO3_WARMUP_STEPS = 2


def zero3_roles(strategy: Strategy | RLHFStrategy) -> tuple[str, ...]:
    """The engines that run ZeRO stage 3: ``model`` for a single-model strategy (DPO's own reference
    engine follows its stage), else the RLHF roles."""
    if isinstance(strategy, Strategy):
        return ("model",) if strategy.zero_stage == 3 else ()
    stages = {"actor": strategy.actor.zero_stage, "critic": strategy.critic.zero_stage if strategy.critic else None}
    stages.update(reference=strategy.reference.zero_stage, reward=strategy.reward.zero_stage)
    return tuple(role for role, stage in stages.items() if stage == 3)


def warmup_steps(strategy: Strategy | RLHFStrategy, steps: int) -> tuple[int, str | None]:
    """(warm-up steps out of ``steps``, a note when fewer than the strategy needs could be spared)."""
    roles = zero3_roles(strategy)
    needed = ZERO3_WARMUP_STEPS if roles else WARMUP_STEPS
    count = max(0, min(needed, steps - 1))
    if count == needed:
        return count, None
    why = f"ZeRO-3 ({', '.join(roles)}) records its parameter-fetch trace" if roles else "the first step warms up"
    note = (
        f"{steps} step(s) left {count} warm-up step(s) where {needed} are needed ({why}): the measured time "
        f"includes warm-up; probe with at least {needed + 1} steps"
    )
    return count, note


def trace_complete(engines: dict[str, Any]) -> dict[str, bool]:
    """For each ZeRO-3 engine of ``engines`` (role -> engine or None): is its fetch trace complete now?"""
    out: dict[str, bool] = {}
    for role, engine in engines.items():
        if engine is None or getattr(engine, "zero_optimization_stage", lambda: 0)() != 3:
            continue
        holder = getattr(engine.optimizer, "parameter_offload", engine.optimizer)  # trained: stage3 optimizer
        coordinator = getattr(holder, "get_param_coordinator", None)
        if coordinator is not None:
            out[role] = bool(coordinator().is_complete_trace())
    return out

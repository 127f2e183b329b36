"""The RLHF search space as the program that runs the plan allows it (``Workload.framework``): the frozen models'
blocks it builds beside the trained layouts, the trained layouts its flags can say, and what generates the
rollout. The rules themselves are :mod:`store.framework_placement` (read from each framework's source); here
they narrow the search's own choices, so a plan is never one the framework would run otherwise.
"""

from __future__ import annotations

from store.framework_placement import frozen_blocks_run, generation_family, generations_run, trained_refusal
from store.frameworks import reference_through_actor
from store.records import FrozenModelStrategy, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy


def framework_generations(
    framework: str, options: tuple[tuple[bool, RolloutStrategy | None], ...]
) -> tuple[tuple[bool, RolloutStrategy | None], ...]:
    """The (hybrid_engine, rollout) options ``framework`` generates with (``store.framework_placement``
    ``GENERATIONS_RUN``), in their order."""
    runs = generations_run(framework)
    return tuple((he, r) for he, r in options if generation_family(he, r.engine if r is not None else None) in runs)


def framework_role_blocks(
    workload: Workload,
    role: str,
    actor: TrainedModelStrategy,
    critic: TrainedModelStrategy | None,
    searched: tuple[FrozenModelStrategy, ...],
) -> tuple[FrozenModelStrategy, ...]:
    """The blocks to search for the frozen ``role`` beside these trained layouts: the framework's own
    (:func:`store.framework_placement.frozen_blocks_run`), or ``searched`` where it takes any, where the step holds
    no such model (``searched`` is then one block that places nothing), or where TRL's LoRA actor runs the
    reference with its adapters off (no copy of its own)."""
    held = workload.holds_reference if role == "reference" else workload.holds_reward_model
    if not held:
        return searched
    if role == "reference" and reference_through_actor(
        workload.framework, workload.kind, workload.holds_reference, actor.lora_rank
    ):
        return searched[:1]
    run = frozen_blocks_run(workload.framework, role, actor, critic)
    return searched if run is None else run


def framework_runs_layouts(
    workload: Workload, actor: TrainedModelStrategy, critic: TrainedModelStrategy | None
) -> bool:
    """Whether the framework's flags can say these trained layouts
    (:func:`store.framework_placement.trained_refusal`)."""
    return trained_refusal(workload.framework, actor, critic) is None

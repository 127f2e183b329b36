"""A plan's rollout engine as a framework that runs another engine would start it: the budget memplan predicts
for that engine under the same plan, never the planned engine's number under the other's name.

A GRPO plan may pick SGLang (``mem_fraction_static``); OpenRLHF 0.11.2 and TRL 1.16 run vLLM only
(``store.frameworks.ROLLOUT_ENGINES_RUN``). SGLang's fraction budgets what the trainer left free at the engine's
start (``search.rollout.sglang_rules``), vLLM's ``gpu_memory_utilization`` a share of the whole GPU whatever
others hold (``search.rollout.vllm_rules``): the same number means different bytes, and vLLM may refuse to start
at it. :func:`for_engine` re-solves the plan with the framework's engine and its utilization left open (the
planner's own solve, :func:`search.rlhf.engine.resolve_engine`), and says what it found, or that no budget of
that engine fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.predictor import predict
from store.records import Hardware, RLHFStrategy, Workload
from store.rollout import refuses_expandable_segments

__all__ = ["ENGINE_NAMES", "UTILIZATION_KEYS", "Retargeted", "for_engine"]

ENGINE_NAMES: dict[str, str] = {"vllm": "vLLM", "sglang": "SGLang"}
# the engine's own name of its budget (vLLM's EngineArgs, SGLang's ServerArgs)
UTILIZATION_KEYS: dict[str, str] = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}


@dataclass(frozen=True)
class Retargeted:
    """The strategy a framework runs (its engine, with memplan's budget for it) and what changed, one line each."""

    strategy: RLHFStrategy
    lines: tuple[str, ...] = ()


def for_engine(
    workload: Workload,
    strategy: RLHFStrategy,
    hardware: Hardware,
    engine: str,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> Retargeted:
    """``strategy`` with its rollout on ``engine`` at the utilization memplan predicts for ``engine`` under the
    same plan; the strategy itself when it has no rollout engine or already runs ``engine``.

    Where no utilization of ``engine`` both holds the rollout and fits beside the trainer, the utilization is left
    open (the export then says the framework's default applies) and the line says the engine differs. A colocated
    vLLM that sleeps gets the default allocator (its ``CuMemAllocator`` refuses expandable segments:
    ``store.rollout.refuses_expandable_segments``)."""
    rollout = strategy.rollout
    if rollout is None or rollout.engine == engine:
        return Retargeted(strategy)
    planned, target = ENGINE_NAMES[rollout.engine], ENGINE_NAMES[engine]
    planned_budget = rollout.gpu_memory_utilization
    said = f"{UTILIZATION_KEYS[rollout.engine]} {planned_budget:g}" if planned_budget is not None else "its budget"
    moved = rollout.with_(engine=engine, gpu_memory_utilization=None)
    allocator = "default" if refuses_expandable_segments(moved) else strategy.allocator
    trial = replace(strategy, rollout=moved, allocator=allocator)
    prediction = predict(workload, trial, hardware, coef)
    solved = prediction.rollout.get("gpu_memory_utilization")
    fitting = prediction.rollout.get("fitting_utilization")
    key = UTILIZATION_KEYS[engine]
    if not fitting or solved is None or not prediction.fits:
        return Retargeted(
            trial,
            (
                f"the engine differs: the plan's {planned} ({said}) runs here as {target}, and memplan predicts no "
                f"{target} {key} that holds the rollout and fits beside the trainer under this plan; plan for this "
                f"framework (its --framework) to get a {target} plan",
            ),
        )
    chosen = replace(trial, rollout=moved.with_(gpu_memory_utilization=solved))
    allocator_note = (
        f"; allocator default (the plan's {strategy.allocator} cannot run beside a sleeping vLLM)"
        if allocator != strategy.allocator
        else ""
    )
    return Retargeted(
        chosen,
        (
            f"the plan's {planned} engine ({said}) runs here as {target} at {key} {solved:g}: memplan's prediction "
            f"for {target} under the same plan (it fits from {fitting[0]:g} to {fitting[1]:g}; peak reserved "
            f"{prediction.peak_reserved_bytes / 2**30:.2f} GiB, step {prediction.step_time_s:.2f} s){allocator_note}, "
            f"not {planned}'s number",
        ),
    )

"""A step's phases, resident bytes and seconds turned into a Prediction under an ``empty_cache`` policy.

Single-model training and RLHF both end here: :class:`Step` holds everything about a strategy except its
``empty_cache`` policy and allocator, which only move fragments (and the cost of releasing them), so a
search shares one Step between those choices (:func:`score_step`). :func:`screen_step` assembles the search's
screen Prediction (fragment coefficients); :func:`search.step.finish.finish_step` the replayed one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from search.coefficients import Coefficients
from search.model.host import HostMemory
from search.prediction import PhasePrediction, Prediction
from search.step.fragments import Structure, apply_policy
from search.streams.build import Engines
from search.streams.phases import StepPhase
from search.streams.sizes import Sizes
from store.records import Hardware


def gpu_budget_bytes(hardware: Hardware, coef: Coefficients) -> int:
    """GPU bytes a plan's peak reserved may reach: the GPU's memory less the CUDA context and the larger of
    two headrooms, the safety margin (a share of the GPU's memory) and the spread of peak reserved memory
    between programs around the same step (``coef.reserved_spread`` of the plan's peak reserved: reserved x
    (1 + spread) must fit beside the context)."""
    beside_context = hardware.gpu_memory_bytes - coef.cuda_context_bytes
    usable = min(
        hardware.gpu_memory_bytes * (1.0 - hardware.safety_margin) - coef.cuda_context_bytes,
        beside_context / (1.0 + coef.reserved_spread),
    )
    return max(0, int(usable))


@dataclass(frozen=True)
class Step:
    """A strategy's step before its ``empty_cache`` policy and allocator are applied."""

    resident: dict[str, int]  # bytes resident through every phase, by breakdown name
    phases: tuple[StepPhase, ...]
    repeats: dict[str, int]  # runs of each phase group per step
    host: HostMemory  # host memory per node by phase and part (search.model.host); later parts add theirs
    host_states: int  # Prediction.host_states_bytes
    time: dict[str, float]  # seconds per step by activity, without empty_cache
    notes: tuple[str, ...] = ()
    role_time: dict[str, float] = field(default_factory=dict)  # RLHF: the same seconds by model
    time_terms: dict[str, float] = field(default_factory=dict)  # the same seconds by mechanism
    init_cached: int = 0  # bytes DeepSpeed's engine init left cached (search.model.states.init_cached_bytes)
    resident_sizes: Sizes = ()  # the tensor sizes each resident part was requested in (search.streams.sizes)
    engines: Engines = ()  # each trained engine's init and first-step allocations (search.streams.build)
    # RLHF with a rollout engine on GPUs of its own (search.rollout): what each of those GPUs holds
    separate_gpu_bytes: int = 0
    rollout: dict[str, Any] = field(default_factory=dict)  # the rollout engine's report (Prediction.rollout)
    base_time_s: float = 0.0  # sum of ``time`` (derived)
    resident_bytes: int = 0  # sum of ``resident`` (derived)
    peak_allocated_bytes: int = 0  # resident plus the largest phase's live bytes (derived)
    structure: Structure = ()  # what the release plan depends on (derived)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_time_s", sum(self.time.values()))
        object.__setattr__(self, "resident_bytes", sum(self.resident.values()))
        object.__setattr__(self, "peak_allocated_bytes", self.resident_bytes + max(ph.live for ph in self.phases))
        structure = tuple((ph.name, ph.group, self.repeats[ph.group] > 1) for ph in self.phases)
        object.__setattr__(self, "structure", structure)

    @property
    def host_bytes(self) -> int:
        """Host memory per node: the largest of the host's phases."""
        return self.host.bytes


def reserved_floor(resident: int, phases: tuple[StepPhase, ...], coef: Coefficients, init_cached: int = 0) -> int:
    """The least peak reserved bytes any ``empty_cache`` policy and allocator can give a step: with
    ``after-phase`` no phase finds another's fragments, and expandable segments shrink its own; what the
    engines' init left cached is there whatever the policy (:func:`search.step.fragments.apply_policy`)."""
    within = coef.frag_expandable_factor * coef.frag_within_step
    return max(
        resident + live + int(within * phase.factor * transient + 0) + max(0, init_cached - activations)
        for phase in phases
        for (live, transient), activations in zip(phase.moment_bytes, phase.moment_activations, strict=True)
    )


def score_step(step: Step, empty_cache: str, allocator: str, coef: Coefficients) -> tuple[int, float]:
    """(peak reserved bytes, step seconds) of a step under a policy: what :func:`screen_step` would report."""
    reserved, _, cache_seconds, _ = apply_policy(
        step.phases, step.structure, step.resident_bytes, empty_cache, allocator, coef, step.init_cached
    )
    return max(max(reserved), step.separate_gpu_bytes), step.base_time_s + cache_seconds


def screen_step(step: Step, empty_cache: str, allocator: str, hardware: Hardware, coef: Coefficients) -> Prediction:
    """The search's screen: the Prediction with peak reserved from the fragment coefficients
    (:func:`search.step.fragments.apply_policy`), cheap enough for every inner choice of every point a search
    meets. A plan's own prediction replays its step instead (:func:`search.step.finish.finish_step`)."""
    reserved, chosen, cache_seconds, own = apply_policy(
        step.phases, step.structure, step.resident_bytes, empty_cache, allocator, coef, step.init_cached
    )
    return assemble(step, reserved, chosen, own, cache_seconds, hardware, coef, reserved_from="screen")


def assemble(
    step: Step,
    reserved: list[int],
    chosen: list[int],
    need: list[int],
    cache_seconds: float,
    hardware: Hardware,
    coef: Coefficients,
    *,
    reserved_from: str,
    inactive_split: list[int] | None = None,
    screen_reserved: int = 0,
) -> Prediction:
    """The Prediction of a step whose peak reserved bytes per phase (``reserved``) and ``empty_cache`` seconds
    are known. ``chosen``: the moment of each phase the breakdown shows; ``need``: what breaks ties between
    phases at the same reserved bytes (the phase that set the peak). The breakdown is that of the peak phase's
    chosen moment and sums to its peak reserved bytes."""
    phases = step.phases
    allocated = [step.resident_bytes + phase.live for phase in phases]
    # the peak phase is the one whose own need sets the step's peak (later phases find it reserved)
    peak = max(range(len(phases)), key=lambda i: (reserved[i], need[i], allocated[i]))
    moment = phases[peak].moments[chosen[peak]]
    breakdown = dict(step.resident)
    for name, value in moment.as_dict().items():
        breakdown[name] = breakdown.get(name, 0) + value
    breakdown["fragmentation"] = reserved[peak] - step.resident_bytes - moment.total
    peak_phase = phases[peak].name
    if step.separate_gpu_bytes > max(reserved):  # the engine's own GPUs hold the most
        breakdown, peak_phase = {"rollout_engine": step.separate_gpu_bytes}, "generation"
    split = inactive_split or [0] * len(phases)
    return Prediction(
        peak_allocated_bytes=max(max(allocated), step.separate_gpu_bytes),
        peak_reserved_bytes=max(max(reserved), step.separate_gpu_bytes),
        gpu_budget_bytes=gpu_budget_bytes(hardware, coef),
        host_bytes=step.host.bytes,
        host_breakdown=step.host.breakdown,
        host_peak_phase=step.host.peak_phase,
        host_phases=step.host.totals,
        host_states_bytes=step.host_states,
        host_budget_bytes=hardware.cpu_memory_bytes,
        step_time_s=step.base_time_s + cache_seconds,
        breakdown=breakdown,
        phases=tuple(
            PhasePrediction(ph.name, allocated[i], reserved[i], ph.time_s, ph.count, split[i])
            for i, ph in enumerate(phases)
        ),
        peak_phase=peak_phase,
        rollout=dict(step.rollout),
        time_breakdown=dict(step.time, empty_cache=cache_seconds),
        time_terms=dict(step.time_terms, empty_cache=cache_seconds) if cache_seconds else dict(step.time_terms),
        reserved_uncertainty=coef.reserved_spread,
        notes=step.notes,
        reserved_from=reserved_from,
        screen_reserved_bytes=max(screen_reserved, step.separate_gpu_bytes) if screen_reserved else 0,
    )

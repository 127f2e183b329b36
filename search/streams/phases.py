"""The phases of a step before the allocator is applied: what each moment adds to the resident bytes.

The shape every stream is built from (:mod:`search.streams.build`) and every step is assembled from
(:mod:`search.step`): it sits below both.

A phase is a tuple of ``Live`` moments (the bytes that exist only then: gradients between micro-steps,
gathered parameters, activations, logits, KV cache, hybrid-engine workspace, DeepSpeed's transient buckets)
and how many of them go through torch's caching allocator (``transient``: what leaves fragments), with the
fragmentation multiplier of the layouts that run in it. Single-model training (:mod:`search.single`) and
RLHF (:mod:`search.rlhf`) both describe their steps this way; :mod:`search.step.fragments` and
:mod:`search.step.assemble` turn them into a Prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.coefficients import Coefficients
from search.model.moment_parts import Moment, NamedTensors
from search.model.placement import FrozenPlacement, TrainedPlacement
from search.streams.sizes import Sizes

LIVE_PARTS = (
    "gradients",
    "zero3_gathered",
    "activations",
    "logits",
    "kv_cache",
    "hybrid_engine",
    "buffers",
    # a vLLM/SGLang rollout engine's bytes on the trainer's GPU (search.rollout): outside the trainer's allocator
    "rollout_engine",
    # the trainer's states DeepSpeed's offload_states moved to the host for the rollout: negative, outside torch
    "offloaded_states",
)
OUTSIDE_TORCH_PARTS = ("hybrid_engine", "rollout_engine", "offloaded_states")
# Groups of phases repeated together within a step: generate/scoring calls; training micro-steps.
INFERENCE, TRAINING, OPTIMIZER = "inference", "training", "optimizer"


@dataclass(frozen=True)
class Live:
    """What one moment of a phase adds to the resident bytes."""

    parts: tuple[int, ...]  # bytes per LIVE_PARTS name
    transient: int  # of which allocated and freed through torch's caching allocator within the phase

    @property
    def total(self) -> int:
        return sum(self.parts)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(LIVE_PARTS, self.parts, strict=True))


def live(
    *,
    gradients: int = 0,
    zero3_gathered: int = 0,
    activations: int = 0,
    logits: int = 0,
    kv_cache: int = 0,
    hybrid_engine: int = 0,
    buffers: int = 0,
    rollout_engine: int = 0,
    offloaded_states: int = 0,
    transient: int,
) -> Live:
    parts = (gradients, zero3_gathered, activations, logits, kv_cache, hybrid_engine, buffers)
    return Live((*parts, rollout_engine, offloaded_states), int(transient))


def live_of(parts: Moment, steady: int) -> Live:
    """A training moment as Live bytes: what is beyond the ``steady`` bytes (gradients kept between
    micro-steps) is allocated and freed within the phase."""
    return live(**parts, transient=max(0, sum(parts.values()) - steady))


@dataclass(frozen=True)
class StepPhase:
    """One phase of a step before the allocator's policy is applied."""

    name: str
    group: str  # INFERENCE or TRAINING: phases repeated together (generate calls; micro-steps)
    moments: tuple[Live, ...]
    factor: float  # fragmentation multiplier of the layouts that run in it (ZeRO-3, offload, recompute)
    carry: float  # share of its transient bytes left cached as fragments for later phases
    time_s: float  # per step
    count: int  # runs per step
    transient: int = 0  # the most bytes it allocates and frees at once (derived)
    live: int = 0  # the most bytes it adds to the resident ones (derived)
    moment_bytes: tuple[tuple[int, int], ...] = ()  # (live, transient) of each moment (derived)
    moment_activations: tuple[int, ...] = ()  # activation bytes of each moment (derived)
    sizes: Sizes = ()  # the tensor sizes each live part is requested in (search.streams.sizes)
    moment_sizes: tuple[Sizes, ...] = ()  # per moment, where the moments are different models' (scoring)
    kv_layers: int = 0  # generation: layers whose K and V grow token by token in torch's allocator
    # torch.cuda.empty_cache() runs right before it whatever the policy (a colocated rollout engine's turn:
    # DeepSpeed's offload_states and the frameworks empty the trainer's cache before the engine wakes)
    fresh: bool = False
    engine_bytes: tuple[int, ...] = ()  # per moment, a rollout engine's bytes: outside torch's allocator (derived)
    moment_named: tuple[NamedTensors, ...] = ()  # per moment, tensors held by name (search.streams.build)

    def __post_init__(self) -> None:
        if self.moment_named and len(self.moment_named) != len(self.moments):
            raise ValueError(f"{self.name}: named tensors for {len(self.moment_named)} of {len(self.moments)} moments")
        for named, m in zip(self.moment_named, self.moments, strict=False):
            for part in {t.part for t in named}:
                held = sum(t.size for t in named if t.part == part)
                if held > m.parts[LIVE_PARTS.index(part)]:
                    raise ValueError(f"{self.name}: named {part} tensors hold more than the moment's {part} bytes")
        moment_bytes = tuple((m.total, m.transient) for m in self.moments)
        activations = LIVE_PARTS.index("activations")
        object.__setattr__(self, "moment_activations", tuple(m.parts[activations] for m in self.moments))
        object.__setattr__(self, "moment_bytes", moment_bytes)
        engine = LIVE_PARTS.index("rollout_engine")
        object.__setattr__(self, "engine_bytes", tuple(m.parts[engine] for m in self.moments))
        object.__setattr__(self, "transient", max(transient for _, transient in moment_bytes))
        object.__setattr__(self, "live", max(live for live, _ in moment_bytes))


def layout_factor(coef: Coefficients, *, zero3: bool, offload: bool, checkpointing: bool = False) -> float:
    factor = coef.frag_zero3_factor if zero3 else 1.0
    if offload:
        factor *= coef.frag_offload_factor
    if checkpointing:
        factor *= coef.frag_checkpointing_factor
    return factor


def trained_factor(p: TrainedPlacement, coef: Coefficients, *, training: bool) -> float:
    """How much a trained model's layout multiplies fragments (recompute only counts while training)."""
    s = p.layout
    offload = s.offload_optimizer != "none" or s.offload_param != "none"
    return layout_factor(
        coef, zero3=s.zero_stage == 3, offload=offload, checkpointing=training and s.gradient_checkpointing
    )


def frozen_factor(p: FrozenPlacement, coef: Coefficients) -> float:
    """How much a frozen model's block multiplies fragments."""
    return layout_factor(coef, zero3=p.block.zero_stage == 3, offload=p.block.offload != "none")

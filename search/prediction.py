"""What the cost model returns: frozen records in the shape of docs/contracts.md's ``predicted`` block."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class PhasePrediction:
    """One phase of a training step (forward, backward, optimizer step, generation, ...)."""

    name: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    time_s: float
    count: int = 1  # how many times the phase runs per optimizer step
    # peak bytes of free blocks inside split segments (reserved, unusable for a larger request): the replay's
    inactive_split_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "inactive_split_bytes": self.inactive_split_bytes,
            "time_s": round(self.time_s, 6),
            "count": self.count,
        }


@dataclass(frozen=True)
class Prediction:
    """Predicted memory (per GPU), host memory (per node) and time (per optimizer step) of a strategy."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    gpu_budget_bytes: int
    host_bytes: int
    host_budget_bytes: int
    step_time_s: float
    breakdown: dict[str, int]
    phases: tuple[PhasePrediction, ...]
    peak_phase: str
    time_breakdown: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # Bytes per GPU of the tensors DeepSpeed keeps in host memory: offloaded optimizer states (and
    # parameters) with the pinned staging buffers beside them, without the estimators' slack factor that
    # ``host_bytes`` applies. On the CPU backend these live in the same memory as the "device" tensors.
    host_states_bytes: int = 0
    # Host bytes per node of the phase that sets ``host_bytes`` (search.model.host: ``steady`` through training
    # or ``loading`` before it, never both at once), by part; the parts sum to ``host_bytes``.
    host_breakdown: dict[str, int] = field(default_factory=dict)
    host_peak_phase: str = "steady"
    host_phases: dict[str, int] = field(default_factory=dict)  # bytes per node of each host phase
    # Seconds per step by mechanism (search.model.roofline terms: matmul, elementwise, host_launch, ...).
    time_terms: dict[str, float] = field(default_factory=dict)
    # Relative spread of peak reserved bytes between programs around the same step (``reserved_spread``).
    reserved_uncertainty: float = 0.0
    # What ``reserved_uncertainty`` rests on: the plan's mechanisms, the measured records nearest them and how
    # many, their largest under-prediction and the margin (search.spread.measured.MeasuredSpread.to_dict)
    reserved_spread_basis: dict[str, Any] = field(default_factory=dict)
    # RLHF with a vLLM/SGLang rollout engine: its settings (the solved gpu_memory_utilization), KV cache and
    # bytes (search.rlhf.engine.ResolvedEngine.report); empty otherwise
    rollout: dict[str, Any] = field(default_factory=dict)
    # Where peak reserved comes from: "replay" (the step's allocation stream through the port of torch's
    # caching allocator, search.step.finish) or "screen" (the fragment coefficients a search ranks with)
    reserved_from: str = "replay"
    # The screen's peak reserved bytes beside a replayed prediction (0 when not computed): how far the
    # fragment coefficients the search ranks with were from the replay
    screen_reserved_bytes: int = 0

    @property
    def dominant_time_term(self) -> str:
        """The mechanism that takes most of the step's seconds ("" when none is known)."""
        return max(self.time_terms, key=lambda name: self.time_terms[name]) if self.time_terms else ""

    @property
    def fits_gpu(self) -> bool:
        return self.peak_reserved_bytes <= self.gpu_budget_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_bytes <= self.host_budget_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

    @property
    def headroom_bytes(self) -> int:
        return self.gpu_budget_bytes - self.peak_reserved_bytes

    def on_cpu_backend(self) -> Prediction:
        """What a run on DeepSpeed's CPU accelerator would show: one memory for device and host tensors.

        Every phase's live bytes gain the host-resident states (offloaded optimizer states and their
        pinned buffers, :attr:`host_states_bytes`), and reserved equals allocated: the CPU has no caching
        allocator, so no fragments. Compute with coefficients that drop the CUDA-only bytes (context,
        cuBLAS workspace). The times are the GPU model's and mean nothing on the CPU.
        """
        host = self.host_states_bytes
        phases = tuple(
            replace(
                phase,
                peak_allocated_bytes=phase.peak_allocated_bytes + host,
                peak_reserved_bytes=phase.peak_allocated_bytes + host,
                inactive_split_bytes=0,
            )
            for phase in self.phases
        )
        peak = max(phases, key=lambda phase: phase.peak_allocated_bytes) if phases else None
        # the breakdown stays the device one at the GPU model's peak phase, plus the host-resident states
        breakdown = dict(self.breakdown, host_states=host, fragmentation=0)
        allocated = peak.peak_allocated_bytes if peak else self.peak_allocated_bytes + host
        return replace(
            self,
            peak_allocated_bytes=allocated,
            peak_reserved_bytes=allocated,
            peak_phase=peak.name if peak else self.peak_phase,
            breakdown=breakdown,
            phases=phases,
            notes=self.notes + ("CPU backend: host-resident states counted with device tensors; no fragments",),
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``predicted`` block of the JSON document (bytes as integers)."""
        return {
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "gpu_budget_bytes": self.gpu_budget_bytes,
            "host_bytes": self.host_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "host_breakdown": dict(self.host_breakdown),
            "host_peak_phase": self.host_peak_phase,
            "host_phases": dict(self.host_phases),
            "step_time_s": round(self.step_time_s, 6),
            "peak_phase": self.peak_phase,
            "breakdown": dict(self.breakdown),
            "time_breakdown": {k: round(v, 6) for k, v in self.time_breakdown.items()},
            "time_terms": {k: round(v, 6) for k, v in self.time_terms.items()},
            "dominant_time_term": self.dominant_time_term,
            "reserved_uncertainty": self.reserved_uncertainty,
            "reserved_spread_basis": dict(self.reserved_spread_basis) or None,
            "reserved_from": self.reserved_from,
            "screen_reserved_bytes": self.screen_reserved_bytes,
            "phases": [phase.to_dict() for phase in self.phases],
            "notes": list(self.notes),
        } | ({"rollout": dict(self.rollout)} if self.rollout else {})

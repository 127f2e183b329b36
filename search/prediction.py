"""What the cost model returns: frozen records in the shape of DESIGN.md's ``predicted`` block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PhasePrediction:
    """One phase of a training step (forward, backward, optimizer step, generation, ...)."""

    name: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    time_s: float
    count: int = 1  # how many times the phase runs per optimizer step

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
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

    def to_dict(self) -> dict[str, Any]:
        """The ``predicted`` block of the JSON document (bytes as integers)."""
        return {
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "gpu_budget_bytes": self.gpu_budget_bytes,
            "host_bytes": self.host_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "step_time_s": round(self.step_time_s, 6),
            "peak_phase": self.peak_phase,
            "breakdown": dict(self.breakdown),
            "time_breakdown": {k: round(v, 6) for k, v in self.time_breakdown.items()},
            "phases": [phase.to_dict() for phase in self.phases],
            "notes": list(self.notes),
        }

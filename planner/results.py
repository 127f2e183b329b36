"""Typed results of the Python API; ``.model_dump()`` is the JSON document of DESIGN.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from planner.files import write_json_atomic


class PhaseReport(BaseModel):
    """One phase of the step."""

    model_config = ConfigDict(frozen=True)

    name: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    time_s: float
    count: int = 1


class Predicted(BaseModel):
    """The ``predicted`` block: per GPU (host bytes per node), bytes as integers."""

    model_config = ConfigDict(frozen=True)

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    gpu_budget_bytes: int
    host_bytes: int
    host_budget_bytes: int
    step_time_s: float
    peak_phase: str
    breakdown: dict[str, int]
    time_breakdown: dict[str, float]
    phases: list[PhaseReport]
    notes: list[str] = []


class Alternative(BaseModel):
    """Another strategy with its prediction."""

    model_config = ConfigDict(frozen=True)

    strategy: dict[str, Any]
    predicted: Predicted


class PredictionReport(BaseModel):
    """What ``predict`` returns: one fixed strategy and its prediction."""

    model_config = ConfigDict(frozen=True)

    workload: dict[str, Any]
    hardware: dict[str, Any]
    strategy: dict[str, Any]
    fits: bool
    predicted: Predicted
    ds_config: dict[str, Any]
    outside_settings: dict[str, str]
    readings: list[str] = []

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write the DeepSpeed config to ``path`` atomically (refuses to overwrite unless ``force``)."""
        return write_json_atomic(Path(path), self.ds_config, force=force)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


class Plan(PredictionReport):
    """What ``recommend`` returns: the chosen strategy, its prediction, config and the alternatives."""

    plan_id: str | None = None
    alternatives: list[Alternative] = []
    fastest_ignoring_memory: Alternative | None = None
    overhead_vs_fastest: float | None = None
    suggestions: list[str] = []
    search: dict[str, Any] = {}


class CheckResult(BaseModel):
    """What ``check`` returns: whether a given DeepSpeed config is predicted to fit."""

    model_config = ConfigDict(frozen=True)

    fits: bool
    reasons: list[str]
    report: PredictionReport

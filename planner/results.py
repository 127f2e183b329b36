"""Typed results of the Python API; ``.model_dump()`` is the JSON document of DESIGN.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from planner.files import write_configs


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
    ds_config: dict[str, Any] | None = None  # single-model workloads
    ds_configs: dict[str, dict[str, Any]] | None = None  # RLHF: one per model (actor, critic, reference, reward)
    outside_settings: dict[str, str]
    launch: dict[str, list[str]] = {}  # RLHF: ready-to-paste flags per framework (deepspeed_chat, openrlhf)
    launch_gaps: dict[str, list[str]] = {}  # what a framework's flags cannot express of the strategy
    readings: list[str] = []

    @model_serializer(mode="wrap")
    def _one_config_key(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The document carries ``ds_config`` or ``ds_configs``, never a null one."""
        data = handler(self)
        for key in ("ds_config", "ds_configs"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def save(self, path: str | Path, *, force: bool = False) -> list[Path]:
        """Write the DeepSpeed config(s) atomically; RLHF writes ``<stem>.<model>.json`` beside ``path``.

        Refuses to overwrite any existing file unless ``force``; writes all files or none.
        """
        return write_configs(Path(path), self.ds_config if self.ds_config is not None else self.ds_configs, force=force)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


class Plan(PredictionReport):
    """What ``recommend`` returns: the chosen strategy, its prediction, config and the alternatives."""

    plan_id: str | None = None
    alternatives: list[Alternative] = []
    fastest_ignoring_memory: Alternative | None = None
    overhead_vs_fastest: float | None = None
    suggestions: list[str] = []
    empty_cache_effect: dict[str, Any] | None = None
    search: dict[str, Any] = {}


class CheckResult(BaseModel):
    """What ``check`` returns: whether a given DeepSpeed config is predicted to fit."""

    model_config = ConfigDict(frozen=True)

    fits: bool
    reasons: list[str]
    report: PredictionReport

"""Typed results of the Python API; ``.model_dump()`` is the JSON document of docs/contracts.md.

Every document that a command prints with ``--json`` (``Plan``, ``PredictionReport``, ``CheckResult``,
``ProbeReport``, ``TuneReport``) carries ``schema_version``: its JSON Schema is committed under
``planner/schema/`` (``python -m planner.schema --write``; docs/plans.md says when the version changes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from planner.files.atomic import write_configs
from planner.report.bounded import Bytes, bound_byte_entries
from planner.report.strategy_record import PlanStrategy
from store.frameworks import FRAMEWORKS
from store.records import RLHF_WORKLOADS, SINGLE_MODEL_WORKLOADS

# The version of the ``--json`` documents' shape: bumped when a field is removed, renamed or changes meaning
# (adding a field keeps it). The schemas under planner/schema/ are generated from these models.
SCHEMA_VERSION = "1"

# Frozen values; each model builds its validator on first use, so a command pays only for the models it makes.
FROZEN = ConfigDict(frozen=True, defer_build=True)


def _versioned(schema: dict[str, Any]) -> None:
    """A document's JSON Schema: ``schema_version`` is always there (a default in the model, so that documents
    saved before it read back)."""
    schema["required"] = ["schema_version", *(name for name in schema.get("required", []) if name != "schema_version")]


def _one_config_by_workload(schema: dict[str, Any]) -> None:
    """A plan's JSON Schema: ``ds_config`` (single-model workloads) or ``ds_configs`` (RLHF), never both."""
    _versioned(schema)
    for key in ("ds_config", "ds_configs"):  # never null in the document (``_one_config_key``)
        schema["properties"][key].pop("anyOf", None)
        schema["properties"][key].pop("default", None)
    schema["properties"]["ds_config"]["type"] = "object"
    schema["properties"]["ds_configs"].update(type="object", additionalProperties={"type": "object"})
    schema["oneOf"] = [
        {
            "description": "single-model workloads: one DeepSpeed config",
            "required": ["ds_config"],
            "not": {"required": ["ds_configs"]},
            "properties": {"workload": {"properties": {"kind": {"enum": list(SINGLE_MODEL_WORKLOADS)}}}},
        },
        {
            "description": "RLHF workloads: one DeepSpeed config per model (actor, critic, reference, reward)",
            "required": ["ds_configs"],
            "not": {"required": ["ds_config"]},
            "properties": {"workload": {"properties": {"kind": {"enum": list(RLHF_WORKLOADS)}}}},
        },
    ]


DOCUMENT = ConfigDict(frozen=True, defer_build=True, json_schema_extra=_versioned)
PLAN_DOCUMENT = ConfigDict(frozen=True, defer_build=True, json_schema_extra=_one_config_by_workload)


class Versioned(BaseModel):
    """A ``--json`` document: ``schema_version`` first. A document read back (a saved plan) is the current
    version once read: what the current model writes."""

    model_config = DOCUMENT

    schema_version: str = Field(default=SCHEMA_VERSION, json_schema_extra={"const": SCHEMA_VERSION})

    @field_validator("schema_version", mode="before")
    @classmethod
    def _current(cls, value: Any) -> str:
        return SCHEMA_VERSION


class PhaseReport(BaseModel):
    """One phase of the step."""

    model_config = FROZEN

    name: str
    peak_allocated_bytes: Bytes
    peak_reserved_bytes: Bytes
    time_s: float
    count: int = 1
    inactive_split_bytes: Bytes = 0  # the replay's free blocks inside split segments (reserved, not reusable)


class SpreadKindReport(BaseModel):
    """The mechanisms a plan's spread is looked up by (search.spread.kinds.SpreadKind)."""

    model_config = FROZEN

    zero_stage: int
    offload: str  # "none", "optimizer" or "optimizer+param"
    checkpointing: bool
    large_vocab: bool  # a vocabulary of 100k tokens or more
    rlhf: bool


class SpreadBasis(BaseModel):
    """What a plan's spread of peak reserved rests on (search.spread.measured.MeasuredSpread)."""

    model_config = FROZEN

    kind: SpreadKindReport
    spread: float  # the fraction of peak reserved kept free: (1 + under_predicted + margin) x program_factor - 1
    under_predicted: float  # the largest under-prediction of peak reserved among the records it rests on
    margin: float
    program_factor: float = 1.0  # recommend --program: the program's peak reserved over memplan's probe's
    near: bool  # False: no record within one mechanism; the widest of all records is kept
    distance: int | None  # mechanisms the records differ in from the plan (None: no records table shipped)
    count: int  # how many records it rests on
    records: list[str]  # "<records file>:<record id>"
    worst_record: str
    differs_in: list[str] = []  # the mechanisms in which the nearest records are not the plan's


class Predicted(BaseModel):
    """The ``predicted`` block: per GPU (host bytes per node), bytes as integers."""

    model_config = FROZEN

    peak_allocated_bytes: Bytes
    peak_reserved_bytes: Bytes
    gpu_budget_bytes: Bytes
    host_bytes: Bytes
    host_budget_bytes: Bytes
    # host bytes per node of the phase that sets host_bytes, by part (search.model.host); sums to host_bytes
    host_breakdown: dict[str, Bytes] = {}
    host_peak_phase: str = ""  # "steady" (through training) or "loading" (the models' 16-bit copies before it)
    host_phases: dict[str, Bytes] = {}  # host bytes per node of each phase; host_bytes is the largest
    step_time_s: float
    peak_phase: str
    breakdown: dict[str, Bytes]
    time_breakdown: dict[str, float]
    phases: list[PhaseReport]
    notes: list[str] = []
    time_terms: dict[str, float] = {}  # seconds per step by mechanism (matmul, host_launch, cpu_adam, ...)
    dominant_time_term: str = ""  # the mechanism that takes most of the step
    reserved_uncertainty: float = 0.0  # the spread of peak reserved kept free (the nearest measured records')
    # what the spread rests on: the plan's mechanisms, the records nearest them (ids and count), their largest
    # under-prediction, the margin, whether any record is near (search.spread.measured); None: plans saved before
    reserved_spread_basis: SpreadBasis | None = None
    # RLHF with a vLLM/SGLang rollout engine: its solved gpu_memory_utilization, KV cache and bytes
    rollout: dict[str, Any] | None = None
    # "replay": peak reserved from the allocator replay of the step (search.step.finish); "screen": from the
    # fragment coefficients (plans saved before the replay decided)
    reserved_from: str = "screen"
    screen_reserved_bytes: Bytes = 0  # the fragment coefficients' peak reserved beside a replayed one (0: none)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """The generated schema, with the ``*_bytes`` entries of ``rollout`` bounded (planner.report.bounded)."""
        schema = handler(core_schema)
        own = handler.resolve_ref_schema(schema)
        bound_byte_entries(own["properties"]["rollout"])
        return schema


class Alternative(BaseModel):
    """Another strategy with its prediction."""

    model_config = FROZEN

    strategy: PlanStrategy
    predicted: Predicted


class PredictionReport(Versioned):
    """What ``predict`` returns: one fixed strategy and its prediction."""

    model_config = PLAN_DOCUMENT

    # "framework" is written only when not memplan's own loop (store.records.Workload.to_dict)
    workload: dict[str, Any] = Field(json_schema_extra={"properties": {"framework": {"enum": list(FRAMEWORKS)}}})
    hardware: dict[str, Any]
    strategy: PlanStrategy  # the JSON object of DESIGN.md's shape, with typed attributes (strategy.lora_rank)
    fits: bool
    predicted: Predicted
    ds_config: dict[str, Any] | None = None  # single-model workloads
    ds_configs: dict[str, dict[str, Any]] | None = None  # RLHF: one per model (actor, critic, reference, reward)
    outside_settings: dict[str, str]
    # RLHF: ready-to-paste flags per framework, from the code that writes its files: deepspeed_chat, openrlhf
    # (0.11's dotted names, as --format openrlhf), verl (Hydra overrides), trl (``trl grpo`` options, GRPO only)
    launch: dict[str, list[str]] = {}
    launch_gaps: dict[str, list[str]] = {}  # what a framework's flags cannot express of the strategy
    readings: list[str] = []
    # the step replayed through the port of torch's caching allocator (search.replay_memory): reserved bytes
    # per phase and after the engines' init, from the stream the cost model's bytes make
    allocator_replay: dict[str, Any] | None = None
    # which calibration the prediction used (planner.job.calibrated): its id, target and probes, or id None
    # with why the defaults were used
    calibration: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _one_config_key(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The document carries ``ds_config`` or ``ds_configs``, never a null one."""
        data: dict[str, Any] = handler(self)
        for key in ("ds_config", "ds_configs", "allocator_replay", "calibration"):
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


class CheckResult(Versioned):
    """What ``check`` returns: whether a given DeepSpeed config is predicted to fit."""

    model_config = DOCUMENT

    fits: bool
    reasons: list[str]
    report: PredictionReport


def _relative(measured: float, predicted: float) -> float | None:
    return None if not measured else (predicted - measured) / measured


class ProbeRow(BaseModel):
    """One probe: what ran, what happened, measured beside predicted (relative error = pred/meas - 1)."""

    model_config = FROZEN

    probe_id: str
    strategy: dict[str, Any]
    label: str
    layers: int | None
    outcome: str
    failed_phase: str | None = None
    message: str = ""
    reused: bool = False
    measured: dict[str, Any] | None = None
    predicted: dict[str, Any]
    errors: dict[str, float | None] = {}
    world_size: int = 1  # ranks the probe ran
    worst_rank: int | None = None  # the rank with the largest step peak allocated (several ranks)

    @classmethod
    def from_probe(cls, item: Any, probe_id: str, result: Any, *, reused: bool, cpu_timed: bool = False) -> ProbeRow:
        """From a planned probe (strategy, layers, prediction) and its ProbeResult. ``cpu_timed``: the
        prediction used a calibration of this CPU, so a CPU probe's step time is compared too."""
        p = item.prediction
        predicted = {
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "peak_reserved_bytes": p.peak_reserved_bytes,
            "step_time_s": p.step_time_s,
            "phases": [phase.to_dict() for phase in p.phases],
        }
        measured = None
        errors: dict[str, float | None] = {}
        if result.phases:
            measured = {
                "peak_allocated_bytes": result.peak_allocated_bytes,
                "peak_reserved_bytes": result.peak_reserved_bytes,
                "step_time_s": result.step_time_s,
                "host_rss_peak_bytes": result.host_rss_peak_bytes,
                "phases": [phase.to_dict() for phase in result.phases],
            }
        if result.outcome == "ok" and measured:
            # The time model is for GPUs: a CPU probe's step time says nothing about it, unless the model was
            # calibrated to this CPU's probes.
            on_cpu = getattr(getattr(item, "request", None), "device", None) == "cpu" and not cpu_timed
            errors = {
                "peak_allocated": _relative(measured["peak_allocated_bytes"], p.peak_allocated_bytes),
                "peak_reserved": _relative(measured["peak_reserved_bytes"], p.peak_reserved_bytes),
                "step_time": None if on_cpu else _relative(measured["step_time_s"], p.step_time_s),
            }
        depth = "" if item.layers is None else f" [{item.layers} layers]"
        return cls(
            probe_id=probe_id,
            strategy=item.strategy.to_dict(),
            label=(getattr(item, "label", "") or item.strategy.describe()) + depth,
            layers=item.layers,
            outcome=result.outcome,
            failed_phase=result.failed_phase,
            message=result.message,
            reused=reused,
            measured=measured,
            predicted=predicted,
            errors=errors,
            world_size=int(result.extra.get("world_size", 1)),
            worst_rank=result.extra.get("worst_rank"),
        )


class Extrapolation(BaseModel):
    """A strategy probed at two depths, extrapolated per layer to the full model."""

    model_config = FROZEN

    label: str
    depths: list[int]
    full_layers: int
    extrapolated: dict[str, float]  # per-layer line through the measured peaks: peak_allocated_bytes, ...
    predicted_full: dict[str, float]  # the cost model at full depth (the device's view of it)
    anchored: dict[str, float | None] = {}  # predicted_full plus the per-layer line of measured - predicted
    measured_full: dict[str, float] | None = None
    errors: dict[str, float | None] = {}  # extrapolated against measured full model
    anchored_errors: dict[str, float | None] = {}  # anchored against measured full model


class ProbeReport(Versioned):
    """What ``probe`` returns: every probe row, the per-layer extrapolations and the device."""

    model_config = DOCUMENT

    workload: dict[str, Any]
    hardware: dict[str, Any]
    device: str
    run_id: str
    fingerprint: dict[str, Any] | None = None
    rows: list[ProbeRow]
    extrapolations: list[Extrapolation] = []
    calibration: dict[str, Any] | None = None  # the calibration the predictions used (planner.job.calibrated)
    world_size: int = 1  # ranks each probe ran (measured figures are the worst rank's)
    notes: list[str] = []  # e.g. how a multi-node plan was probed on one node

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


class CalibrationReport(BaseModel):
    """What ``calibrate`` returns: the device, every calibrated parameter before and after, and the errors.

    ``errors`` has ``before`` (the defaults), ``after`` (the fit, on the probes it saw) and ``held_out`` (each
    probe predicted by a fit to the others), each ``{quantity: {count, median_abs, worst}}`` with relative
    errors ``predicted / measured - 1``; quantity is ``time``, ``peak_allocated`` or ``peak_reserved``.
    """

    model_config = FROZEN

    calibration_id: str | None  # None when not saved
    target: str
    device: str
    fingerprint: dict[str, Any]
    observations: int
    probe_ids: list[str]
    skipped: list[str] = []
    parameters: list[dict[str, Any]]
    errors: dict[str, dict[str, dict[str, float]]]
    version: int
    # the time model's host terms: value, source (measured by the host benchmark, fitted, or assumed) and how
    host_terms: dict[str, dict[str, Any]] = {}
    host_benchmark: dict[str, Any] = {}  # what probes/measure/host_rates.py measured here (empty: it did not run)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


class TuneReport(Versioned):
    """What ``tune`` returns: the study, what was probed (by this run) and measured (by every run of the
    study), why it stopped, and the confirmed plan (saved, exportable) when a measured plan fits.

    ``rows`` are the measured candidates, fastest fitting first: ``strategy``, ``probe_id``, ``outcome``,
    ``fits`` (ran and stayed within the GPU budget), ``step_time_s`` and ``peak_reserved_bytes`` measured,
    ``noise`` (the probe's relative step-time spread), ``predicted_step_time_s`` (by the final calibration).
    """

    model_config = DOCUMENT

    study: str
    device: str
    target: str
    candidates: int
    probes_run: int
    device_seconds: float
    probes_measured: int
    stop_reason: str
    confirmed: bool
    calibration_id: str | None = None
    rows: list[dict[str, Any]] = []
    plan: Plan | None = None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)

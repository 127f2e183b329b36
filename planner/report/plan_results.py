"""The documents of a plan: ``predict``'s ``PredictionReport``, ``recommend``'s ``Plan`` and ``check``'s
``CheckResult``, with the ``predicted`` block they share (``planner.report.results`` is the face).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    GetJsonSchemaHandler,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from planner.files.atomic import write_configs
from planner.report.bounded import Bytes, bound_byte_entries
from planner.report.strategy_record import PlanStrategy
from planner.report.versioned import DOCUMENT, FROZEN, PLAN_DOCUMENT, Versioned
from store.frameworks import FRAMEWORKS


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


class FrameworkRollout(BaseModel):
    """An RLHF plan as a framework that does not run its rollout engine starts it: the strategy on that
    framework's engine at the budget memplan predicts for it under the plan's coefficients
    (search.retarget.for_engine), and the lines that say what changed."""

    model_config = FROZEN

    strategy: PlanStrategy
    lines: list[str] = []


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
    # RLHF with a vLLM/SGLang rollout engine: by framework that runs another engine (store.frameworks), the
    # strategy it runs instead, solved with the plan's coefficients (planner.planning.figures); what
    # ``launch`` shows and ``planner export`` writes for it. None: no rollout engine, or a plan saved before
    framework_rollouts: dict[str, FrameworkRollout] | None = None
    # how the plan assumes the program builds a model it trains under ZeRO-3 (store.model_build.program_build):
    # "zero-init", partitioned as it is made, or "whole", on every GPU before deepspeed.initialize partitions it;
    # --framework's rule, or with --program what a probe of the program saw. None: a plan saved before it
    model_build: Literal["zero-init", "whole"] | None = None

    @model_serializer(mode="wrap")
    def _one_config_key(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The document carries ``ds_config`` or ``ds_configs``, never a null one."""
        data: dict[str, Any] = handler(self)
        for key in ("ds_config", "ds_configs", "allocator_replay", "calibration", "framework_rollouts", "model_build"):
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

"""Typed results of the Python API; ``.model_dump()`` is the JSON document of docs/contracts.md.

Every document that a command prints with ``--json`` (``Plan``, ``PredictionReport``, ``CheckResult``,
``ProbeReport``, ``TuneReport``) carries ``schema_version``: its JSON Schema is committed under
``planner/schema/`` (``python -m planner.schema --write``; docs/plans.md says when the version changes).
The records live by job: the version (``planner.report.versioned``), a plan's documents
(``planner.report.plan_results``) and measuring's (``planner.report.probe_results``); this module is their face.
"""

from __future__ import annotations

from planner.report.plan_results import (
    Alternative,
    CheckResult,
    FrameworkRollout,
    PhaseReport,
    Plan,
    Predicted,
    PredictionReport,
    SpreadBasis,
    SpreadKindReport,
)
from planner.report.probe_results import CalibrationReport, Extrapolation, ProbeReport, ProbeRow, TuneReport
from planner.report.versioned import SCHEMA_VERSION, Versioned

__all__ = [
    "SCHEMA_VERSION",
    "Alternative",
    "CalibrationReport",
    "CheckResult",
    "Extrapolation",
    "FrameworkRollout",
    "PhaseReport",
    "Plan",
    "Predicted",
    "PredictionReport",
    "ProbeReport",
    "ProbeRow",
    "SpreadBasis",
    "SpreadKindReport",
    "TuneReport",
    "Versioned",
]

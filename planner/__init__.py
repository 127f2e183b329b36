"""memplan's face: the Python API and the ``planner`` CLI.

    from planner import recommend, predict, check
    plan = recommend("opt-1.3b", gpu_mem="24G", workload="sft")
    plan.save("ds_config.json")

Names are loaded on first use, so ``import planner`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.api import check, coefficients, predict, probe, recommend
    from planner.calibrating import calibrate
    from planner.inputs import JobSpec
    from planner.results import CalibrationReport, CheckResult, Plan, PredictionReport
    from planner.runtime import EmptyCachePolicy
    from planner.saved import calibrations, export, memory_plot, plan, plans, probes
    from planner.snapshots import probe_snapshot, probe_stream, write_probe_snapshot

__all__ = [
    "CalibrationReport",
    "CheckResult",
    "EmptyCachePolicy",
    "JobSpec",
    "Plan",
    "PredictionReport",
    "calibrate",
    "calibrations",
    "check",
    "coefficients",
    "export",
    "memory_plot",
    "plan",
    "plans",
    "predict",
    "probe",
    "probe_snapshot",
    "probe_stream",
    "probes",
    "recommend",
    "write_probe_snapshot",
]

_HOMES = {
    "calibrate": "planner.calibrating",
    "calibrations": "planner.saved",
    "check": "planner.api",
    "coefficients": "planner.api",
    "export": "planner.saved",
    "memory_plot": "planner.saved",
    "plan": "planner.saved",
    "plans": "planner.saved",
    "predict": "planner.api",
    "probe": "planner.api",
    "probe_snapshot": "planner.snapshots",
    "probe_stream": "planner.snapshots",
    "probes": "planner.saved",
    "recommend": "planner.api",
    "write_probe_snapshot": "planner.snapshots",
    "JobSpec": "planner.inputs",
    "CalibrationReport": "planner.results",
    "CheckResult": "planner.results",
    "EmptyCachePolicy": "planner.runtime",
    "Plan": "planner.results",
    "PredictionReport": "planner.results",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value

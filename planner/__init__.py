"""memplan's face: the Python API and the ``planner`` CLI.

    from planner import recommend, predict, check
    plan = recommend("opt-1.3b", gpu_mem="24G", workload="sft")
    plan.save("ds_config.json")

Names are loaded on first use, so ``import planner`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.api import (
        CalibrationReport,
        CheckResult,
        EmptyCachePolicy,
        JobSpec,
        Plan,
        PredictionReport,
        TuneReport,
        calibrate,
        calibrations,
        check,
        coefficients,
        export,
        memory_plot,
        plan,
        plans,
        predict,
        probe,
        probe_snapshot,
        probe_stream,
        probes,
        recommend,
        tune,
        write_probe_snapshot,
    )

__all__ = [
    "CalibrationReport",
    "CheckResult",
    "EmptyCachePolicy",
    "JobSpec",
    "Plan",
    "PredictionReport",
    "TuneReport",
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
    "tune",
    "write_probe_snapshot",
]

_HOMES = {
    "calibrate": "planner.api",
    "calibrations": "planner.api",
    "check": "planner.api",
    "coefficients": "planner.api",
    "export": "planner.api",
    "memory_plot": "planner.api",
    "plan": "planner.api",
    "plans": "planner.api",
    "predict": "planner.api",
    "probe": "planner.api",
    "probe_snapshot": "planner.api",
    "probe_stream": "planner.api",
    "probes": "planner.api",
    "recommend": "planner.api",
    "tune": "planner.api",
    "write_probe_snapshot": "planner.api",
    "JobSpec": "planner.api",
    "CalibrationReport": "planner.api",
    "CheckResult": "planner.api",
    "EmptyCachePolicy": "planner.api",
    "Plan": "planner.api",
    "PredictionReport": "planner.api",
    "TuneReport": "planner.api",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value

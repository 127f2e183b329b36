"""memplan's face: the Python API and the ``planner`` CLI.

    from planner import recommend, predict, check
    plan = recommend("opt-1.3b", gpu_mem="24G", workload="sft")
    plan.save("ds_config.json")

Every public name of ``planner.api`` (its ``__all__``) is re-exported here. Names are loaded on first use, so
``import planner`` stays light (no torch, no pydantic until a name is used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.api import (
        SCHEMA_VERSION,
        CalibrationReport,
        CheckResult,
        EmptyCachePolicy,
        FrozenModelBlock,
        JobKeywords,
        JobSpec,
        Plan,
        PlanStrategy,
        PredictionReport,
        ProbeOptions,
        ProbeReport,
        TrainedModelBlock,
        TuneOptions,
        TuneReport,
        calibrate,
        calibrations,
        check,
        coefficients,
        empty_cache_effect,
        export,
        gpu_catalog,
        memory_plot,
        plan,
        plans,
        predict,
        probe,
        probe_program,
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
    "FrozenModelBlock",
    "JobKeywords",
    "JobSpec",
    "Plan",
    "PlanStrategy",
    "PredictionReport",
    "ProbeOptions",
    "ProbeReport",
    "SCHEMA_VERSION",
    "TrainedModelBlock",
    "TuneOptions",
    "TuneReport",
    "calibrate",
    "calibrations",
    "check",
    "coefficients",
    "empty_cache_effect",
    "export",
    "gpu_catalog",
    "memory_plot",
    "plan",
    "plans",
    "predict",
    "probe",
    "probe_program",
    "probe_snapshot",
    "probe_stream",
    "probes",
    "recommend",
    "tune",
    "write_probe_snapshot",
]


def __getattr__(name: str) -> Any:
    """Load a public name from ``planner.api`` on first use (PEP 562)."""
    if name not in __all__:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module("planner.api"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

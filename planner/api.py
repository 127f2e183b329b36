"""The Python API: every public function of memplan, in one place.

    from planner.api import recommend
    plan = recommend("opt-1.3b", gpu_mem="24G", workload="sft")

Each job-describing function takes the model and the job keywords of ``planner.job.inputs.JobSpec`` (whose
field defaults are the defaults), or a JobSpec (keywords then override its fields); it returns a typed
pydantic result and raises ``store.errors.InputError`` for bad input. Every CLI command is a thin call of one
of these:

- plans: ``recommend``, ``predict``, ``check`` (``planner.planning.predicting``); ``plans``, ``plan``,
  ``probes``, ``calibrations``, ``memory_plot`` (``planner.planning.saved``), ``export``
  (``planner.planning.exporting``); ``probe_stream``, ``probe_snapshot``, ``write_probe_snapshot``
  (``planner.planning.snapshots``);
- measuring: ``probe`` (below, over ``planner.probing.session``), ``calibrate`` (``planner.calibration.fit``),
  ``tune`` (``planner.tuning.run``);
- the cost model: ``coefficients``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.calibration.fit import calibrate
from planner.job.inputs import JobSpec
from planner.planning.exporting import export
from planner.planning.predicting import JOB_FIELDS, check, empty_cache_effect, job_spec, predict, recommend
from planner.planning.saved import calibrations, memory_plot, plan, plans, probes
from planner.planning.snapshots import probe_snapshot, probe_stream, write_probe_snapshot
from planner.probing.device import PROBE_GPU_MEM
from planner.probing.session import probe as run_probe_session
from planner.report.results import CalibrationReport, CheckResult, Plan, PredictionReport, TuneReport
from planner.runtime import EmptyCachePolicy
from planner.tuning.run import tune
from search import describe_coefficients

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
    "empty_cache_effect",
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


def probe(model: str | JobSpec, *, device: str = "cuda", **options: Any) -> Any:
    """Run strategies for a few real steps and compare with the prediction (``planner.probing.session.probe``).

    Where the job names neither ``gpu_mem`` nor ``gpu``, the probe plans for ``PROBE_GPU_MEM[device]``
    (80G on cuda, 24G on the CPU backend).
    """
    job = {k: options.pop(k) for k in JOB_FIELDS if k in options}
    spec = job_spec(model, job)
    if spec.gpu_mem is None and spec.gpu is None:
        spec = replace(spec, gpu_mem=PROBE_GPU_MEM.get(device, PROBE_GPU_MEM["cuda"]))
    return run_probe_session(spec, device=device, **options)


def coefficients() -> list[dict[str, Any]]:
    """The cost model's coefficients: name, default value, unit and the reason for the value."""
    return describe_coefficients()

"""The Python API: every public function of memplan, in one place.

    from planner.api import recommend
    plan = recommend("opt-1.3b", gpu_mem="24G", workload="sft")

Each job-describing function takes the model and the job keywords of ``planner.job.inputs.JobSpec`` (whose
field defaults are the defaults), or a JobSpec (keywords then override its fields). The keywords are typed
(``JobKeywords``: a type checker checks them); sizes are strings with a unit (``gpu_mem="24G"``) or ints of
bytes. Each returns one typed pydantic result (``Plan``, ``PredictionReport``, ``CheckResult``, ``ProbeReport``,
``TuneReport``) and raises ``store.errors.InputError`` for bad input. Every CLI command is a thin call of one
of these:

- plans: ``recommend``, ``predict``, ``check`` (``planner.planning.predicting``); ``plans``, ``plan``,
  ``probes``, ``calibrations``, ``memory_plot`` (``planner.planning.saved``), ``export``
  (``planner.planning.exporting``); ``probe_stream``, ``probe_snapshot``, ``write_probe_snapshot``
  (``planner.planning.snapshots``);
- measuring: ``probe`` (below, over ``planner.probing.session``), ``probe_program`` (your own launch command,
  ``planner.probing.program``), ``calibrate`` (``planner.calibration.fit``),
  ``tune`` (``planner.tuning.run``);
- the cost model: ``coefficients``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from planner.job.inputs import JobKeywords, JobSpec
from planner.planning.exporting import export
from planner.planning.predicting import JOB_FIELDS, check, empty_cache_effect, job_spec, predict, recommend
from planner.planning.saved import calibrations, memory_plot, plan, plans, probes
from planner.planning.snapshots import probe_snapshot, probe_stream, write_probe_snapshot
from planner.report.gpus import gpu_catalog
from planner.report.results import (
    SCHEMA_VERSION,
    CalibrationReport,
    CheckResult,
    Plan,
    PredictionReport,
    ProbeReport,
    TuneReport,
)
from planner.report.strategy_record import FrozenModelBlock, PlanStrategy, TrainedModelBlock
from planner.runtime import EmptyCachePolicy
from search import Coefficients, describe_coefficients
from store.measurements import ProbeRequest, ProbeResult

if TYPE_CHECKING:  # loaded on first use (__getattr__): recommend, predict and check never need them
    from planner.calibration.fit import calibrate
    from planner.probing.program import probe_program

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


# The measuring layer (probes, programs, calibration, tuning: about 40 modules) is imported by the functions that
# measure, not by this module: ``planner recommend`` imports this module and spent about 40 ms on them.
_LAZY = {"calibrate": "planner.calibration.fit", "probe_program": "planner.probing.program"}


def __getattr__(name: str) -> Any:
    """Load ``calibrate`` and ``probe_program`` (and the measuring layer under them) on first access."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ProbeOptions(JobKeywords, total=False):
    """The keywords of ``probe`` beside ``device``: the job's (``JobKeywords``) and the probe's own, as
    ``planner.probing.session.probe`` takes them."""

    strategies: str
    steps: int
    layers: str | None
    timeout_s: float
    memory_cap: str | int | None
    force: bool
    db: str | None
    on_progress: Callable[[str, int, int], None] | None
    on_note: Callable[[str], None] | None
    coefficients: Coefficients
    runner: Callable[[ProbeRequest], ProbeResult] | None
    calibration: str


class TuneOptions(JobKeywords, total=False):
    """The keywords of ``tune``: the job's (``JobKeywords``) and the tune's own, as ``planner.tuning.run.tune``
    takes them."""

    device: str
    steps: int
    timeout_s: float
    max_probes: int
    memory_cap: str | int | None
    study: str | None
    db: str | None
    calibration: str
    coefficients: Coefficients
    runner: Callable[[ProbeRequest], ProbeResult] | None
    on_progress: Callable[[str], None] | None
    on_note: Callable[[str], None] | None
    command: list[str] | None  # planner tune ... -- CMD: the user's own program confirms the candidates


def probe(model: str | JobSpec, *, device: str = "cuda", **options: Unpack[ProbeOptions]) -> ProbeReport:
    """Run strategies for a few real steps and compare with the prediction (``planner.probing.session.probe``).

    Where the job names neither ``gpu_mem`` nor ``gpu``, the probe plans for the GPU it runs on (its catalog
    entry, read by nvidia-smi) on cuda, and for 24G on the CPU backend (``planner.probing.device.probe_gpu``).
    """
    from planner.probing.device import probe_gpu
    from planner.probing.session import probe as run_probe_session

    spec = job_spec(model, {k: v for k, v in options.items() if k in JOB_FIELDS})
    rest: dict[str, Any] = {k: v for k, v in options.items() if k not in JOB_FIELDS}
    spec = probe_gpu(spec, device, rest.get("on_note"))
    return run_probe_session(spec, device=device, **rest)


def tune(model: str | JobSpec, **options: Unpack[TuneOptions]) -> TuneReport:
    """Probe the best candidates, refit the cost model and save a confirmed plan (``planner.tuning.run.tune``,
    whose docstring says how)."""
    from planner.tuning.run import tune as run_tune

    return run_tune(model, **options)


def coefficients() -> list[dict[str, Any]]:
    """The cost model's coefficients: name, default value, unit and the reason for the value."""
    return describe_coefficients()

"""A program's run as ``planner probe ... -- CMD`` reports it: its phases measured beside predicted, the run
(:class:`ProgramRun`), the report of all runs (:class:`ProgramProbeReport`), and how the hook's result becomes a
stored probe (:func:`stored_result`, :func:`program_request`). :mod:`planner.probing.program` runs the programs."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from planner.job.inputs import ResolvedJob
from planner.planning.program_spread import RunSpread
from planner.probing.plan import workload_payload
from planner.probing.settings import ProbeSettings
from search import Prediction
from store.measurements import DeviceFingerprint, ProbeRequest, ProbeResult
from store.records import Strategy

MAX_COMPARED_PROBES = 100_000  # stored probes of the job's kind and device searched for the built-in counterpart


@dataclass(frozen=True)
class ProgramPhase:
    """One phase of the program's step: measured (worst rank) against predicted peak allocated and reserved, and
    the peak reserved of memplan's own probe of the same strategy where one is stored (the program's spread)."""

    name: str
    measured_allocated_bytes: int
    measured_reserved_bytes: int
    predicted_allocated_bytes: int | None
    predicted_reserved_bytes: int | None
    time_s: float
    builtin_reserved_bytes: int | None = None

    @property
    def allocated_error(self) -> float | None:
        """(predicted - measured) / measured peak allocated; None where the model has no such phase."""
        if not self.predicted_allocated_bytes or not self.measured_allocated_bytes:
            return None
        return self.predicted_allocated_bytes / self.measured_allocated_bytes - 1.0

    @property
    def reserved_spread(self) -> float | None:
        """The program's peak reserved over memplan's own probe's, less 1; None where no such probe is stored."""
        if not self.builtin_reserved_bytes or not self.measured_reserved_bytes:
            return None
        return self.measured_reserved_bytes / self.builtin_reserved_bytes - 1.0


@dataclass(frozen=True)
class ProgramRun:
    """One strategy run in the user's program: its outcome (``probes.script.outcome.OUTCOMES``), what the
    program really ran with, each phase measured against predicted, and the program's exit and log tail.
    ``probe_id`` is its stored row, ``reused`` whether that row was stored before (nothing ran now);
    ``builtin_probe_id`` and ``spread`` (worst phase) compare it with memplan's own probe of the strategy."""

    strategy: dict[str, Any]
    label: str
    outcome: str
    reason: str
    message: str
    ran_with: dict[str, Any]
    contradictions: tuple[str, ...]
    not_applied: tuple[str, ...]
    phases: tuple[ProgramPhase, ...]
    measured_step_s: float | None
    predicted_step_s: float
    exit_code: int | None
    log_tail: str
    probe_id: str = ""
    reused: bool = False
    builtin_probe_id: str | None = None
    spread: float | None = None


@dataclass(frozen=True)
class ProgramProbeReport:
    """Every strategy run in the user's program (``planner probe ... -- CMD``); ``program_id`` names the program
    for ``planner recommend --program``."""

    command: tuple[str, ...]
    program: dict[str, Any]
    device: str
    runs: tuple[ProgramRun, ...]
    readings: tuple[str, ...] = field(default_factory=tuple)
    program_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``--json``."""
        document = asdict(self)
        for run, shown in zip(self.runs, document["runs"], strict=True):
            for phase, phase_doc in zip(run.phases, shown["phases"], strict=True):
                phase_doc["allocated_error"] = phase.allocated_error
                phase_doc["reserved_spread"] = phase.reserved_spread
        return document


@dataclass(frozen=True)
class StoredProgramRun:
    """One strategy of the program, run now or reused: the report's row, the stored probe and its result."""

    run: ProgramRun
    probe_id: str
    result: ProbeResult
    ran: bool


def _phases(measured: Any, prediction: Prediction, spread: RunSpread | None = None) -> tuple[ProgramPhase, ...]:
    predicted = {phase.name: phase for phase in prediction.phases}
    builtin = {phase.name: phase.builtin_reserved_bytes for phase in spread.phases} if spread else {}
    rows = []
    for phase in measured:
        model = predicted.get(phase.name)
        rows.append(
            ProgramPhase(
                name=phase.name,
                measured_allocated_bytes=phase.peak_allocated_bytes,
                measured_reserved_bytes=phase.peak_reserved_bytes,
                predicted_allocated_bytes=model.peak_allocated_bytes if model else None,
                predicted_reserved_bytes=model.peak_reserved_bytes if model else None,
                time_s=phase.time_s,
                builtin_reserved_bytes=builtin.get(phase.name),
            )
        )
    return tuple(rows)


def _median_step(step_time_s: dict[str, Any]) -> float | None:
    value = step_time_s.get("median") if isinstance(step_time_s, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def program_request(
    job: ResolvedJob,
    strategy: Strategy,
    program: dict[str, Any],
    settings: ProbeSettings,
) -> ProbeRequest:
    """The stored request of one strategy run in the program: memplan's probe request of the strategy at full
    depth (as ``planner probe`` builds it, so calibration rebuilds its job) with the program's fingerprint."""
    return ProbeRequest(
        workload=workload_payload(job.workload),
        strategy=strategy.to_dict(),
        hardware=job.hardware.to_dict(),
        device=settings.device,
        steps=settings.steps,
        layers=None,
        timeout_s=settings.timeout_s,
        memory_cap_bytes=settings.memory_cap_bytes,
        program=program,
    )


def _fingerprint(result: Any, device: str) -> DeviceFingerprint:
    """The device the program ran on, as its lowest rank reported it (the host's own where none did)."""
    for rank in getattr(result, "ranks", ()) or ():
        found = rank.get("fingerprint") if isinstance(rank, dict) else None
        if isinstance(found, dict) and found.get("device"):
            return DeviceFingerprint.from_dict(found)
    from probes.measure.fingerprint import host_fingerprint  # lazy on purpose: probes loads torch

    return host_fingerprint(device)


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as its name (``"inf"``, ``"-inf"``, ``"nan"``): what a program's
    own config or state holds (a Trainer's resolved DeepSpeed config may carry ``inf``) stays readable in the
    store, which keeps strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def stored_result(result: Any, device: str) -> ProbeResult:
    """A script probe's result (``probes.script.launch.ScriptProbeResult``) as the store keeps a probe's: its
    outcome, worst-rank phases and fingerprint, and in ``extra`` what the program ran with, its exit and log."""
    return ProbeResult(
        outcome=result.outcome,
        phases=tuple(result.phases),
        failed_phase=result.failed_phase,
        message=result.message,
        host_rss_peak_bytes=int(result.host_rss_peak_bytes),
        wall_s=float(result.wall_s),
        fingerprint=_fingerprint(result, device),
        layers=None,
        extra=_json_safe(
            {
                "program_run": {
                    "reason": result.reason,
                    "ran_with": dict(result.ran_with),
                    "contradictions": list(result.contradictions),
                    "not_applied": list(result.not_applied),
                    "exit_code": result.exit_code,
                    "log_tail": result.log_tail,
                    "failed_rank": result.failed_rank,
                    "steps_done": result.steps_done,
                    "timed_out": result.timed_out,
                },
                "step_time_s": dict(result.step_time_s),
                "phase_time_s": dict(result.phase_time_s),
                "world_size": result.world_size,
                "worst_rank": result.worst_rank,
                "ranks": [dict(rank) for rank in result.ranks],
            }
        ),
    )


def program_run(
    strategy: Strategy, result: ProbeResult, prediction: Prediction, probe_id: str, reused: bool, spread: Any
) -> ProgramRun:
    run = result.extra.get("program_run") or {}
    return ProgramRun(
        strategy=strategy.to_dict(),
        label=strategy.describe(),
        outcome=result.outcome,
        reason=str(run.get("reason", "")),
        message=result.message,
        ran_with=dict(run.get("ran_with") or {}),
        contradictions=tuple(run.get("contradictions") or ()),
        not_applied=tuple(run.get("not_applied") or ()),
        phases=_phases(result.phases, prediction, spread),
        measured_step_s=_median_step(result.extra.get("step_time_s") or {}),
        predicted_step_s=prediction.step_time_s,
        exit_code=run.get("exit_code"),
        log_tail=str(run.get("log_tail", "")),
        probe_id=probe_id,
        reused=reused,
        builtin_probe_id=spread.builtin_probe_id if spread else None,
        spread=spread.spread if spread else None,
    )

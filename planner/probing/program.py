"""``planner probe ... -- CMD``: the user's own program run under the plan's strategies, measured beside the
prediction.

Reads top to bottom: resolve the job (it describes the program's model and batch, so every measurement sits
beside its prediction), choose the strategies (the plan and its next best by default), run the command once
per strategy under the start-up hook of :mod:`probes.script` (it overrides the strategy's DeepSpeed keys in the
config the program passes, applies checkpointing and ``empty_cache``, measures each phase and ends the program
after its timed steps), then put each phase's measured peak beside the predicted one.

Each run is stored as a probe (:class:`store.measurements.ProbeRequest` with ``program`` the program's fingerprint:
command line, the script's sha256, library versions), so a second call with the same program, job, strategy and
steps reuses it (``force`` runs it again) and ``planner calibrate`` reads it like any probe. Where memplan's own
probe of the same strategy, workload and device is stored too, each phase shows the program's own spread
(:mod:`planner.planning.program_spread`), which ``recommend --program`` keeps free instead of the fixed 8%.
:func:`run_program_strategy` runs (or reuses) one strategy; ``planner tune ... -- CMD`` calls it per candidate.

The program is the user's: a strategy it cannot take (LoRA on a script that builds no adapters) is reported
and not measured, and a program whose own batch contradicts the plan is measured but flagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from planner.job.calibrated import calibrated
from planner.job.inputs import JobSpec, ResolvedJob, resolve
from planner.job.target import device_target
from planner.planning.program_spread import RunSpread, run_spread
from planner.probing.command import check_command
from planner.probing.device import cpu_probe_dtype, device_coefficients, device_prediction, probe_gpu
from planner.probing.limits import check_device_present, check_run
from planner.probing.plan import check_ranks, choose_strategies, workload_payload
from planner.probing.runs import reusable
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction, predict
from store.db import open_storage
from store.errors import InputError
from store.measurements import DeviceFingerprint, ProbeRequest, ProbeResult, program_id
from store.records import Strategy
from store.sizes import parse_size

DEFAULT_STRATEGIES = 2  # the plan and its next best
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
    """One strategy run in the user's program: its outcome (``probes.script.launch.OUTCOMES``), what the
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
    *,
    device: str,
    steps: int,
    timeout_s: float,
    memory_cap_bytes: int | None = None,
) -> ProbeRequest:
    """The stored request of one strategy run in the program: memplan's probe request of the strategy at full
    depth (as ``planner probe`` builds it, so calibration rebuilds its job) with the program's fingerprint."""
    return ProbeRequest(
        workload=workload_payload(job.workload),
        strategy=strategy.to_dict(),
        hardware=job.hardware.to_dict(),
        device=device,
        steps=steps,
        layers=None,
        timeout_s=timeout_s,
        memory_cap_bytes=memory_cap_bytes,
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


def _program_run(
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


def run_program_strategy(
    job: ResolvedJob,
    strategy: Strategy,
    command: list[str],
    *,
    program: dict[str, Any],
    device: str,
    steps: int,
    timeout_s: float,
    coef: Coefficients,
    db: str | None,
    force: bool = False,
    memory_cap_bytes: int | None = None,
    runner: Callable[..., Any] | None = None,
    on_start: Callable[[], None] | None = None,
) -> StoredProgramRun:
    """Run ``command`` under one strategy (or reuse the stored run of the same program, job, strategy, device and
    steps: a ``timeout`` only when it had at least ``timeout_s``; ``force`` runs it again), store the run as a
    probe in ``db`` and compare it with the prediction and with memplan's own stored probe of the strategy.
    ``coef`` are the job's coefficients (the probed device's view is taken here); ``on_start`` is called just
    before the program starts (not for a reused run); ``memory_cap_bytes`` (CPU backend) is the live bytes that
    count as out of memory in the program, as ``--memory-cap`` of a built-in probe."""
    from probes.measure.fingerprint import versions as software_versions  # lazy on purpose: probes loads torch

    prediction = device_prediction(
        predict(job.workload, strategy, job.hardware, device_coefficients(device, coef)), device
    )
    request = program_request(
        job, strategy, program, device=device, steps=steps, timeout_s=timeout_s, memory_cap_bytes=memory_cap_bytes
    )
    key = request.key(software_versions())
    with open_storage(db) as storage:
        known = None if force else storage.find_probe(key)
        if known is not None and reusable(known, request):
            record, result, ran = known, known.result, False
        else:
            from probes.script.launch import run_script_probe  # lazy on purpose: probes loads torch
            from probes.script.settings import ScriptProbeSettings
            from probes.step.warmup import warmup_steps  # the built-in probes' rule: two under ZeRO-3

            warmup, _ = warmup_steps(strategy, steps)
            settings = ScriptProbeSettings.for_strategy(
                strategy,
                job.workload,
                job.hardware,
                device=device,
                warmup_steps=warmup,
                timed_steps=steps - warmup,
                memory_cap_bytes=memory_cap_bytes,
            )
            if on_start is not None:
                on_start()
            result = stored_result((runner or run_script_probe)(list(command), settings, timeout_s), device)
            record = storage.save_probe(request, result, key=key)
            ran = True
        stored = list(storage.list_probes(limit=MAX_COMPARED_PROBES, kind=job.workload.kind, device=device))
    spread = run_spread(record, stored)
    run = _program_run(strategy, result, prediction, record.probe_id, not ran, spread)
    return StoredProgramRun(run, record.probe_id, result, ran)


def program_job(
    model: str | JobSpec, device: str, db: str | None, readings: list[str], job: dict[str, Any]
) -> ResolvedJob:
    """The job a program run describes (its model, sequence length and batch), resolved as ``planner probe``
    resolves it on this machine; InputError for an RLHF job or more ranks than this node has."""
    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    spec = cpu_probe_dtype(spec, device, readings.append)
    spec = probe_gpu(spec, device, readings.append)  # as planner probe: the GPU the program runs on
    resolved: ResolvedJob = resolve(spec, db, local=True)  # the program runs here: this machine's host memory
    if resolved.workload.is_rlhf:
        raise InputError("planner probe -- CMD measures single-model programs (sft, reward, dpo); not RLHF yet")
    check_ranks(resolved, device)
    return resolved


def command_fingerprint(command: list[str]) -> dict[str, Any]:
    """The program's fingerprint (``probes.script.launch.program_fingerprint``: command line, script sha256,
    library versions); InputError for no command."""
    if not command:
        raise InputError("planner probe -- CMD: give the launch command of your program after --")
    from probes.script.launch import program_fingerprint  # lazy on purpose: probes loads torch

    return program_fingerprint(list(command))


def probe_program(
    model: str | JobSpec,
    command: list[str],
    *,
    strategies: str = "recommended",
    steps: int = 4,
    timeout_s: float = 600.0,
    device: str = "cuda",
    calibration: str = "auto",
    db: str | None = None,
    force: bool = False,
    memory_cap: str | int | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    runner: Callable[..., Any] | None = None,
    **job: Any,
) -> ProgramProbeReport:
    """Run ``command`` (a launch line: ``python train.py``, ``torchrun ...``, ``accelerate launch ...``) once per
    strategy and compare each phase with the prediction. ``runner`` defaults to
    ``probes.script.launch.run_script_probe``; ``steps`` counts warm-up and timed steps as ``planner probe``'s.
    Each run is stored in ``db`` under the program's fingerprint and reused by a later call (``force``: run
    again); ``on_progress`` is called as each run starts (not for a reused one). ``memory_cap`` (CPU backend):
    the live bytes that count as out of memory in the program."""
    if not command:
        raise InputError("planner probe -- CMD: give the launch command of your program after --")
    command = check_command(command)  # one that cannot start is bad input: refused before the database opens
    device, steps, timeout_s = check_run(device, steps, timeout_s)
    if runner is None:  # a runner stands in for the device (tests): no device to look for
        check_device_present(device)
    cap = parse_size(memory_cap, "--memory-cap") if memory_cap is not None else None
    readings: list[str] = []
    resolved = program_job(model, device, db, readings, job)
    resolved, coef, _ = calibrated(resolved, coefficients, choice=calibration, db=db, target=device_target(device))
    chosen = choose_strategies(resolved, strategies, coef, top=DEFAULT_STRATEGIES)
    if strategies == "recommended":
        chosen = chosen[:DEFAULT_STRATEGIES]
    program = command_fingerprint(command)
    if on_note is not None:
        for line in readings:
            on_note(line)
    if runner is None:  # DeepSpeed's ops the program loads: built before its first run, outside its timeout
        from planner.probing.program_ops import prepare_program_ops

        singles = [s for s in chosen if isinstance(s, Strategy)]
        prepare_program_ops(singles, resolved.workload, resolved.hardware, device, on_note=on_note)
    runs = []
    for index, strategy in enumerate(chosen):
        assert isinstance(strategy, Strategy)
        started = None
        if on_progress is not None:
            started = partial(on_progress, strategy.describe(), index, len(chosen))
        done = run_program_strategy(
            resolved,
            strategy,
            list(command),
            program=program,
            device=device,
            steps=steps,
            timeout_s=timeout_s,
            coef=coef,
            db=db,
            force=force,
            memory_cap_bytes=cap,
            runner=runner,
            on_start=started,
        )
        runs.append(done.run)
    ident = program_id(program)
    reused = sum(run.reused for run in runs)
    if reused:
        readings.append(
            f"{reused} of {len(runs)} runs reused from the database (the same program, job, strategy and steps); "
            "--force runs them again"
        )
    readings.append(f"program id {ident}: planner recommend --program {ident} keeps its measured spread free")
    return ProgramProbeReport(
        command=tuple(command),
        program=program,
        device=device,
        runs=tuple(runs),
        readings=tuple(readings) + resolved.readings,
        program_id=ident,
    )

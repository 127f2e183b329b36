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

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from planner.job.calibrated import calibrated
from planner.job.inputs import JobSpec, ResolvedJob, resolve
from planner.job.target import device_target
from planner.planning.program_build import seen_model_build
from planner.planning.program_spread import run_spread, stored_probes
from planner.probing.command import check_command
from planner.probing.device import cpu_probe_dtype, device_coefficients, device_prediction, probe_gpu
from planner.probing.limits import check_device_present, check_run
from planner.probing.plan import check_ranks, choose_strategies
from planner.probing.program_runs import (
    MAX_COMPARED_PROBES,
    ProgramPhase,
    ProgramProbeReport,
    ProgramRun,
    StoredProgramRun,
    program_request,
    program_run,
    stored_result,
)
from planner.probing.runs import reusable
from planner.probing.settings import ProbeSettings
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction, predict
from store.db import open_storage
from store.errors import InputError
from store.measurements import program_id
from store.records import RLHFStrategy, Strategy

__all__ = [
    "DEFAULT_STRATEGIES",
    "ProgramPhase",
    "ProgramProbeReport",
    "ProgramRun",
    "StoredProgramRun",
    "command_fingerprint",
    "probe_program",
    "program_job",
    "run_program_strategy",
    "stored_result",
]

DEFAULT_STRATEGIES = 2  # the plan and its next best


def run_program_strategy(
    job: ResolvedJob,
    strategy: Strategy,
    command: list[str],
    *,
    program: dict[str, Any],
    settings: ProbeSettings,
    coef: Coefficients,
    db: str | None,
    force: bool = False,
    runner: Callable[..., Any] | None = None,
    on_start: Callable[[], None] | None = None,
) -> StoredProgramRun:
    """Run ``command`` under one strategy as ``settings`` say (or reuse the stored run of the same program, job,
    strategy, device and steps: a ``timeout`` only when it had at least ``settings.timeout_s``; ``force`` runs it
    again), store the run as a probe in ``db`` and compare it with the prediction and with memplan's own stored
    probe of the strategy. The prediction is made before the program runs, so nothing the run measures feeds it:
    it builds a ZeRO-3 model as the program's earlier stored runs saw it build
    (:func:`planner.planning.program_build.seen_model_build`), where they saw it. ``coef``
    are the job's coefficients (the probed device's view is taken here);
    ``on_start`` is called just before the program starts (not for a reused run); ``settings.memory_cap_bytes``
    (CPU backend) is the live bytes that count as out of memory in the program, as ``--memory-cap`` of a built-in
    probe. ``runner`` (tests) stands in for ``probes.script.launch.run_script_probe``; ``settings.runner``, a
    built-in probe's runner, is not used."""
    from probes.measure.fingerprint import versions as software_versions  # lazy on purpose: probes loads torch

    device = settings.device
    prediction = _predicted(job, strategy, program, device, coef, db)
    request = program_request(job, strategy, program, settings)
    key = request.key(software_versions())
    with open_storage(db) as storage:
        known = None if force else storage.find_probe(key)
        if known is not None and reusable(known, request):
            record, result, ran = known, known.result, False
        else:
            from probes.script.launch import run_script_probe  # lazy on purpose: probes loads torch

            script = _script_settings(job, strategy, settings)
            if on_start is not None:
                on_start()
            result = stored_result((runner or run_script_probe)(list(command), script, settings.timeout_s), device)
            record = storage.save_probe(request, result, key=key)
            ran = True
        stored = list(storage.list_probes(limit=MAX_COMPARED_PROBES, kind=job.workload.kind, device=device))
    spread = run_spread(record, stored)
    run = program_run(strategy, result, prediction, record.probe_id, not ran, spread)
    return StoredProgramRun(run, record.probe_id, result, ran)


def _predicted(
    job: ResolvedJob, strategy: Strategy, program: dict[str, Any], device: str, coef: Coefficients, db: str | None
) -> Prediction:
    """The prediction put beside the program's run, made before it runs: on ``device``, with the model built as
    the program's stored runs saw it build (:mod:`planner.planning.program_build`), as ``recommend --program``
    plans it; by ``--framework``'s rule where none saw it."""
    ident = program_id(program)
    earlier = [record for record in stored_probes(db) if record.request.program_id == ident]  # none: a first run
    seen = seen_model_build(ident, earlier)
    workload = job.workload if seen is None else replace(job.workload, model_build=seen[0])
    return device_prediction(predict(workload, strategy, job.hardware, device_coefficients(device, coef)), device)


def _script_settings(job: ResolvedJob, strategy: Strategy, settings: ProbeSettings) -> Any:
    """What the start-up hook (:mod:`probes.script`) applies of ``strategy`` and how long it measures."""
    from probes.script.settings import ScriptProbeSettings  # lazy on purpose: probes loads torch
    from probes.step.warmup import warmup_steps  # the built-in probes' rule: two under ZeRO-3

    warmup, _ = warmup_steps(strategy, settings.steps)
    return ScriptProbeSettings.for_strategy(
        strategy,
        job.workload,
        job.hardware,
        device=settings.device,
        warmup_steps=warmup,
        timed_steps=settings.steps - warmup,
        memory_cap_bytes=settings.memory_cap_bytes,
    )


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


def _run_each(
    job: ResolvedJob,
    chosen: list[Strategy | RLHFStrategy],
    command: list[str],
    program: dict[str, Any],
    settings: ProbeSettings,
    *,
    coef: Coefficients,
    db: str | None,
    force: bool,
    runner: Callable[..., Any] | None,
    on_progress: Callable[[str, int, int], None] | None,
) -> list[ProgramRun]:
    """The program run (or its stored run reused) once per chosen strategy, in order."""
    runs: list[ProgramRun] = []
    for index, strategy in enumerate(chosen):
        assert isinstance(strategy, Strategy)
        started = None
        if on_progress is not None:
            started = partial(on_progress, strategy.describe(), index, len(chosen))
        done = run_program_strategy(
            job,
            strategy,
            list(command),
            program=program,
            settings=settings,
            coef=coef,
            db=db,
            force=force,
            runner=runner,
            on_start=started,
        )
        runs.append(done.run)
    return runs


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
    settings = ProbeSettings.checked(device=device, steps=steps, timeout_s=timeout_s, memory_cap=memory_cap)
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
    runs = _run_each(
        resolved,
        chosen,
        command,
        program,
        settings,
        coef=coef,
        db=db,
        force=force,
        runner=runner,
        on_progress=on_progress,
    )
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

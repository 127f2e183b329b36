"""``planner.tuning``: confirm a plan on the real device. The cost model ranks the space, an Optuna study
(kept in the plan database through Optuna's RDB storage) decides which candidate each probe runs, every
probe refits the calibration, and the tune stops when a measured plan fits and nothing untested is
predicted faster than it by more than its measured noise.

Reads top to bottom: resolve the job on the probed device's calibration; rank the strategies the search
predicts to fit (the study's candidates, fixed when it is created, so a resumed or shared study asks over
the same ones); then, round after round: enqueue the untested candidate predicted fastest, ask the study
for a trial, probe it (or reuse a stored probe of it), tell the study its measured step time (an OOM or a
plan over the GPU budget is a failed trial: infeasible), refit the calibration and re-rank. Finally save a
calibration and the confirmed plan, exportable like any plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.job.calibrated import calibrated
from planner.job.inputs import JobSpec, ResolvedJob, resolve
from planner.job.target import device_target, target_hardware
from planner.probing.command import check_command
from planner.probing.device import cpu_probe_dtype, probe_gpu
from planner.probing.limits import check_device_present, check_run, check_study_name
from planner.probing.plan import check_ranks
from planner.probing.program import command_fingerprint
from planner.probing.settings import ProbeSettings
from planner.report.results import TuneReport
from planner.tuning.claims import open_claims
from planner.tuning.rounds import run_rounds
from planner.tuning.setup import TuneSetup
from planner.tuning.study import (
    MAX_PROBES,
    ProgramCommand,
    candidate_space,
    open_study,
    parse_candidate,
    study_name,
)
from search import DEFAULT_COEFFICIENTS, Coefficients
from store.db import optuna_storage_url
from store.errors import InputError
from store.frameworks import DEFAULT_FRAMEWORK
from store.measurements import ProbeRequest, ProbeResult, program_id


def tune(
    model: str | JobSpec,
    *,
    device: str = "cuda",
    steps: int = 4,
    timeout_s: float = 600.0,
    max_probes: int = 8,
    memory_cap: str | int | None = None,
    study: str | None = None,
    db: str | None = None,
    calibration: str = "auto",
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    runner: Callable[[ProbeRequest], ProbeResult] | None = None,
    on_progress: Callable[[str], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    command: list[str] | None = None,
    **job: Any,
) -> TuneReport:
    """Probe the candidates the cost model ranks first until a measured plan fits with the planned headroom
    (on ``gpus`` GPUs of this node: each probe runs that many ranks, and its worst rank is what counts)
    and no untested candidate is predicted faster than it by more than its measured noise (or ``max_probes``
    probes ran), and save that plan. ``study`` names the Optuna study (default: one per job and device), kept
    in ``db`` beside the plans and probes: an interrupted tune, run again, resumes; several machines on one
    database share the work. ``runner`` defaults to ``probes.run_probe``; ``on_progress`` gets one line as each
    probe starts, ``on_note`` the lines about how the job was read (on ``cpu``: the dtype chosen and why) and,
    before the first probe, how long the probes may take when that is minutes (:mod:`planner.probing.estimate`).
    A candidate whose probe timed out is probed again when ``timeout_s`` is longer than that probe had.

    ``command`` (``planner tune ... -- CMD``): each candidate runs in the user's own program instead of memplan's
    loop (:func:`planner.probing.program.run_program_strategy`: the hook overrides the strategy's keys in the
    config the program passes), stored under the program's fingerprint; the study is the program's own.
    """

    device, steps, timeout_s = check_run(device, steps, timeout_s)  # what planner probe checks, before anything runs
    if runner is None:  # a runner stands in for the device (tests): no device to look for
        check_device_present(device)
    study, command = _checked(max_probes, study, command)
    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    readings: list[str] = []  # said once the whole input is checked: a refused tune prints one line
    resolved = _tuned_job(spec, device, db, readings, program=bool(command))
    target = device_target(device)
    resolved, coef, calibration_block = calibrated(resolved, coefficients, choice=calibration, db=db, target=target)
    resolved = ResolvedJob(resolved.workload, target_hardware(resolved.hardware, target), resolved.readings)
    settings = ProbeSettings.checked(
        device=device, steps=steps, timeout_s=timeout_s, memory_cap=memory_cap, runner=runner
    )
    program = _program(command, readings)
    url = optuna_storage_url(db)
    name = study or study_name(resolved, device, program_id(program.program) if program else None)
    the_study = open_study(url, name, candidate_space(resolved, coef))
    if on_note is not None:
        for line in readings:
            on_note(line)
    space: list[str] = list(the_study.user_attrs["candidates"])
    if program is not None and runner is None:  # DeepSpeed's ops the program loads: built once, outside its timeout
        from planner.probing.program_ops import prepare_program_ops
        from store.records import Strategy

        singles = [s for s in (parse_candidate(resolved, key) for key in space) if isinstance(s, Strategy)]
        prepare_program_ops(singles, resolved.workload, resolved.hardware, device, on_note=on_note)
    claims = open_claims(url, name)  # each candidate to one tune of the study (planner.tuning.claims)
    try:
        setup = TuneSetup(
            job=resolved,
            study=the_study,
            space=space,
            coef=coef,
            base=coefficients,
            target=target,
            settings=settings,
            db=db,
            max_probes=max_probes,
            calibration_block=calibration_block,
            claims=claims,
            program=program,
        )
        return run_rounds(setup, on_progress=on_progress, on_note=on_note)
    finally:
        claims.close()


def _checked(max_probes: int, study: str | None, command: list[str] | None) -> tuple[str | None, list[str] | None]:
    """(the study name, the program's command), each checked: one InputError line for a bad value, before the
    database opens (a command that cannot start is bad input)."""
    if isinstance(max_probes, bool) or not isinstance(max_probes, int) or not 1 <= max_probes <= MAX_PROBES:
        raise InputError(f"--max-probes must be a whole number from 1 to {MAX_PROBES}, not {max_probes!r}")
    study = check_study_name(study)
    if command is not None and not command:
        raise InputError("planner tune -- CMD: give the launch command of your program after --")
    if command is not None:
        command = check_command(command)
    return study, command


def _tuned_job(spec: JobSpec, device: str, db: str | None, readings: list[str], *, program: bool) -> ResolvedJob:
    """The job as this node probes it (the dtype and GPU the probes run, this machine's host memory, at most the
    ranks this node has); InputError for what a tune cannot confirm (RLHF in a program, several nodes)."""
    spec = cpu_probe_dtype(spec, device, readings.append)
    spec = probe_gpu(spec, device, readings.append)  # as planner probe: the GPU the probes run on
    resolved = resolve(spec, db, local=True)  # the probes run here: this machine's host memory
    if program and resolved.workload.is_rlhf:
        raise InputError("planner tune -- CMD confirms single-model programs (sft, reward, dpo); not RLHF yet")
    if resolved.workload.framework != DEFAULT_FRAMEWORK and not program:
        readings.append(
            f"--framework {resolved.workload.framework}: candidates are ranked for its program, but each probe runs "
            "memplan's own DeepSpeed loop (probes.step.phases_sft), so a measured peak is that loop's"
        )
    if resolved.hardware.nodes > 1:
        raise InputError(
            "tune probes the plan on this node: give --nodes 1 (planner probe measures one node of a multi-node plan)"
        )
    check_ranks(resolved, device)  # --gpus N: each probe runs N ranks on this node, the worst rank counts
    return resolved


def _program(command: list[str] | None, readings: list[str]) -> ProgramCommand | None:
    """``planner tune ... -- CMD``: the user's program each candidate runs in (said in ``readings``); None: memplan's
    own loop."""
    if not command:
        return None
    program = ProgramCommand(tuple(command), command_fingerprint(list(command)))
    readings.append(
        f"each candidate runs in your program {program_id(program.program)} ({' '.join(command)}), "
        "not memplan's loop; its runs are stored and reused under the program's fingerprint"
    )
    return program

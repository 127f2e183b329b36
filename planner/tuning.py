"""``planner.tune``: confirm a plan on the real device. The cost model ranks the space, an Optuna study
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

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from planner.inputs import JobSpec, ResolvedJob, resolve
from planner.probe_device import cpu_probe_dtype
from planner.probe_limits import check_run, check_study_name
from planner.results import TuneReport
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction, predict, search
from store.errors import InputError
from store.measurements import ProbeRequest, ProbeResult
from store.records import RLHFStrategy, Strategy

SPACE_SIZE = 24  # candidates a study asks over: the fastest predicted to fit
NOISE_FLOOR = 0.02  # a step time is never known better than this
MAX_PROBES = 50
STUDY_PREFIX = "memplan-tune-"
STUDY_OPEN_ATTEMPTS = 8


def candidate_key(strategy: Strategy | RLHFStrategy) -> str:
    """The candidate's name in the study: its strategy document as canonical JSON."""
    return json.dumps(strategy.to_dict(), sort_keys=True, separators=(",", ":"))


def study_name(job: ResolvedJob, device: str) -> str:
    """The default study of a job on a device: a hash of the workload, hardware and device."""
    text = json.dumps([job.workload.to_dict(), job.hardware.to_dict(), device], sort_keys=True)
    return STUDY_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_candidate(job: ResolvedJob, key: str) -> Strategy | RLHFStrategy:
    """The strategy a candidate key names (the shape of the job's workload)."""
    data = json.loads(key)
    return RLHFStrategy.from_dict(data) if job.workload.is_rlhf else Strategy.from_dict(data)


def predicted_for(job: ResolvedJob, key: str, coef: Coefficients, device: str) -> Prediction:
    """The candidate's prediction as the probed device shows it (the CPU backend's view on ``cpu``)."""
    from planner.probe_device import device_coefficients, device_prediction

    return device_prediction(
        predict(job.workload, parse_candidate(job, key), job.hardware, device_coefficients(device, coef)), device
    )


def _space(job: ResolvedJob, coef: Coefficients) -> list[str]:
    """The candidates: distinct strategies the search predicts to fit, fastest first (those a probe can run:
    DeepSpeed's own generation for RLHF)."""
    result = search(job.workload, job.hardware, coef, rollouts=("hybrid-engine",))
    keys: list[str] = []
    for candidate in result.feasible:
        key = candidate_key(candidate.strategy)
        if key not in keys:
            keys.append(key)
    if not keys:
        raise InputError("no strategy is predicted to fit this job: nothing to tune (see planner recommend)")
    return keys[:SPACE_SIZE]


def step_noise(result: ProbeResult) -> float:
    """The measured relative spread of a probe's step time ((max - min) / median over its steps)."""
    spread = result.extra.get("step_time_s") or {}
    median = float(spread.get("median") or 0.0)
    if median <= 0:
        return NOISE_FLOOR
    return max(NOISE_FLOOR, (float(spread.get("max", median)) - float(spread.get("min", median))) / median)


@contextmanager
def study_errors(url: str) -> Iterator[None]:
    """Failures of Optuna's storage in the block (a table schema from another Optuna version, a damaged or
    unusable database) as one InputError line naming the database (password hidden)."""
    from optuna.exceptions import OptunaError
    from sqlalchemy import make_url
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except InputError:
        raise
    except (RuntimeError, OptunaError, SQLAlchemyError) as exc:  # Optuna's schema checks raise RuntimeError
        shown = make_url(url).render_as_string(hide_password=True)
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split()) or type(exc).__name__
        raise InputError(f"cannot use the Optuna study of the tune in database {shown}: {reason}") from None


def _open_study(url: str, name: str, space: list[str]) -> Any:
    """The study ``name`` in the database at ``url`` (created with ``space`` as its candidates, or loaded
    with the candidates it was created with); InputError (``study_errors``) when Optuna cannot use it."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from store.db import connect_args

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with study_errors(url):
        for attempt in range(STUDY_OPEN_ATTEMPTS):
            try:  # two machines starting on a new database both create Optuna's tables: the second one waits
                kwargs = {"connect_args": connect_args(url)}  # PostgreSQL: UTF-8 even on a SQL_ASCII database
                storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
                study = optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
                break
            except SQLAlchemyError:
                if attempt == STUDY_OPEN_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        if "candidates" not in study.user_attrs:
            study.set_user_attr("candidates", space)
    return study


def refit_values(base: Coefficients, target: str, db: str | None, device: str) -> dict[str, float]:
    """Calibration values refit to every stored probe of the device (no held-out pass: that is for the end)."""
    from planner.calibration_data import gather, stored_entries
    from search.calibration import calibrate

    try:
        return dict(
            calibrate(gather(stored_entries(db, device), target, db=db).observations, base, leave_one_out=False).values
        )
    except (InputError, ValueError):
        return {}


def probe_candidate(
    job: ResolvedJob,
    key: str,
    *,
    device: str,
    steps: int,
    timeout_s: float,
    memory_cap_bytes: int | None,
    coef: Coefficients,
    db: str | None,
    runner: Callable[[ProbeRequest], ProbeResult],
    prepare: bool,
) -> tuple[str, ProbeResult, bool]:
    """(probe id, result, whether it ran now) of the candidate at full depth: a stored probe of the same
    request is reused, so a resumed tune runs nothing twice."""
    from planner.probing import plan_probes
    from store.db import open_storage

    planned = plan_probes(
        job,
        [parse_candidate(job, key)],
        device=device,
        steps=steps,
        layers=None,
        timeout_s=timeout_s,
        memory_cap_bytes=memory_cap_bytes,
        coef=coef,
    )
    item = next((p for p in planned if p.layers is None), None)
    if item is None:
        raise InputError("tune probes the whole model: on the CPU backend that is a model of at most 200M parameters")
    with open_storage(db) as storage:
        known = storage.find_probe(item.key)
        if known is not None:
            return known.probe_id, known.result, False
    if prepare:  # the real runner loads DeepSpeed's ops: built once per process, before the probe
        from probes import prepare_ops

        prepare_ops([item.request])
    result = runner(item.request)
    with open_storage(db) as storage:
        record = storage.save_probe(item.request, result, key=item.key)
    return record.probe_id, result, True


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
    **job: Any,
) -> TuneReport:
    """Probe the candidates the cost model ranks first until a measured plan fits with the planned headroom
    (on ``gpus`` GPUs of this node: each probe runs that many ranks, and its worst rank is what counts)
    and no untested candidate is predicted faster than it by more than its measured noise (or ``max_probes``
    probes ran), and save that plan. ``study`` names the Optuna study (default: one per job and device), kept
    in ``db`` beside the plans and probes: an interrupted tune, run again, resumes; several machines on one
    database share the work. ``runner`` defaults to ``probes.run_probe``; ``on_progress`` gets one line per
    probe, ``on_note`` the lines about how the job was read (on ``cpu``: the dtype chosen and why).
    """
    from planner.calibration_data import device_target, target_hardware
    from planner.calibration_use import calibrated
    from store.db import optuna_storage_url
    from store.frameworks import DEFAULT_FRAMEWORK
    from store.sizes import parse_size

    device, steps, timeout_s = check_run(device, steps, timeout_s)  # what planner probe checks, before anything runs
    if isinstance(max_probes, bool) or not isinstance(max_probes, int) or not 1 <= max_probes <= MAX_PROBES:
        raise InputError(f"--max-probes must be a whole number from 1 to {MAX_PROBES}, not {max_probes!r}")
    study = check_study_name(study)
    from dataclasses import replace

    from planner.api import PROBE_GPU_MEM

    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    readings: list[str] = []  # said once the whole input is checked: a refused tune prints one line
    spec = cpu_probe_dtype(spec, device, readings.append)
    if spec.gpu_mem is None and spec.gpu is None:
        spec = replace(spec, gpu_mem=PROBE_GPU_MEM[device])
    resolved = resolve(spec, db)
    if resolved.workload.framework != DEFAULT_FRAMEWORK:
        readings.append(
            f"--framework {resolved.workload.framework}: candidates are ranked for its program, but each probe runs "
            "memplan's own DeepSpeed loop (probes.phases_sft), so a measured peak is that loop's"
        )
    if resolved.hardware.nodes > 1:
        raise InputError(
            "tune probes the plan on this node: give --nodes 1 (planner probe measures one node of a multi-node plan)"
        )
    from planner.probing import check_ranks

    check_ranks(resolved, device)  # --gpus N: each probe runs N ranks on this node, the worst rank counts
    target = device_target(device)
    resolved, coef, calibration_block = calibrated(resolved, coefficients, choice=calibration, db=db, target=target)
    resolved = ResolvedJob(resolved.workload, target_hardware(resolved.hardware, target), resolved.readings)
    cap = parse_size(memory_cap, "--memory-cap") if memory_cap is not None else None
    url = optuna_storage_url(db)
    name = study or study_name(resolved, device)
    the_study = _open_study(url, name, _space(resolved, coef))
    if on_note is not None:
        for line in readings:
            on_note(line)
    space: list[str] = list(the_study.user_attrs["candidates"])
    own_runner = runner is None
    if runner is None:
        from probes import run_probe

        runner = run_probe
    from planner.tuning_rounds import run_rounds

    return run_rounds(
        resolved,
        the_study,
        space,
        coef=coef,
        base=coefficients,
        target=target,
        device=device,
        steps=steps,
        timeout_s=float(timeout_s),
        cap=cap,
        db=db,
        runner=runner,
        prepare=own_runner,
        max_probes=max_probes,
        on_progress=on_progress,
        calibration_block=calibration_block,
    )

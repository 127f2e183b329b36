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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from planner.inputs import JobSpec, ResolvedJob, resolve
from planner.results import TuneReport
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction, predict, search
from store.errors import InputError
from store.measurements import ProbeRequest, ProbeResult
from store.records import RLHFStrategy, Strategy

SPACE_SIZE = 24  # candidates a study asks over: the fastest predicted to fit
ENQUEUED_FIRST = 3  # the predicted best, probed first
NOISE_FLOOR = 0.02  # a step time is never known better than this
MAX_PROBES = 50
STUDY_PREFIX = "memplan-tune-"
STUDY_OPEN_ATTEMPTS = 8


@dataclass
class _Round:
    """What the tune knows so far: the measured candidates and the coefficients they calibrate."""

    coef: Coefficients
    job: ResolvedJob
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # candidate key -> outcome, probe, times
    probes_run: int = 0
    device_seconds: float = 0.0


def candidate_key(strategy: Strategy | RLHFStrategy) -> str:
    """The candidate's name in the study: its strategy document as canonical JSON."""
    return json.dumps(strategy.to_dict(), sort_keys=True, separators=(",", ":"))


def study_name(job: ResolvedJob, device: str) -> str:
    """The default study of a job on a device: a hash of the workload, hardware and device."""
    text = json.dumps([job.workload.to_dict(), job.hardware.to_dict(), device], sort_keys=True)
    return STUDY_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]


def _parse(job: ResolvedJob, key: str) -> Strategy | RLHFStrategy:
    data = json.loads(key)
    return RLHFStrategy.from_dict(data) if job.workload.is_rlhf else Strategy.from_dict(data)


def _predicted(job: ResolvedJob, key: str, coef: Coefficients, device: str) -> Prediction:
    from planner.probe_device import device_coefficients, device_prediction

    return device_prediction(
        predict(job.workload, _parse(job, key), job.hardware, device_coefficients(device, coef)), device
    )


def _space(job: ResolvedJob, coef: Coefficients) -> list[str]:
    """The candidates: distinct strategies the search predicts to fit, fastest first."""
    result = search(job.workload, job.hardware, coef)
    keys: list[str] = []
    for candidate in result.feasible:
        key = candidate_key(candidate.strategy)
        if key not in keys:
            keys.append(key)
    if not keys:
        raise InputError("no strategy is predicted to fit this job: nothing to tune (see planner recommend)")
    return keys[:SPACE_SIZE]


def _noise(result: ProbeResult) -> float:
    """The measured relative spread of a probe's step time ((max - min) / median over its steps)."""
    spread = result.extra.get("step_time_s") or {}
    median = float(spread.get("median") or 0.0)
    if median <= 0:
        return NOISE_FLOOR
    return max(NOISE_FLOOR, (float(spread.get("max", median)) - float(spread.get("min", median))) / median)


def _open_study(url: str, name: str, space: list[str]) -> Any:
    """The study ``name`` in the database at ``url`` (created with ``space`` as its candidates, or loaded
    with the candidates it was created with)."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for attempt in range(STUDY_OPEN_ATTEMPTS):
        try:  # two machines starting on a new database both create Optuna's tables: the second one waits
            storage = optuna.storages.RDBStorage(url)
            study = optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
            break
        except SQLAlchemyError:
            if attempt == STUDY_OPEN_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    if "candidates" not in study.user_attrs:
        study.set_user_attr("candidates", space)
    return study


def _refit(base: Coefficients, target: str, db: str | None, device: str) -> dict[str, float]:
    """Calibration values refit to every stored probe of the device (no held-out pass: that is for the end)."""
    from planner.calibration_data import gather
    from search.calibration import calibrate
    from store.db import open_storage

    with open_storage(db) as storage:
        stored = storage.list_probes(limit=100_000, device=device)
    entries = [(p.probe_id, p.request.to_dict(), p.result.to_dict()) for p in stored]
    try:
        return dict(calibrate(gather(entries, target).observations, base, leave_one_out=False).values)
    except (InputError, ValueError):
        return {}


def _probe_once(
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
        [_parse(job, key)],
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
    **job: Any,
) -> TuneReport:
    """Probe the candidates the cost model ranks first until a measured plan fits with the planned headroom
    (on ``gpus`` GPUs of this node: each probe runs that many ranks, and its worst rank is what counts)
    and no untested candidate is predicted faster than it by more than its measured noise (or ``max_probes``
    probes ran), and save that plan. ``study`` names the Optuna study (default: one per job and device), kept
    in ``db`` beside the plans and probes: an interrupted tune, run again, resumes; several machines on one
    database share the work. ``runner`` defaults to ``probes.run_probe``; ``on_progress`` gets one line per
    probe.
    """
    from planner.calibration_data import device_target, target_hardware
    from planner.calibration_use import calibrated
    from store.db import optuna_storage_url
    from store.sizes import parse_size

    if device not in ("cuda", "cpu"):
        raise InputError(f"--device must be cuda or cpu, not {device!r}")
    if isinstance(max_probes, bool) or not isinstance(max_probes, int) or not 1 <= max_probes <= MAX_PROBES:
        raise InputError(f"--max-probes must be a whole number from 1 to {MAX_PROBES}, not {max_probes!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise InputError(f"--steps must be a whole number >= 2 (warm-up comes first), not {steps!r}")
    from dataclasses import replace

    from planner.api import PROBE_GPU_MEM

    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    if spec.gpu_mem is None and spec.gpu is None:
        spec = replace(spec, gpu_mem=PROBE_GPU_MEM[device])
    resolved = resolve(spec, db)
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
    space: list[str] = list(the_study.user_attrs["candidates"])
    own_runner = runner is None
    if runner is None:
        from probes import run_probe

        runner = run_probe
    return _rounds(
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


def _measured_so_far(study: Any) -> dict[str, dict[str, Any]]:
    """What earlier runs of the study measured: its finished trials' outcomes, by candidate."""
    from optuna.trial import TrialState

    out: dict[str, dict[str, Any]] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if "candidate" in trial.params and "probe_id" in trial.user_attrs:
            out[trial.params["candidate"]] = dict(trial.user_attrs)
    return out


def _running_elsewhere(study: Any, but: int | None = None) -> set[str]:
    """The candidates of the study's running trials (but trial number ``but``, this run's own)."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return {t.params["candidate"] for t in running if t.number != but and "candidate" in t.params}


def _outcome(result: ProbeResult, probe_id: str, budget: int) -> dict[str, Any]:
    fits = result.outcome == "ok" and result.peak_reserved_bytes <= budget
    return {
        "probe_id": probe_id,
        "outcome": result.outcome,
        "fits": fits,
        "step_time_s": result.step_time_s if result.outcome == "ok" else None,
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "noise": _noise(result),
        "wall_s": result.wall_s,
    }


def _rounds(
    job: ResolvedJob,
    study: Any,
    space: list[str],
    *,
    coef: Coefficients,
    base: Coefficients,
    target: str,
    device: str,
    steps: int,
    timeout_s: float,
    cap: int | None,
    db: str | None,
    runner: Callable[[ProbeRequest], ProbeResult],
    prepare: bool,
    max_probes: int,
    on_progress: Callable[[str], None] | None,
    calibration_block: dict[str, Any],
) -> TuneReport:
    """The tune's rounds (see the module docstring) and its report."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from search.calibration import apply_values

    distribution = {"candidate": CategoricalDistribution(space)}
    measured = _measured_so_far(study)
    state = _Round(coef, job, measured)
    values: dict[str, float] = _refit(base, target, db, device) if measured else {}
    if not study.trials:
        for key in space[:ENQUEUED_FIRST]:
            study.enqueue_trial({"candidate": key}, skip_if_exists=True)
    stop = "probe budget spent"
    for _ in range(4 * len(space) + max_probes):
        hardware, fitted = apply_values(job.hardware, base, values) if values else (job.hardware, coef)
        current = ResolvedJob(job.workload, hardware, job.readings)
        predicted = {key: _predicted(current, key, fitted, device) for key in space}
        best = min(
            (k for k, m in state.measured.items() if m["fits"]),
            key=lambda k: state.measured[k]["step_time_s"],
            default=None,
        )
        untested = sorted((k for k in space if k not in state.measured), key=lambda k: predicted[k].step_time_s)
        if best is not None:
            floor = state.measured[best]["step_time_s"] * (1 - state.measured[best]["noise"])
            if not any(predicted[k].step_time_s < floor for k in untested):
                stop = "confirmed: no untested candidate is predicted faster than the measured best beyond its noise"
                break
        if not untested:
            stop = "every candidate measured" if best else "every candidate measured; none fits"
            break
        if state.probes_run >= max_probes:
            break
        running = _running_elsewhere(study)  # candidates another machine on this study is probing now
        if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            study.enqueue_trial({"candidate": next((k for k in untested if k not in running), untested[0])})
        trial = study.ask(distribution)
        key = trial.params["candidate"]
        if key in _running_elsewhere(study, but=trial.number):  # the sampler's pick, being probed elsewhere
            trial.set_user_attr("duplicate", True)
            study.tell(trial, state=TrialState.FAIL)
            continue
        if key in state.measured:  # the sampler's own pick, already measured: tell it again and go on
            known = state.measured[key]
            if known["fits"]:
                study.tell(trial, known["step_time_s"])
            else:
                study.tell(trial, state=TrialState.FAIL)
            continue
        if on_progress is not None:
            on_progress(f"probe {state.probes_run + 1}/{max_probes}: {_parse(job, key).describe()}")
        try:
            probe_id, result, ran = _probe_once(
                current, key, device=device, steps=steps, timeout_s=timeout_s, memory_cap_bytes=cap, coef=fitted,
                db=db, runner=runner, prepare=prepare,
            )  # fmt: skip
        except BaseException:  # an interrupt (or a failure) leaves no trial running, and the candidate queued
            trial.set_user_attr("interrupted", True)
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial({"candidate": key})
            raise
        outcome = _outcome(result, probe_id, predicted[key].gpu_budget_bytes)
        for name, value in outcome.items():
            trial.set_user_attr(name, value)
        if outcome["fits"]:
            study.tell(trial, outcome["step_time_s"])
        else:
            study.tell(trial, state=TrialState.FAIL)
        state.measured[key] = outcome
        if ran:
            state.probes_run += 1
            state.device_seconds += result.wall_s
            values = _refit(base, target, db, device)
    return _report(job, study, space, state, values, base, target, device, db, stop, calibration_block)


def _report(
    job: ResolvedJob,
    study: Any,
    space: list[str],
    state: _Round,
    values: dict[str, float],
    base: Coefficients,
    target: str,
    device: str,
    db: str | None,
    stop: str,
    calibration_block: dict[str, Any],
) -> TuneReport:
    """Save the calibration of every probe so far and the confirmed plan; report each measured candidate."""
    from planner.calibrating import calibrate
    from planner.calibration_use import calibrated
    from planner.reports import prediction_report
    from planner.results import Plan
    from planner.saved import save_plan

    calibration_id = None
    if state.probes_run:
        try:
            calibration_id = calibrate(device_fingerprint=target, db=db).calibration_id
        except InputError:  # no probe of the device finished (every one ran out of memory): nothing to fit
            calibration_id = None
    if calibration_id is not None:
        job, coef, calibration_block = calibrated(job, base, choice=calibration_id, db=db, target=target)
    else:
        coef = state.coef
    rows = []
    for key, m in state.measured.items():
        prediction = _predicted(job, key, coef, device)
        rows.append({"strategy": json.loads(key), "predicted_step_time_s": prediction.step_time_s, **m})
    rows.sort(key=lambda r: (not r["fits"], r["step_time_s"] or float("inf")))
    best = rows[0] if rows and rows[0]["fits"] else None
    plan = None
    if best is not None:
        strategy = _parse(job, json.dumps(best["strategy"]))
        prediction = predict(job.workload, strategy, job.hardware, coef)
        report = prediction_report(job, strategy, prediction, calibration_block)
        tuned = {
            "study": study.study_name,
            "probe_id": best["probe_id"],
            "measured_step_time_s": best["step_time_s"],
            "measured_peak_reserved_bytes": best["peak_reserved_bytes"],
            "device": device,
        }
        plan = save_plan(Plan(**dict(report), search={"sampler": "tune", "tune": tuned}), db)
    return TuneReport(
        study=study.study_name,
        device=device,
        target=target,
        candidates=len(space),
        probes_run=state.probes_run,
        device_seconds=state.device_seconds,
        probes_measured=len(state.measured),
        stop_reason=stop,
        confirmed=stop.startswith("confirmed"),
        calibration_id=calibration_id,
        rows=rows,
        plan=plan,
    )

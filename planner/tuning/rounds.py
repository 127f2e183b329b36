"""The rounds of ``planner.tuning`` (see :mod:`planner.tuning.run`): rank the untested candidates with the current
calibration, enqueue the best one, ask the study, probe, tell, refit; then save the calibration and the
confirmed plan and report every measured candidate."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from planner.calibration.fit import calibrate
from planner.job.calibrated import calibrated
from planner.job.inputs import ResolvedJob
from planner.planning.figures import prediction_report
from planner.planning.saved import save_plan
from planner.probing.estimate import cost_note, device_step_time, probe_cost
from planner.probing.runs import ProbeSettings
from planner.report.results import Plan, TuneReport
from planner.tuning.claims import abandoned
from planner.tuning.setup import TuneSetup
from planner.tuning.study import (
    parse_candidate,
    predicted_for,
    probe_candidate,
    refit_values,
    step_noise,
)
from search import Coefficients, Prediction, predict
from search.calibration import apply_values
from store.db import open_storage
from store.errors import InputError
from store.measurements import ProbeResult
from store.records import strategy_label

TUNE_LESS = "--steps 2, fewer --max-probes, a smaller --batch, --seq-len or model"


@dataclass
class _Round:
    """What the tune knows so far: the measured candidates and the coefficients they calibrate."""

    coef: Coefficients
    job: ResolvedJob
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # candidate key -> outcome, probe, times
    probes_run: int = 0
    device_seconds: float = 0.0


def _measured_so_far(study: Any) -> dict[str, dict[str, Any]]:
    """What earlier runs of the study measured: its finished trials' outcomes, by candidate."""
    from optuna.trial import TrialState

    out: dict[str, dict[str, Any]] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if "candidate" in trial.params and "probe_id" in trial.user_attrs:
            attrs = trial.user_attrs
            out[trial.params["candidate"]] = {k: v for k, v in attrs.items() if not k.startswith("owner_")}
    return out


def _catch_up(state: _Round, study: Any, timeout_s: float, db: str | None) -> bool:
    """Add what the study's finished trials measured (this run's, earlier runs', other tunes') to ``state``;
    True when that is more than it knew. A timeout under a shorter timeout than ``timeout_s`` is left untested."""
    found = _measured_so_far(study)
    for key in _timed_out_shorter(found, timeout_s, db):
        del found[key]
    new = {k: v for k, v in found.items() if k not in state.measured}
    state.measured.update(new)
    return bool(new)


def _record(study: Any, distribution: Any, key: str, outcome: dict[str, Any]) -> None:
    """Add the candidate's finished trial to the study: its measured step time, or failed (infeasible)."""
    from optuna.trial import TrialState, create_trial

    fits = bool(outcome["fits"])
    study.add_trial(
        create_trial(
            params={"candidate": key},
            distributions={"candidate": distribution},
            value=outcome["step_time_s"] if fits else None,
            state=TrialState.COMPLETE if fits else TrialState.FAIL,
            user_attrs=outcome,
        )
    )


def _fail_abandoned_trials(study: Any) -> set[str]:
    """The candidates of running trials whose owner died without telling (a tune killed outright, by a memplan
    that kept a trial running while it probed): each trial is failed here and its candidate named an orphan, to
    be probed before the tune may stop. Left running, it would look like another machine's probe forever."""
    from optuna.trial import TrialState

    orphans = set()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if "candidate" in trial.params and abandoned(trial.user_attrs):
            study.tell(trial.number, state=TrialState.FAIL)
            orphans.add(trial.params["candidate"])
    return orphans


def _timed_out_shorter(measured: dict[str, dict[str, Any]], timeout_s: float, db: str | None) -> set[str]:
    """The candidates whose measured outcome is a timeout under a shorter timeout than ``timeout_s`` (their
    probe's request says): untested again, so the tune probes them again (``planner.probing.runs.reusable``)."""
    late = {key: str(m.get("probe_id")) for key, m in measured.items() if m.get("outcome") == "timeout"}
    if not late:
        return set()
    shorter = set()
    with open_storage(db) as storage:
        for key, probe_id in late.items():
            try:
                given = float(storage.get_probe(probe_id).request.timeout_s)
            except InputError:  # the probe is gone: probe the candidate again
                given = 0.0
            if given < timeout_s:
                shorter.add(key)
    return shorter


def _outcome(result: ProbeResult, probe_id: str, budget: int) -> dict[str, Any]:
    fits = result.outcome == "ok" and result.peak_reserved_bytes <= budget
    return {
        "probe_id": probe_id,
        "outcome": result.outcome,
        "fits": fits,
        "step_time_s": result.step_time_s if result.outcome == "ok" else None,
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "noise": step_noise(result),
        "wall_s": result.wall_s,
    }


def _announce(
    job: ResolvedJob,
    untested: list[str],
    *,
    predicted: dict[str, Prediction],
    coef: Coefficients,
    settings: ProbeSettings,
    budget: int,
    timed: bool,
) -> str | None:
    """The line saying how long the probes the tune may still run take (the ``budget`` untested candidates
    predicted fastest), when that is minutes or one would time out (:func:`planner.probing.estimate.cost_note`).
    ``timed``: the coefficients are calibrated to this CPU (a stored calibration, or the refit of its probes)."""
    costs = []
    for key in untested[: max(0, budget)]:
        strategy = parse_candidate(job, key)
        step = device_step_time(
            job.workload,
            strategy,
            job.hardware,
            predicted[key],
            device=settings.device,
            layers=None,
            coef=coef,
            timed=timed,
        )
        label = strategy_label(strategy, job.workload)
        costs.append(
            probe_cost(
                label, strategy, step, steps=settings.steps, device=settings.device, timeout_s=settings.timeout_s
            )
        )
    return cost_note(costs, device=settings.device, timed=timed, less=TUNE_LESS, up_to=True)


def _starting(
    announce: Callable[[], str | None] | None,
    announced: list[bool],
    on_note: Callable[[str], None] | None,
    on_progress: Callable[[str], None] | None,
    count: str,
    label: str,
) -> None:
    """As a probe starts (DeepSpeed's ops built): the estimate before the tune's first probe, then its line."""
    if announce is not None and on_note is not None and not announced:
        announced.append(True)
        line = announce()
        if line is not None:
            on_note(line)
    if on_progress is not None:
        on_progress(f"probe {count}: {label}")


def run_rounds(
    setup: TuneSetup, *, on_progress: Callable[[str], None] | None, on_note: Callable[[str], None] | None = None
) -> TuneReport:
    """The tune's rounds (see the module docstring) on ``setup`` and its report. ``on_progress`` gets a line as
    each probe starts; ``on_note`` one before the first, when the probes may take minutes
    (:mod:`planner.probing.estimate`)."""
    job, study, space, coef, base, target = setup.job, setup.study, setup.space, setup.coef, setup.base, setup.target
    settings, db, max_probes, claims, program = setup.settings, setup.db, setup.max_probes, setup.claims, setup.program
    distribution = _distribution(space)
    state = _Round(coef, job)
    orphans = _fail_abandoned_trials(study)  # a memplan that kept a trial running while it probed, killed
    values: dict[str, float] = {}
    stop = "probe budget spent"
    announced: list[bool] = []  # whether the estimate was said (before the first probe that runs)
    timed = settings.device == "cpu" and setup.calibration_block.get("id") is not None
    for round_number in range(4 * len(space) + max_probes):
        taken, freed = claims.held()  # candidates other tunes of the study probe now; orphans of dead ones
        orphans |= freed
        if _catch_up(state, study, settings.timeout_s, db) and round_number == 0:  # what earlier runs measured
            values = refit_values(base, target, db, settings.device)  # (each refit after a probe reads all probes)
        hardware, fitted = apply_values(job.hardware, base, values) if values else (job.hardware, coef)
        current = ResolvedJob(job.workload, hardware, job.readings)
        predicted = {key: predicted_for(current, key, fitted, settings.device) for key in space}
        untested, queued, worth, ended = _look(state, space, predicted, orphans)
        if ended is not None:
            stop = ended
            break
        if state.probes_run >= max_probes:
            break
        free = [k for k in dict.fromkeys([*queued, *worth]) if k not in taken]
        if not free:
            stop = "other tunes of this study are probing every candidate left"
            break
        key = next((k for k in free if claims.take(k)), None)
        if key is None:
            continue  # another tune took each one first: look again
        try:
            if _catch_up(state, study, settings.timeout_s, db) and key in state.measured:
                continue  # measured by another tune between the look and the claim
            announce = None if on_note is None or announced else partial(  # once, before the first probe that runs
                _announce, current, untested, predicted=predicted, coef=fitted, settings=settings,
                budget=max_probes - state.probes_run, timed=timed or bool(values),
            )  # fmt: skip
            count = f"{state.probes_run + 1}/{max_probes}"
            starting = partial(_starting, announce, announced, on_note, on_progress, count)
            try:
                probe_id, result, ran = probe_candidate(
                    current, key, settings, coef=fitted, db=db, on_start=starting, program=program
                )
            except BaseException:  # an interrupt (or a failure): said in the study, the candidate left untested
                _record(study, distribution, key, {"interrupted": True, "fits": False, "step_time_s": None})
                raise
            outcome = _outcome(result, probe_id, predicted[key].gpu_budget_bytes)
            _record(study, distribution, key, outcome)  # before the claim goes: whoever claims next finds it
        finally:  # an interrupt (or a failure) too: the candidate is free for the next tune
            claims.give_back(key)
        state.measured[key] = outcome
        orphans.discard(key)
        if ran:
            state.probes_run += 1
            state.device_seconds += result.wall_s
            values = refit_values(base, target, db, settings.device)
    stop += _unprobed(job, space, state, orphans)
    return _report(setup, state, values=values, stop=stop)


def _distribution(space: list[str]) -> Any:
    """The study's distribution of candidates (Optuna's, imported here: not at the CLI's start)."""
    from optuna.distributions import CategoricalDistribution

    return CategoricalDistribution(space)


def _look(
    state: _Round, space: list[str], predicted: dict[str, Any], orphans: set[str]
) -> tuple[list[str], list[str], list[str], str | None]:
    """The candidates of this round: untested (fastest predicted first), queued (a killed tune's, probed before
    stopping), worth probing (predicted faster than the measured best beyond its noise), and why the rounds end
    here (None: they go on)."""
    best = min(
        (k for k, m in state.measured.items() if m["fits"]),
        key=lambda k: state.measured[k]["step_time_s"],
        default=None,
    )
    untested = sorted((k for k in space if k not in state.measured), key=lambda k: predicted[k].step_time_s)
    queued = [k for k in untested if k in orphans]
    worth = untested
    if best is not None:
        floor = state.measured[best]["step_time_s"] * (1 - state.measured[best]["noise"])
        worth = [k for k in untested if predicted[k].step_time_s < floor]
        if not worth and not queued:
            return (
                untested,
                queued,
                worth,
                ("confirmed: no untested candidate is predicted faster than the measured best beyond its noise"),
            )
    if not untested:
        return untested, queued, worth, "every candidate measured" if best else "every candidate measured; none fits"
    return untested, queued, worth, None


def _unprobed(job: ResolvedJob, space: list[str], state: _Round, orphans: set[str]) -> str:
    """What the stop line adds for a killed tune's candidates that were not probed ('' when none)."""
    unprobed = [k for k in space if k in orphans and k not in state.measured]
    if not unprobed:
        return ""
    labels = ", ".join(strategy_label(parse_candidate(job, k), job.workload) for k in unprobed)
    return f"; not probed: {labels}, which a tune killed while probing it left (run again to probe it)"


def _report(setup: TuneSetup, state: _Round, *, values: dict[str, float], stop: str) -> TuneReport:
    """Save the calibration of every probe so far and the confirmed plan; report each measured candidate."""
    job, study, space, base, target = setup.job, setup.study, setup.space, setup.base, setup.target
    device, db, calibration_block = setup.settings.device, setup.db, setup.calibration_block
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
        prediction = predicted_for(job, key, coef, device)
        rows.append({"strategy": json.loads(key), "predicted_step_time_s": prediction.step_time_s, **m})
    rows.sort(key=lambda r: (not r["fits"], r["step_time_s"] or float("inf")))
    best = rows[0] if rows and rows[0]["fits"] else None
    plan = None
    if best is not None:
        strategy = parse_candidate(job, json.dumps(best["strategy"]))
        prediction = predict(job.workload, strategy, job.hardware, coef)
        report = prediction_report(job, strategy, prediction, calibration_block, coef)
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

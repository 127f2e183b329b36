"""``planner.probe``: run strategies for a few real steps, store what happened, compare with the cost model.

Reads top to bottom: choose the strategies, decide the depths (layer cuts), build one ProbeRequest per
(strategy, depth), skip those the database already holds (unless ``force``; a timeout only when it had at
least this timeout), resume an interrupted run of the same requests, say how long the rest will take when
that is minutes (:mod:`planner.probing.estimate`), run them one process each, then put measured beside
predicted and, for cut models, extrapolate per layer to the full depth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.job.calibrated import calibrated
from planner.job.inputs import JobSpec, ResolvedJob, resolve
from planner.job.target import device_target
from planner.probing.device import cpu_probe_dtype
from planner.probing.estimate import cost_note, planned_costs
from planner.probing.limits import check_device_present, check_run
from planner.probing.plan import (
    PlannedProbe,
    check_ranks,
    choose_strategies,
    depth_label,
    one_node,
    parse_layers,
    plan_probes,
)
from planner.probing.report import build_report
from planner.probing.runs import ProbeSession, reusable
from planner.probing.settings import ProbeSettings
from planner.report.results import ProbeReport, ProbeRow
from search import DEFAULT_COEFFICIENTS, Coefficients
from store.db import open_storage
from store.errors import InputError
from store.measurements import ProbeRequest, ProbeResult
from store.records import RLHFStrategy, Strategy


def probe(
    model: str | JobSpec,
    *,
    strategies: str = "recommended",
    steps: int = 4,
    layers: str | None = "auto",
    timeout_s: float = 600.0,
    device: str = "cuda",
    memory_cap: str | int | None = None,
    force: bool = False,
    db: str | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    runner: Callable[[ProbeRequest], ProbeResult] | None = None,
    calibration: str = "auto",
    **job: Any,
) -> ProbeReport:
    """Probe strategies on the device and report measured against predicted memory and time.

    ``runner`` defaults to ``probes.run_probe`` (each probe in its own process). ``on_progress`` is called
    with (strategy label, index, total) before each probe that actually runs. ``calibration`` as for
    ``recommend``, matched to the probed device (``cpu:<model>`` on the CPU backend).
    """

    device, steps, timeout_s = check_run(device, steps, timeout_s)
    if runner is None:  # a runner stands in for the device (tests): no device to look for
        check_device_present(device)
    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    readings: list[str] = []  # said once the whole input is checked: a refused probe prints one line
    resolved = _probed_job(spec, device, db, readings)
    resolved, coefficients, calibration_block = _calibrated(resolved, coefficients, device, calibration, db)
    settings = ProbeSettings.checked(
        device=device, steps=steps, timeout_s=timeout_s, memory_cap=memory_cap, runner=runner
    )
    depths = parse_layers(layers, resolved.workload.model.num_layers)
    chosen = choose_strategies(resolved, strategies, coefficients)
    refuse_quantized_probe(chosen)
    probed, notes = one_node(resolved)
    planned = plan_probes(probed, chosen, settings, layers=depths, coef=coefficients)
    if on_note is not None:
        for line in readings:
            on_note(line)
    costs = _Costs(probed, coefficients, timed=device == "cpu" and calibration_block.get("id") is not None)
    storage = open_storage(db)
    try:
        session = ProbeSession(storage, runner, on_note)
        keys = [p.key for p in planned]
        run = storage.unfinished_run(keys) or storage.start_run(keys, {"strategies": strategies, "steps": steps})
        rows, fingerprint = _run_planned(session, run, planned, settings, force, costs, on_progress)
    finally:
        storage.close()
    report = build_report(probed, device, run.run_id, rows, fingerprint, coefficients, notes=notes)
    return report.model_copy(update={"calibration": calibration_block})


def _probed_job(spec: JobSpec, device: str, db: str | None, readings: list[str]) -> ResolvedJob:
    """The job as this machine probes it: the dtype the CPU backend runs (said in ``readings``), this machine's host
    memory, at most the ranks this node has; InputError for a dtype the CPU backend cannot run."""
    spec = cpu_probe_dtype(spec, device, readings.append)
    # a traced model's shape is cached in the probe's own database; the probes run here: this machine's host memory
    resolved = resolve(spec, db, local=True)
    check_ranks(resolved, device)
    if device == "cpu":
        from probes.measure.cpu_support import cpu_dtype_unsupported_reason  # lazy on purpose: probes loads torch

        reason = cpu_dtype_unsupported_reason(resolved.workload.dtype)
        if reason is not None:
            raise InputError(reason)  # one line for the run, not one failed engine per strategy
    return resolved


@dataclass(frozen=True)
class _Costs:
    """What the note of how long the probes take reads: the probed job, its coefficients, and whether a CPU probe's
    time is predicted (calibrated to this CPU)."""

    job: ResolvedJob
    coef: Coefficients
    timed: bool


def _run_planned(
    session: ProbeSession,
    run: Any,
    planned: list[PlannedProbe],
    settings: ProbeSettings,
    force: bool,
    costs: _Costs,
    on_progress: Callable[[str, int, int], None] | None,
) -> tuple[list[ProbeRow], dict[str, Any] | None]:
    """Inside the probe run ``run``: reuse what the store answers, build DeepSpeed's ops, say how long the rest
    takes, run the rest; the rows in planned order and the device's fingerprint. Marks the run interrupted on
    a failed build or Ctrl-C, done otherwise."""
    storage = session.storage
    stored, found = _stored(session, run, planned, force)
    to_run = [item for item in planned if stored[item.key] is None]
    try:  # DeepSpeed's ops, built before the first probe (OpBuildError is an InputError)
        session.prepare([item.request for item in to_run])
    except (InputError, KeyboardInterrupt):  # a failed build, Ctrl-C or SIGTERM while building
        storage.finish_run(run.run_id, status="interrupted")
        raise
    if session.on_note is not None:
        device, steps, timeout_s = settings.device, settings.steps, settings.timeout_s
        cost = planned_costs(costs.job, to_run, device=device, steps=steps, coef=costs.coef, timed=costs.timed)
        estimate = cost_note(cost, device=device, timed=costs.timed, less=PROBE_LESS)
        for line in [*_timeout_notes(planned, found, stored, timeout_s), *([estimate] if estimate else [])]:
            session.on_note(line)
    rows: list[ProbeRow] = []
    fingerprint: dict[str, Any] | None = None
    try:
        for index, item in enumerate(planned):
            known = stored[item.key]
            if known is not None:
                rows.append(ProbeRow.from_probe(item, known.probe_id, known.result, reused=True, cpu_timed=costs.timed))
                fingerprint = fingerprint or _fingerprint_of(known.result)
                continue
            if on_progress is not None:
                on_progress(item.label + depth_label(item.layers), index, len(planned))
            probe_id, result = session.run(item, run.run_id)
            rows.append(ProbeRow.from_probe(item, probe_id, result, reused=False, cpu_timed=costs.timed))
            fingerprint = fingerprint or _fingerprint_of(result)
    except KeyboardInterrupt:
        storage.finish_run(run.run_id, status="interrupted")
        raise
    storage.finish_run(run.run_id, status="done")
    return rows, fingerprint


def _stored(
    session: ProbeSession, run: Any, planned: list[PlannedProbe], force: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the stored probe each planned one reuses, or None; the stored probe found for each, reusable or not).

    Looked up once: nothing with ``force``, except what this (resumed) run measured itself; a timeout only when it
    had at least this --timeout (:func:`planner.probing.runs.reusable`)."""
    done_in_this_run = set(run.done_keys)  # a resumed run keeps what it measured, even with force
    found = {item.key: session.find(item) if (not force or item.key in done_in_this_run) else None for item in planned}
    stored: dict[str, Any] = dict.fromkeys(found)
    for item in planned:
        known = found[item.key]
        if known is not None and reusable(known, item.request):
            stored[item.key] = known
    return stored, found


PROBE_LESS = "--layers 1, --steps 2, a smaller --batch, --seq-len or model"


def _timeout_notes(
    planned: list[PlannedProbe], found: dict[str, Any], stored: dict[str, Any], timeout_s: float
) -> list[str]:
    """A line for stored timeouts run again (they had a shorter timeout than ``timeout_s``) and one for those
    shown as stored (they had at least ``timeout_s``)."""
    again = [found[p.key] for p in planned if found[p.key] is not None and stored[p.key] is None]
    kept = [stored[p.key] for p in planned if stored[p.key] is not None and stored[p.key].result.outcome == "timeout"]
    lines = []
    if again:
        longest = max(float(k.request.timeout_s) for k in again)
        lines.append(
            f"{_count(again)} timed out before under a shorter --timeout (up to {longest:g} s): "
            f"running {'them' if len(again) > 1 else 'it'} again with --timeout {timeout_s:g} s"
        )
    if kept:
        longest = max(float(k.request.timeout_s) for k in kept)
        lines.append(
            f"{_count(kept)} timed out before under --timeout {longest:g} s (this run gives {timeout_s:g} s) and "
            f"{'are' if len(kept) > 1 else 'is'} shown as stored: a --timeout above {longest:g} s runs "
            f"{'them' if len(kept) > 1 else 'it'} again"
        )
    return lines


def _count(items: list[Any]) -> str:
    return f"{len(items)} stored probe{'s' if len(items) > 1 else ''}"


def _calibrated(
    job: ResolvedJob, coef: Coefficients, device: str, choice: str, db: str | None
) -> tuple[ResolvedJob, Coefficients, dict[str, Any]]:
    """The job and coefficients with the calibration of the probed device: this CPU on the CPU backend, the
    catalog GPU torch sees on cuda (:mod:`planner.job.calibrated`)."""

    return calibrated(job, coef, choice=choice, db=db, target=device_target(device))


def _fingerprint_of(result: ProbeResult) -> dict[str, Any] | None:
    return result.fingerprint.to_dict() if result.fingerprint else None


def refuse_quantized_probe(chosen: list[Strategy | RLHFStrategy]) -> None:
    """A QLoRA strategy is probed with bitsandbytes' own layers (:mod:`probes.model.quantize`): without bitsandbytes
    installed it is refused with one line (InputError) rather than probed as a 16-bit LoRA."""
    import importlib.util

    for strategy in chosen:
        quantized = isinstance(strategy, Strategy) and strategy.quantization != "none"
        if quantized and importlib.util.find_spec("bitsandbytes") is None:
            raise InputError(
                f"cannot probe {strategy.describe()}: bitsandbytes is not installed (pip install "
                "bitsandbytes==0.50.2, or pip install -e '.[frameworks]'); probe quantization none instead"
            )

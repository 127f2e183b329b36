"""``planner.probe``: run strategies for a few real steps, store what happened, compare with the cost model.

Reads top to bottom: choose the strategies, decide the depths (layer cuts), build one ProbeRequest per
(strategy, depth), skip those the database already holds (unless ``force``), resume an interrupted run
of the same requests, run the rest one process each, then put measured beside predicted and, for cut
models, extrapolate per layer to the full depth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.files import read_json_file
from planner.inputs import JobSpec, ResolvedJob, resolve
from planner.probe_device import cpu_probe_dtype, device_coefficients, device_prediction
from planner.probe_limits import check_run
from planner.probing_report import build_report
from planner.results import ProbeReport, ProbeRow
from probes.fingerprint import versions as software_versions
from search import DEFAULT_COEFFICIENTS, Coefficients, Prediction, predict, search
from store.errors import InputError
from store.measurements import ProbeRequest, ProbeResult
from store.models import with_layers
from store.records import RLHFStrategy, Strategy, Workload

CPU_FULL_MODEL_LIMIT = 200_000_000  # parameters: larger models are only probed layer-cut on the CPU
DEFAULT_DEPTHS = (1, 2)


@dataclass(frozen=True)
class PlannedProbe:
    """One probe to run (or reuse) and what the cost model predicts for it."""

    strategy: Strategy | RLHFStrategy
    layers: int | None
    request: ProbeRequest
    key: str
    prediction: Prediction


def choose_strategies(job: ResolvedJob, which: str, coef: Coefficients, top: int = 3) -> list[Strategy | RLHFStrategy]:
    """``recommended`` (the plan and its next best), ``grid`` (a fixed spread of layouts) or a JSON file."""
    workload, hardware = job.workload, job.hardware
    if which == "recommended":
        # the probe runs DeepSpeed's own generation: it probes the plans that use it
        result = search(workload, hardware, coef, rollouts=("hybrid-engine",))
        chosen = list(result.feasible[: top + 1]) or list(result.ranked[:1])
        return [c.strategy for c in chosen]
    if which == "grid":
        return list(_grid(job))
    data = read_json_file(Path(which), "--strategies")
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(item, dict) for item in items):
        raise InputError(f"--strategies: {which} must hold a strategy object or a list of them")
    parse = RLHFStrategy.from_dict if workload.is_rlhf else Strategy.from_dict
    parsed = [parse(item) for item in items]
    for strategy in parsed:
        if isinstance(strategy, RLHFStrategy) and strategy.rollout is not None:
            raise InputError(
                f"--strategies: a {strategy.rollout.engine} rollout cannot be probed here: the probe generates with "
                "DeepSpeed (its hybrid engine or HF generate); the engine's memory rules are predicted, not probed"
            )
    return parsed


def _grid(job: ResolvedJob) -> Iterator[Strategy | RLHFStrategy]:
    from search.batches import micro_batches

    if job.workload.is_rlhf:
        from store.records import TrainedModelStrategy

        per_gpu = job.workload.global_batch // job.hardware.world_size
        sequences = per_gpu * job.workload.samples_per_prompt
        for stage in (2, 3):
            for ckpt in (False, True):
                block = TrainedModelStrategy(stage, gradient_checkpointing=ckpt)
                yield RLHFStrategy(
                    actor=block,
                    critic=block if job.workload.has_critic else None,
                    generation_batch=per_gpu,
                    micro_batch=sequences,
                    grad_accum=1,
                    empty_cache="never",
                )
        return
    micro = micro_batches(job.workload, job.hardware)[-1]
    accum = job.workload.global_batch // job.hardware.world_size // micro
    for stage in (0, 1, 2, 3):
        for ckpt in (False, True):
            yield Strategy(zero_stage=stage, gradient_checkpointing=ckpt, micro_batch=micro, grad_accum=accum)
    yield Strategy(zero_stage=2, offload_optimizer="cpu", micro_batch=micro, grad_accum=accum)


def parse_layers(text: str | None, model_layers: int) -> tuple[int, ...] | None:
    """``auto`` -> None; ``K`` or ``K1,K2`` -> the depths (increasing whole numbers from 1 to the model's
    decoder layers)."""
    if text is None or text == "auto":
        return None
    shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
    try:
        depths = tuple(int(part) for part in str(text).split(",")) if len(str(text)) <= 200 else ()
    except ValueError:
        raise InputError(f"--layers must be auto, K or K1,K2, not {shown!r}") from None
    if not depths or any(d < 1 for d in depths) or list(depths) != sorted(set(depths)):
        raise InputError(f"--layers must be increasing whole numbers >= 1, not {shown!r}")
    if depths[-1] > model_layers:
        raise InputError(f"--layers {shown}: the model has {model_layers} decoder layers; cut it to at most that")
    return depths


def cut_workload(workload: Workload, layers: int | None) -> Workload:
    """The workload with every model cut to ``layers`` decoder layers (None: as is)."""
    if layers is None:
        return workload
    cut: dict[str, Any] = {"model": with_layers(workload.model, min(layers, workload.model.num_layers))}
    for role in ("ref_model", "critic_model", "reward_model"):
        spec = getattr(workload, role)
        if spec is not None:
            cut[role] = with_layers(spec, min(layers, spec.num_layers))
    return replace(workload, **cut)


def depths_for(job: ResolvedJob, device: str, asked: tuple[int, ...] | None, fits_full: bool) -> list[int | None]:
    """Depths to probe: the asked ones, plus the full model wherever it also fits (to show the error)."""
    small = job.workload.model.total_params <= CPU_FULL_MODEL_LIMIT
    full_possible = fits_full and (device == "cuda" or small)
    if asked is None:
        return [None] if full_possible else list(DEFAULT_DEPTHS)
    depths: list[int | None] = [d for d in asked if d < job.workload.model.num_layers]
    if len(depths) < len(asked) or full_possible:
        depths.append(None)
    return depths


def plan_probes(
    job: ResolvedJob,
    strategies: list[Strategy | RLHFStrategy],
    *,
    device: str,
    steps: int,
    layers: tuple[int, ...] | None,
    timeout_s: float,
    memory_cap_bytes: int | None,
    coef: Coefficients,
) -> list[PlannedProbe]:
    """One PlannedProbe per strategy and depth, each with its prediction and canonical key."""
    versions = software_versions()
    probe_coef = device_coefficients(device, coef)
    planned: list[PlannedProbe] = []
    for strategy in strategies:
        full = predict(job.workload, strategy, job.hardware, probe_coef)
        for depth in depths_for(job, device, layers, full.fits):
            workload = cut_workload(job.workload, depth)
            prediction = full if depth is None else predict(workload, strategy, job.hardware, probe_coef)
            prediction = device_prediction(prediction, device)
            request = ProbeRequest(
                workload=workload_payload(workload),
                strategy=strategy.to_dict(),
                hardware=job.hardware.to_dict(),
                device=device,
                steps=steps,
                layers=depth,
                timeout_s=timeout_s,
                memory_cap_bytes=memory_cap_bytes,
            )
            planned.append(PlannedProbe(strategy, depth, request, request.key(versions), prediction))
    return planned


def workload_payload(workload: Workload) -> dict[str, Any]:
    """The workload as a probe child rebuilds it: the JSON shape plus every model's HF config."""
    payload = workload.to_dict()
    payload["hf_configs"] = {"model": workload.model.hf_config}
    for role in ("ref_model", "critic_model", "reward_model"):
        spec = getattr(workload, role)
        if spec is not None:
            payload["hf_configs"][role] = spec.hf_config
    return payload


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
    from store.db import open_storage
    from store.sizes import parse_size

    device, steps, timeout_s = check_run(device, steps, timeout_s)
    spec = model if isinstance(model, JobSpec) else JobSpec(model=model, **job)
    readings: list[str] = []  # said once the whole input is checked: a refused probe prints one line
    spec = cpu_probe_dtype(spec, device, readings.append)
    resolved = resolve(spec, db)  # a traced model's shape is cached in the probe's own database
    check_ranks(resolved, device)
    if device == "cpu":
        from probes.cpu_support import cpu_dtype_unsupported_reason

        reason = cpu_dtype_unsupported_reason(resolved.workload.dtype)
        if reason is not None:
            raise InputError(reason)  # one line for the run, not one failed engine per strategy
    resolved, coefficients, calibration_block = _calibrated(resolved, coefficients, device, calibration, db)
    cpu_timed = device == "cpu" and calibration_block.get("id") is not None
    cap = parse_size(memory_cap, "--memory-cap") if memory_cap is not None else None
    depths = parse_layers(layers, resolved.workload.model.num_layers)
    chosen = choose_strategies(resolved, strategies, coefficients)
    probed, notes = one_node(resolved)
    planned = plan_probes(
        probed,
        chosen,
        device=device,
        steps=steps,
        layers=depths,
        timeout_s=float(timeout_s),
        memory_cap_bytes=cap,
        coef=coefficients,
    )
    if on_note is not None:
        for line in readings:
            on_note(line)
    own_runner = runner is None
    if runner is None:
        from probes import run_probe

        runner = run_probe
    storage = open_storage(db)
    rows: list[ProbeRow] = []
    fingerprint: dict[str, Any] | None = None
    try:
        keys = [p.key for p in planned]
        run = storage.unfinished_run(keys) or storage.start_run(keys, {"strategies": strategies, "steps": steps})
        done_in_this_run = set(run.done_keys)  # a resumed run keeps what it measured, even with force
        # what each probe reuses from the store (looked up once): nothing with force, except this run's own
        stored = {
            item.key: storage.find_probe(item.key) if (not force or item.key in done_in_this_run) else None
            for item in planned
        }
        if own_runner:  # only the real runner loads DeepSpeed's ops: build them all before the first probe
            from probes import OpBuildError, prepare_ops

            try:
                prepare_ops([item.request for item in planned if stored[item.key] is None], on_note=on_note)
            except (OpBuildError, KeyboardInterrupt):  # a failed build, Ctrl-C or SIGTERM while building
                storage.finish_run(run.run_id, status="interrupted")
                raise
        try:
            for index, item in enumerate(planned):
                known = stored[item.key]
                if known is not None:
                    rows.append(
                        ProbeRow.from_probe(item, known.probe_id, known.result, reused=True, cpu_timed=cpu_timed)
                    )
                    fingerprint = fingerprint or _fingerprint_of(known.result)
                    continue
                if on_progress is not None:
                    on_progress(item.strategy.describe() + _depth_label(item.layers), index, len(planned))
                result = runner(item.request)
                record = storage.save_probe(item.request, result, key=item.key, run_id=run.run_id)
                rows.append(ProbeRow.from_probe(item, record.probe_id, result, reused=False, cpu_timed=cpu_timed))
                fingerprint = fingerprint or _fingerprint_of(result)
        except KeyboardInterrupt:
            storage.finish_run(run.run_id, status="interrupted")
            raise
        storage.finish_run(run.run_id, status="done")
    finally:
        storage.close()
    report = build_report(probed, device, run.run_id, rows, fingerprint, coefficients, notes=notes)
    return report.model_copy(update={"calibration": calibration_block})


def _calibrated(
    job: ResolvedJob, coef: Coefficients, device: str, choice: str, db: str | None
) -> tuple[ResolvedJob, Coefficients, dict[str, Any]]:
    """The job and coefficients with the calibration of the probed device: this CPU on the CPU backend, the
    catalog GPU torch sees on cuda (:mod:`planner.calibration_use`)."""
    from planner.calibration_data import device_target
    from planner.calibration_use import calibrated

    return calibrated(job, coef, choice=choice, db=db, target=device_target(device))


def check_ranks(job: ResolvedJob, device: str) -> None:
    """A probe runs ``--gpus`` ranks on this node: at most the devices present (CUDA: those torch sees; the
    CPU backend: ``probes.build.MAX_CPU_RANKS``). One GPU is always allowed (as before ranks)."""
    gpus = job.hardware.gpus
    if gpus == 1:
        return
    from probes.build import MAX_CPU_RANKS, max_ranks

    present = max_ranks(device)
    if gpus > present:
        where = (
            f"the CPU backend runs at most {MAX_CPU_RANKS} ranks"
            if device == "cpu"
            else f"this machine has {present} CUDA device{'s' if present != 1 else ''}"
        )
        raise InputError(f"--gpus {gpus}: a probe runs one rank per GPU on this node, and {where}")


def one_node(job: ResolvedJob) -> tuple[ResolvedJob, list[str]]:
    """The job a probe runs: a plan for K > 1 nodes is probed as one of its nodes (``gpus`` ranks, the global
    batch divided by K, ZeRO partitioned over one node's ranks), with a note saying so."""
    hardware = job.hardware
    if hardware.nodes == 1:
        return job, []
    nodes, world = hardware.nodes, hardware.world_size
    batch = job.workload.global_batch // nodes
    note = (
        f"a plan for {nodes} nodes x {hardware.gpus} GPUs (world size {world}) is probed on one node: "
        f"{hardware.gpus} ranks, global batch {batch} of {job.workload.global_batch}, and predictions for a "
        f"world size of {hardware.gpus} (ZeRO partitions over one node's ranks)"
    )
    if job.workload.global_batch % nodes:
        raise InputError(f"--batch {job.workload.global_batch} does not split over {nodes} nodes")
    probed = replace(job, workload=replace(job.workload, global_batch=batch), hardware=replace(hardware, nodes=1))
    return probed, [note]


def _fingerprint_of(result: ProbeResult) -> dict[str, Any] | None:
    return result.fingerprint.to_dict() if result.fingerprint else None


def _depth_label(layers: int | None) -> str:
    return "" if layers is None else f" [{layers} layer{'s' if layers > 1 else ''}]"

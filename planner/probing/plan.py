"""What a probe runs: the strategies (the recommended ones, a grid, or a file), the depths (layer cuts), and
one ``ProbeRequest`` per (strategy, depth) with its prediction; a multi-node plan probed as one node."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.files.atomic import read_json_file
from planner.job.cut import cut_workload
from planner.job.inputs import ResolvedJob
from planner.probing.device import device_coefficients, device_prediction
from planner.probing.settings import ProbeSettings
from probes.measure.fingerprint import versions as software_versions
from search import Coefficients, Prediction, micro_batches, predict, search
from store.errors import InputError
from store.measurements import ProbeRequest
from store.records import RLHFStrategy, Strategy, TrainedModelStrategy, Workload, strategy_label

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
    label: str = ""  # the strategy's label with the job's roles (store.records.strategy_label)


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
    if job.workload.is_rlhf:
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
    settings: ProbeSettings,
    *,
    layers: tuple[int, ...] | None,
    coef: Coefficients,
) -> list[PlannedProbe]:
    """One PlannedProbe per strategy and depth (``layers``; None: the whole model), each with its prediction
    and canonical key, run as ``settings`` say."""
    device = settings.device
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
                steps=settings.steps,
                layers=depth,
                timeout_s=settings.timeout_s,
                memory_cap_bytes=settings.memory_cap_bytes,
            )
            label = strategy_label(strategy, job.workload)
            planned.append(PlannedProbe(strategy, depth, request, request.key(versions), prediction, label))
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


def check_ranks(job: ResolvedJob, device: str) -> None:
    """A probe runs ``--gpus`` ranks on this node: at most the devices present (CUDA: those torch sees; the
    CPU backend: ``probes.model.build.MAX_CPU_RANKS``). One GPU is always allowed (as before ranks)."""
    gpus = job.hardware.gpus
    if gpus == 1:
        return
    from probes.model.build import MAX_CPU_RANKS, max_ranks  # lazy on purpose: probes loads torch

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


def depth_label(layers: int | None) -> str:
    return "" if layers is None else f" [{layers} layer{'s' if layers > 1 else ''}]"

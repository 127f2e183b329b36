"""Observations for a calibration: stored probes (and records files) turned into the jobs they ran and the
quantities they measured, grouped by the device they ran on.

A probe's device is its *target*: the catalog GPU its fingerprint names (``H100-80G``), ``cuda:<name>`` for
a GPU the catalog does not know, or ``cpu:<model>`` for DeepSpeed's CPU accelerator. Calibrated values are
fractions of the target's catalog rates; a CPU target runs the GPU time model on the generic rates
(``store.gpus.GENERIC_RATES``), so its values mean the same whatever ``--gpu`` a CPU probe planned for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launch.ds_config_read import dtype_of_ds_config, strategy_from_ds_config
from planner.calibration.records import host_gib, load_records, probe_timing_is_steady
from planner.job.cut import cut_workload
from planner.job.inputs import JobSpec, ResolvedJob, job_fields, resolve
from planner.job.target import target_hardware, target_of
from search.calibration import Observation
from store.db import database_exists, open_storage
from store.errors import InputError
from store.records import RLHFStrategy, Strategy


@dataclass(frozen=True)
class Gathered:
    """Observations of one target, and what could not be used (one line each)."""

    target: str
    device: str
    fingerprint: dict[str, Any]
    observations: list[Observation]
    skipped: list[str]


MAX_STORED_PROBES = 100_000  # stored probes a calibration reads


def stored_entries(db: str | None, device: str | None = None) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(probe id, request, result) of every probe stored in ``db`` (of one ``device`` kind when given), the
    triples :func:`gather` takes; none where the database does not exist (it is not created to be read)."""

    if not database_exists(db):
        return []
    with open_storage(db) as storage:
        stored = storage.list_probes(limit=MAX_STORED_PROBES, device=device)
    return [(p.probe_id, p.request.to_dict(), p.result.to_dict()) for p in stored]


def _resolved(model: str, fields: dict[str, Any], db: str | None) -> ResolvedJob:
    return resolve(JobSpec(model=model, **fields), db)


def probe_observation(
    label: str, request: dict[str, Any], result: dict[str, Any], target: str, db: str | None = None
) -> Observation:
    """A finished probe (its request and result as JSON) as an observation of ``target``; InputError when its
    job cannot be rebuilt. A traced model's shape is cached in ``db`` (the calibration's database)."""

    fields = job_fields(request["workload"], request["hardware"])
    if not target.startswith(("cpu:", "cuda:")):
        fields["gpu"] = target
    job = _resolved(str(request["workload"]["model"]), fields, db)
    workload = cut_workload(job.workload, request.get("layers"))
    parse = RLHFStrategy.from_dict if workload.is_rlhf else Strategy.from_dict
    strategy = parse(dict(request["strategy"]))
    device = str(request.get("device", "cuda"))
    steady = probe_timing_is_steady(request, result)[0]  # ZeRO-3 times only after two warm-up steps
    measured: list[tuple[str, str, float]] = []
    for phase in result.get("phases", []):
        if steady:
            measured.append((phase["name"], "time", float(phase["time_s"])))
        measured.append((phase["name"], "peak_allocated", float(phase["peak_allocated_bytes"])))
        if device == "cuda":
            measured.append((phase["name"], "peak_reserved", float(phase["peak_reserved_bytes"])))
    hardware = target_hardware(job.hardware, target)
    return Observation(label, workload, strategy, hardware, device, tuple(measured))


def gather(
    records: list[tuple[str, dict[str, Any], dict[str, Any]]],
    wanted: str | None,
    detected: str | None = None,
    db: str | None = None,
) -> Gathered:
    """The observations of one target from (label, request, result) triples.

    ``wanted`` picks the target: its exact name, its device kind (``cpu``, ``cuda``), or a word of the
    fingerprint's device name (case-insensitive).
    None: the only target there is, else ``detected`` (this machine's device) when it is among them; several
    others are an InputError naming them. Traced model shapes are cached in ``db``.
    """
    by_target: dict[str, list[tuple[str, dict[str, Any], dict[str, Any]]]] = {}
    fingerprints: dict[str, dict[str, Any]] = {}
    for label, request, result in records:
        if result.get("outcome") != "ok" or not result.get("fingerprint"):
            continue
        target, _ = target_of(result["fingerprint"])
        by_target.setdefault(target, []).append((label, request, result))
        fingerprints.setdefault(target, result["fingerprint"])
    if not by_target:
        raise InputError("no finished probe to calibrate from: run `planner probe` on the device first")
    counts = ", ".join(f"{t} ({len(v)} probes)" for t, v in sorted(by_target.items()))
    if wanted is None and detected in by_target:
        target = str(detected)
    elif wanted is None:
        if len(by_target) > 1:
            raise InputError(f"probes of several devices are stored: pick one with --device-fingerprint: {counts}")
        target = next(iter(by_target))
    else:
        key = wanted.strip().lower()
        matches = [
            t
            for t in by_target
            if key in (t.lower(), str(fingerprints[t].get("device", "")))
            or key in str(fingerprints[t].get("name", "")).lower().split()
        ]
        if len(matches) != 1:
            why = "matches no stored probe's device" if not matches else "matches several devices"
            raise InputError(f"--device-fingerprint {wanted!r} {why}; stored: {counts}")
        target = matches[0]
    observations: list[Observation] = []
    skipped: list[str] = []
    for label, request, result in by_target[target]:
        try:
            observations.append(probe_observation(label, request, result, target, db))
        except (InputError, KeyError, TypeError, ValueError) as exc:
            skipped.append(f"{label}: cannot rebuild its job ({exc})")
    _, device = target_of(fingerprints[target])
    return Gathered(target, device, fingerprints[target], observations, skipped)


def loop_row_observation(row: dict[str, Any], target: str, db: str | None = None) -> Observation:
    """A user-style training loop's row of a records file (``tests/data/gpu``: its exact ds_config and
    whole-step peaks and median step time) as an observation of ``target`` (scope ``step``); traced model
    shapes are cached in ``db``."""

    workload, measured = row["workload"], row["measured"]
    outside = {
        "gradient_checkpointing": bool(row.get("gradient_checkpointing", False)),
        "lora_rank": int((row.get("lora") or {}).get("rank", 0)),
        "empty_cache": row.get("empty_cache", "never"),
        "allocator": row.get("allocator", "default"),
    }
    strategy, batch = strategy_from_ds_config(row["ds_config"], 1, **outside)
    fields: dict[str, Any] = {
        "workload": workload["kind"],
        "seq_len": workload["seq_len"],
        "attn_impl": workload.get("attn_impl", "sdpa"),
        "dtype": dtype_of_ds_config(row["ds_config"]),
        "batch": batch,
        "cpu_mem": host_gib(row.get("device", {})),
    }
    if not target.startswith(("cpu:", "cuda:")):
        fields["gpu"] = target
    else:
        fields["gpu_mem"] = int(row.get("device", {}).get("total_memory_bytes", 0)) or "80G"
    job = _resolved(str(workload["model"]), fields, db)
    values = (
        ("step", "time", float(measured["step_time_s_median"])),
        ("step", "peak_allocated", float(measured["peak_allocated_bytes"])),
        ("step", "peak_reserved", float(measured["peak_reserved_bytes"])),
    )
    return Observation(str(row["id"]), job.workload, strategy, target_hardware(job.hardware, target), "cuda", values)


def records_file_entries(path: str) -> tuple[list[tuple[str, dict[str, Any], dict[str, Any]]], list[dict[str, Any]]]:
    """(probe triples, loop rows) of a records file (``planner.calibration.records.load_records``)."""

    data = load_records(path)
    probes = [(str(p["probe_id"]), p["request"], p["result"]) for p in data.get("probes", [])]
    return probes, list(data.get("sft", []))

"""Predicted against measured for stored GPU measurement records (``tests/data/gpu/*.json``).

A records file holds one device's measurements: ``sft`` rows of a user-style training loop (whole-step peaks
and the median step time) and ``probes`` as ``planner probes --json`` prints them (per phase). Each record is
predicted through the public API with its own configuration (``check`` with the row's exact ds_config;
``predict`` with the probe's strategy) on the catalog GPU its fingerprint names, and every measured
quantity gets its relative error ``predicted / measured - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.files.atomic import read_json_file
from planner.job.inputs import job_fields
from planner.planning.predicting import check, predict
from planner.report.results import SpreadBasis
from store.errors import InputError
from store.gpus import gpu_for_device


@dataclass(frozen=True)
class Compared:
    """One measured quantity beside its prediction."""

    measured: float
    predicted: float

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class RecordComparison:
    """A record's quantities (``step`` for the whole step, or a phase name) compared with the prediction."""

    record_id: str
    kind: str  # "sft" (user-style loop row) or "probe"
    workload: str
    quantities: dict[str, dict[str, Compared]]  # scope ("step" or a phase) -> quantity -> comparison
    time_comparable: bool = True  # False where the record's timing is known not to be steady
    why_not_timed: str = ""
    dominant_time_term: str = ""
    # the search's screen (fragment coefficients) against the step's measured peak reserved (None: not given)
    screen_peak_reserved: Compared | None = None
    model: str = ""
    gpu: str = ""  # the catalog GPU the record was predicted on
    reserved_spread: float = 0.0  # the spread of peak reserved its plan keeps (Prediction.reserved_uncertainty)
    spread_basis: dict[str, Any] | None = None  # what that spread rests on (Prediction.reserved_spread_basis)


def load_records(path: str | Path) -> dict[str, Any]:
    """A records file (``about``, ``sft``, ``probes``); InputError (one line) for a file that is missing, not
    JSON, nested beyond reason, or not of that shape: ``sft`` a list of objects, ``probes`` a list of objects
    each with a ``probe_id`` and the ``request`` and ``result`` objects."""

    data = read_json_file(path, "--records")
    if not isinstance(data, dict) or not {"sft", "probes"} & set(data):
        raise InputError(f"{path}: not a records file (expected 'sft' and/or 'probes')")
    for section in ("sft", "probes"):
        rows = data.get(section, [])
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise InputError(f"{path}: not a records file ({section!r} must be a list of objects)")
    for index, probe in enumerate(data.get("probes", [])):
        if not isinstance(probe.get("probe_id"), (str, int)) or isinstance(probe.get("probe_id"), bool):
            raise InputError(f"{path}: probes[{index}] has no probe_id")
        for part in ("request", "result"):
            if not isinstance(probe.get(part), dict):
                raise InputError(f"{path}: probes[{index}] has no {part} object")
    return data


def _catalog_gpu(device: dict[str, Any]) -> str:
    """The catalog name of the GPU a record's device (or fingerprint) names."""
    gpu = gpu_for_device(str(device.get("name", "")), int(device.get("total_memory_bytes", 0)))
    if gpu is None:
        raise InputError(f"no catalog GPU for device {device.get('name')!r}")
    return gpu.name


def host_gib(device: dict[str, Any]) -> str:
    """The host memory a record names (``"16 cores, 128 GiB"``), as a --cpu-mem value; 128G when absent."""
    for part in str(device.get("host", "")).split(","):
        words = part.split()
        if len(words) == 2 and words[1] in ("GiB", "GB"):
            return f"{words[0]}G"
    return "128G"


def compare_sft_row(row: dict[str, Any]) -> RecordComparison:
    """A user-style loop row: ``planner.check`` of its exact ds_config on the GPU its device names."""

    workload, measured, device = row["workload"], row["measured"], row["device"]
    gpu = _catalog_gpu(device)
    lora = (row.get("lora") or {}).get("rank", 0)
    result = check(
        row["ds_config"],
        workload["model"],
        gpu=gpu,
        workload=workload["kind"],
        seq_len=workload["seq_len"],
        attn_impl=workload["attn_impl"],
        gradient_checkpointing=bool(row["gradient_checkpointing"]),
        lora_rank=lora,
        empty_cache=row.get("empty_cache", "never"),
        allocator=row.get("allocator", "default"),
        cpu_mem=host_gib(device),
    )
    predicted = result.report.predicted
    step = {
        "peak_allocated": Compared(measured["peak_allocated_bytes"], predicted.peak_allocated_bytes),
        "peak_reserved": Compared(measured["peak_reserved_bytes"], predicted.peak_reserved_bytes),
        "time": Compared(measured["step_time_s_median"], predicted.step_time_s),
    }
    replay = result.report.allocator_replay
    if replay is not None:
        step["replay_peak_reserved"] = Compared(measured["peak_reserved_bytes"], replay["peak_reserved_bytes"])
        if measured.get("after_init_reserved_bytes"):
            init = Compared(measured["after_init_reserved_bytes"], replay["after_init_reserved_bytes"])
            step["replay_after_init_reserved"] = init
    return RecordComparison(
        record_id=row["id"],
        kind="sft",
        workload=workload["kind"],
        quantities={"step": step},
        dominant_time_term=predicted.dominant_time_term,
        screen_peak_reserved=_screen(measured["peak_reserved_bytes"], predicted.screen_reserved_bytes),
        model=workload["model"],
        gpu=gpu,
        reserved_spread=predicted.reserved_uncertainty,
        spread_basis=_basis(predicted.reserved_spread_basis),
    )


def _probe_job(request: dict[str, Any], gpu: str) -> dict[str, Any]:
    """The probe request's job on the catalog GPU its fingerprint names."""

    return {**job_fields(request["workload"], request["hardware"]), "gpu": gpu}


def probe_timing_is_steady(request: dict[str, Any], result: dict[str, Any]) -> tuple[bool, str]:
    """Whether a probe's phase times are steady-state: ZeRO-3 needs two warm-up steps (its fetch trace)."""
    strategy = request["strategy"]
    stages = [strategy.get("zero_stage", 0)] + [
        block.get("zero_stage", 0) for block in strategy.values() if isinstance(block, dict)
    ]
    warmup = int(result.get("extra", {}).get("warmup_steps", 1))
    if 3 in stages and warmup < 2:
        return False, f"ZeRO-3 timed after {warmup} warm-up step (its fetch trace was not complete)"
    return True, ""


def compare_probe(record: dict[str, Any]) -> RecordComparison | None:
    """A ``planner probe --device cuda`` record: ``planner.predict`` of its strategy, phase by phase.

    None for a probe that did not finish (``outcome`` other than ok): it measured no peak.
    """

    request, result = record["request"], record["result"]
    if result.get("outcome") != "ok":
        return None
    gpu = _catalog_gpu(result["fingerprint"])
    report = predict(request["workload"]["model"], request["strategy"], **_probe_job(request, gpu))
    predicted = report.predicted
    by_name = {phase.name: phase for phase in predicted.phases}
    replayed = {p["name"]: p for p in (report.allocator_replay or {}).get("phases", [])}
    scopes: dict[str, dict[str, Compared]] = {}
    for phase in result["phases"]:
        mine = by_name.get(phase["name"])
        if mine is None:
            continue
        scopes[phase["name"]] = {
            "peak_allocated": Compared(phase["peak_allocated_bytes"], mine.peak_allocated_bytes),
            "peak_reserved": Compared(phase["peak_reserved_bytes"], mine.peak_reserved_bytes),
            "time": Compared(phase["time_s"], mine.time_s * mine.count),
        }
        if phase["name"] in replayed:
            replay = replayed[phase["name"]]["peak_reserved_bytes"]
            scopes[phase["name"]]["replay_peak_reserved"] = Compared(phase["peak_reserved_bytes"], replay)
    steady, why = probe_timing_is_steady(request, result)
    return RecordComparison(
        record_id=record["probe_id"],
        kind="probe",
        workload=request["workload"]["kind"],
        quantities=scopes,
        time_comparable=steady,
        why_not_timed=why,
        dominant_time_term=predicted.dominant_time_term,
        screen_peak_reserved=_screen(
            max(phase["peak_reserved_bytes"] for phase in result["phases"]), predicted.screen_reserved_bytes
        ),
        model=request["workload"]["model"],
        gpu=gpu,
        reserved_spread=predicted.reserved_uncertainty,
        spread_basis=_basis(predicted.reserved_spread_basis),
    )


def _basis(basis: SpreadBasis | None) -> dict[str, Any] | None:
    return basis.model_dump() if basis is not None else None


def _screen(measured: float, screened: int) -> Compared | None:
    return Compared(measured, screened) if screened else None


def compare_records(path: str | Path) -> list[RecordComparison]:
    """Every finished record of a records file, compared with its prediction."""
    data = load_records(path)
    out = [compare_sft_row(row) for row in data.get("sft", [])]
    for record in data.get("probes", []):
        compared = compare_probe(record)
        if compared is not None:
            out.append(compared)
    return out

"""Probe rows and probe-run rows, to and from frozen records; the checks a save makes before writing."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

from store.db._orm import ProbeRow, ProbeRunRow
from store.db._record import (
    KEY_MAX_LENGTH,
    PROBE_ID_LENGTH,
    RUN_ID_LENGTH,
    ProbeRecord,
    ProbeRunRecord,
    json_copy,
    new_short_id,
)
from store.measurements import STORED_OUTCOMES, ProbeRequest, ProbeResult


def check_key(key: object, what: str = "key") -> str:
    """``key`` when it is a non-empty str of at most ``KEY_MAX_LENGTH`` characters; else TypeError."""
    if not isinstance(key, str) or not key or len(key) > KEY_MAX_LENGTH:
        raise TypeError(f"probe {what} must be a non-empty str of at most {KEY_MAX_LENGTH} characters, got {key!r}")
    return key


def check_keys(request_keys: object) -> list[str]:
    """A fresh list of the keys, checked one by one; TypeError for anything but a list or tuple of keys."""
    if not isinstance(request_keys, list | tuple):
        raise TypeError(f"probe run request_keys must be a list of str, got {type(request_keys).__name__}")
    return [check_key(key, "run request key") for key in request_keys]


def new_probe_row(request: ProbeRequest, result: ProbeResult, key: str, run_id: str | None) -> ProbeRow:
    """The row that stores ``result`` of ``request`` under ``key``; raises before anything is written."""
    if not isinstance(request, ProbeRequest):
        raise TypeError(f"probe request must be a ProbeRequest, got {type(request).__name__}")
    if not isinstance(result, ProbeResult):
        raise TypeError(f"probe result must be a ProbeResult, got {type(result).__name__}")
    check_key(key)
    if run_id is not None and not isinstance(run_id, str):
        raise TypeError(f"probe run_id must be a str or None, got {run_id!r}")
    if result.outcome not in STORED_OUTCOMES:
        raise ValueError(f"probe outcome must be one of {', '.join(STORED_OUTCOMES)}, got {result.outcome!r}")
    workload = request.workload if isinstance(request.workload, dict) else {}
    for name in ("kind", "model"):
        value = workload.get(name)
        if not isinstance(value, str) or not value:
            raise TypeError(f"probe request workload must name a non-empty str {name!r}, got {value!r}")
    if not isinstance(request.device, str) or not request.device:
        raise TypeError(f"probe request device must be a non-empty str, got {request.device!r}")
    stored_request = json_copy("request", request.to_dict(), what="probe")
    stored_result = json_copy("result", result.to_dict(), what="probe")
    return ProbeRow(
        probe_id=new_short_id(PROBE_ID_LENGTH),
        key=key,
        run_id=run_id,
        created_at=datetime.now(timezone.utc),
        kind=workload["kind"],
        model=workload["model"],
        device=request.device,
        outcome=result.outcome,
        failed_phase=result.failed_phase,
        message=result.message,
        request=stored_request,
        result=stored_result,
        fingerprint=copy.deepcopy(stored_result["fingerprint"]),
        peak_allocated_bytes=int(result.peak_allocated_bytes),
        peak_reserved_bytes=int(result.peak_reserved_bytes),
        step_time_s=float(result.step_time_s),
        wall_s=float(result.wall_s),
    )


def probe_record(row: ProbeRow) -> ProbeRecord:
    """A frozen record whose request and result are rebuilt from deep copies of the row's JSON."""
    return ProbeRecord(
        probe_id=row.probe_id,
        key=row.key,
        run_id=row.run_id,
        created_at=row.created_at,
        kind=row.kind,
        model=row.model,
        device=row.device,
        outcome=row.outcome,
        request=ProbeRequest.from_dict(copy.deepcopy(row.request)),
        result=ProbeResult.from_dict(copy.deepcopy(row.result)),
    )


def new_run_row(request_keys: object, options: dict[str, Any]) -> ProbeRunRow:
    """The row of a new probe run, status ``"running"``; raises before anything is written."""
    keys = check_keys(request_keys)
    return ProbeRunRow(
        run_id=new_short_id(RUN_ID_LENGTH),
        created_at=datetime.now(timezone.utc),
        status="running",
        total=len(keys),
        request_keys=keys,
        options=json_copy("options", options, what="probe run"),
    )


def run_record(row: ProbeRunRow, stored_keys: list[str]) -> ProbeRunRecord:
    """A frozen record of the run; ``stored_keys`` are the keys of its probes in the order stored."""
    return ProbeRunRecord(
        run_id=row.run_id,
        created_at=row.created_at,
        status=row.status,
        total=row.total,
        request_keys=tuple(row.request_keys),
        options=copy.deepcopy(row.options),
        done_keys=tuple(dict.fromkeys(stored_keys)),
    )

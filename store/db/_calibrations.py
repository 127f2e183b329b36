"""Calibration rows to and from frozen records; the checks a save makes before writing."""

from __future__ import annotations

import copy
import math
from datetime import datetime, timezone
from typing import Any

from store.db._orm import CalibrationRow
from store.db._record import CALIBRATION_ID_LENGTH, CalibrationRecord, json_copy, new_short_id

TARGET_MAX_LENGTH = 200


def new_calibration_row(
    *,
    target: str,
    device: str,
    version: int,
    fingerprint: dict[str, Any],
    values: dict[str, float],
    probe_ids: list[str],
    report: dict[str, Any],
) -> CalibrationRow:
    """A checked row for a new calibration; TypeError (naming the field) for anything malformed."""
    if not isinstance(target, str) or not 0 < len(target) <= TARGET_MAX_LENGTH:
        raise TypeError(f"calibration target must be a str of 1 to {TARGET_MAX_LENGTH} characters, got {target!r}")
    if device not in ("cuda", "cpu"):
        raise TypeError(f"calibration device must be 'cuda' or 'cpu', got {device!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TypeError(f"calibration version must be a whole number >= 1, got {version!r}")
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in values.items()
    ):
        raise TypeError("calibration values must map names to finite numbers")
    if not isinstance(probe_ids, (list, tuple)) or not all(isinstance(p, str) and p for p in probe_ids):
        raise TypeError("calibration probe_ids must be a list of probe ids")
    return CalibrationRow(
        calibration_id=new_short_id(CALIBRATION_ID_LENGTH),
        created_at=datetime.now(timezone.utc),
        target=target,
        device=device,
        version=version,
        fingerprint=json_copy("fingerprint", fingerprint, "calibration"),
        values={k: float(v) for k, v in values.items()},
        probe_ids=list(probe_ids),
        report=json_copy("report", report, "calibration"),
    )


def calibration_record(row: CalibrationRow) -> CalibrationRecord:
    """A frozen record holding deep copies of the row's values."""
    return CalibrationRecord(
        calibration_id=row.calibration_id,
        created_at=row.created_at,
        target=row.target,
        device=row.device,
        version=row.version,
        fingerprint=copy.deepcopy(row.fingerprint),
        values={k: float(v) for k, v in row.values.items()},
        probe_ids=tuple(row.probe_ids),
        report=copy.deepcopy(row.report),
    )

"""The frozen value objects that every storage backend returns: saved plans, probes and probe runs."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from store.measurements import ProbeRequest, ProbeResult

PLAN_ID_LENGTH = 12
MIN_PREFIX_LENGTH = 4


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """One saved plan, as it was saved: plain data, never a view of database state.

    ``plan_id`` is ``PLAN_ID_LENGTH`` lowercase hex characters; ``created_at`` is tz-aware UTC. The
    dictionaries are freshly decoded JSON: changing them changes nothing stored. ``ds_config`` is one
    DeepSpeed config for single-model workloads and a dict of configs per model for RLHF. ``document``
    is the full JSON document that the CLI prints, with ``"plan_id"`` filled in.
    """

    plan_id: str
    created_at: datetime
    kind: str
    model: str
    fits: bool
    workload: dict[str, Any]
    hardware: dict[str, Any]
    strategy: dict[str, Any]
    predicted: dict[str, Any]
    ds_config: dict[str, Any]
    document: dict[str, Any]


def new_plan_id() -> str:
    """A fresh plan id: the first ``PLAN_ID_LENGTH`` hex characters of a random uuid4."""
    return uuid.uuid4().hex[:PLAN_ID_LENGTH]


def json_copy(name: str, value: dict[str, Any], what: str = "plan") -> dict[str, Any]:
    """A deep copy of ``value`` as JSON would give it back (tuples become lists, keys strings).

    Raises TypeError naming the field (``"<what> field 'name'"``) when ``value`` is not a dict or holds
    something JSON cannot encode; this is a programming error, not bad user input.
    """
    if not isinstance(value, dict):
        raise TypeError(f"{what} field {name!r} must be a dict, got {type(value).__name__}")
    try:
        copied: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} field {name!r} is not JSON-serialisable: {exc}") from exc
    return copied


# Probes ---------------------------------------------------------------------------------------------

PROBE_ID_LENGTH = 12
RUN_ID_LENGTH = 12
KEY_MAX_LENGTH = 64  # ProbeRequest.key() is a sha256 hex digest
RUN_STATUSES: tuple[str, ...] = ("running", "done", "interrupted")
UNFINISHED_STATUSES: tuple[str, ...] = ("running", "interrupted")


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """One stored probe: the request that was run and the result it gave, as they were saved.

    ``probe_id`` is ``PROBE_ID_LENGTH`` lowercase hex characters; ``key`` is the canonical hash the
    caller stored it under (``ProbeRequest.key(versions)``); ``run_id`` names the probe run that made it
    (None for a probe run on its own); ``created_at`` is tz-aware UTC. ``kind`` and ``model`` come from
    the request's workload, ``device`` from the request, ``outcome`` from the result. ``request`` and
    ``result`` are rebuilt from JSON on every read: changing their dicts changes nothing stored. The
    device fingerprint is ``result.fingerprint``.
    """

    probe_id: str
    key: str
    run_id: str | None
    created_at: datetime
    kind: str
    model: str
    device: str
    outcome: str
    request: ProbeRequest
    result: ProbeResult


@dataclass(frozen=True, slots=True)
class ProbeRunRecord:
    """One probe run (one ``planner probe`` command): the probes it was asked for and how far it got.

    ``request_keys`` are the keys of the requested probes in the order given; ``total`` is their number.
    ``status`` is one of ``RUN_STATUSES``. ``options`` are the command's options as JSON gave them back.
    ``done_keys`` are the keys of the probes stored with this ``run_id`` when the record was read, each
    once, in the order they were first stored.
    """

    run_id: str
    created_at: datetime
    status: str
    total: int
    request_keys: tuple[str, ...]
    options: dict[str, Any]
    done_keys: tuple[str, ...] = ()

    @property
    def pending_keys(self) -> tuple[str, ...]:
        """The requested keys not stored yet for this run, in request order (what a resume still runs)."""
        done = set(self.done_keys)
        return tuple(key for key in self.request_keys if key not in done)


def new_short_id(length: int = PROBE_ID_LENGTH) -> str:
    """A fresh id: the first ``length`` hex characters of a random uuid4."""
    return uuid.uuid4().hex[:length]


# Calibrations ----------------------------------------------------------------------------------------

CALIBRATION_ID_LENGTH = 12


@dataclass(frozen=True, slots=True)
class CalibrationRecord:
    """One stored calibration: coefficients fitted to the probes of one device, as they were saved.

    ``target`` names the device the fit is for: a catalog GPU name (``"H100-80G"``) or ``"cpu:<model>"``
    for DeepSpeed's CPU accelerator. ``values`` maps each fitted coefficient to its value (the names of
    ``search.calibration.PARAMETERS``); ``version`` is the parameter set's version that made them (a
    calibration of another version is not applied). ``probe_ids`` are the probes fitted; ``report`` holds
    the errors before, after and held out. Dicts are fresh JSON copies.
    """

    calibration_id: str
    created_at: datetime
    target: str
    device: str
    version: int
    fingerprint: dict[str, Any]
    values: dict[str, float]
    probe_ids: tuple[str, ...]
    report: dict[str, Any]

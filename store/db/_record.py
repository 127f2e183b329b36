"""The frozen value object that every storage backend returns for a saved plan."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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


def json_copy(name: str, value: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``value`` as JSON would give it back (tuples become lists, keys strings).

    Raises TypeError naming the field when ``value`` is not a dict or holds something JSON cannot
    encode; this is a programming error, not bad user input.
    """
    if not isinstance(value, dict):
        raise TypeError(f"plan field {name!r} must be a dict, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"plan field {name!r} is not JSON-serialisable: {exc}") from exc

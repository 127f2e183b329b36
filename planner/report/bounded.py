"""The bound on every byte figure of a ``--json`` document (issue 42: a plan once printed 4.6e18 bytes).

Byte figures are per GPU or per node; none can be larger than a machine holds. :data:`MAX_PLAN_BYTES`, 2^48
bytes (256 TiB), is above any node's host memory the catalogs hold (``store/nodes.py``: 2 TiB on a DGX H100)
and far above any GPU's, so a plan that reaches it counts an unbounded quantity (a KV cache given unlimited
memory), never a machine. The JSON Schemas carry it as ``maximum`` (``planner/schema``), and the result models
refuse a document beyond it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

MAX_PLAN_BYTES = 2**48

Bytes = Annotated[int, Field(le=MAX_PLAN_BYTES)]  # a byte figure of a plan: finite, at most MAX_PLAN_BYTES


def bound_byte_entries(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` of a free-form object (a rollout engine's report) with its ``*_bytes`` entries bounded."""
    schema["patternProperties"] = {"_bytes$": {"type": "integer", "maximum": MAX_PLAN_BYTES}}
    return schema

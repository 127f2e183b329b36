"""The measured records' residuals of peak reserved memory: package data a plan's spread rests on.

``store/residuals.json`` is written by ``scripts/spread_table.py`` from the stored GPU records
(``tests/data/gpu/*.json``): each record predicted by the cost model with its own job and strategy, its
worst scope's ``predicted / measured - 1`` of peak reserved (an SFT row's whole step, a probe's worst phase),
and the record's mechanisms (:mod:`search.spread.kinds`). Never typed by hand: a test regenerates it and
compares. :mod:`search.spread.measured` turns the nearest records of a plan's kind into the spread it keeps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

RESIDUALS_PATH = Path(__file__).resolve().parent / "residuals.json"


@dataclass(frozen=True)
class Residual:
    """One measured record's error of peak reserved memory, with the mechanisms it ran."""

    record: str  # "<records file>:<record id>"
    source: str  # "sft" (a user-style loop row) or "probe" (planner probe --device cuda)
    workload: str
    model: str
    gpu: str
    kind: dict[str, Any]  # the mechanisms (search.spread.kinds.SpreadKind.to_dict)
    scope: str  # the phase (or "step") whose error is the record's worst
    measured_reserved_bytes: int
    predicted_reserved_bytes: int

    @property
    def residual(self) -> float:
        """predicted / measured - 1 of the worst scope's peak reserved (negative: under-predicted)."""
        return self.predicted_reserved_bytes / self.measured_reserved_bytes - 1.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of one row of ``residuals.json``."""
        return {
            "record": self.record,
            "source": self.source,
            "workload": self.workload,
            "model": self.model,
            "gpu": self.gpu,
            "kind": dict(self.kind),
            "scope": self.scope,
            "measured_reserved_bytes": self.measured_reserved_bytes,
            "predicted_reserved_bytes": self.predicted_reserved_bytes,
            "residual": round(self.residual, 6),
        }

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Residual:
        """A row of ``residuals.json`` (``residual`` is derived, so it is not read back)."""
        return cls(
            record=str(row["record"]),
            source=str(row["source"]),
            workload=str(row["workload"]),
            model=str(row["model"]),
            gpu=str(row["gpu"]),
            kind=dict(row["kind"]),
            scope=str(row["scope"]),
            measured_reserved_bytes=int(row["measured_reserved_bytes"]),
            predicted_reserved_bytes=int(row["predicted_reserved_bytes"]),
        )


def residuals_document(rows: list[Residual], sources: list[str]) -> dict[str, Any]:
    """The whole ``residuals.json`` document of ``rows`` computed from the records files ``sources``."""
    return {
        "about": (
            "written by scripts/spread_table.py from the stored GPU records; do not edit (a test regenerates it "
            "and compares)"
        ),
        "sources": list(sources),
        "records": [row.to_dict() for row in rows],
    }


@lru_cache(maxsize=4)
def load_residuals(path: Path = RESIDUALS_PATH) -> tuple[Residual, ...]:
    """The residual rows of ``path`` (the shipped table by default); none when the file is absent."""
    if not path.is_file():
        return ()
    data = json.loads(path.read_text(encoding="utf-8"))
    return tuple(Residual.from_dict(row) for row in data.get("records", []))

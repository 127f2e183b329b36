"""The spread of peak reserved memory a plan keeps free, from the measured records nearest its kind.

The shipped table (:mod:`store.residuals`) holds every stored GPU record's residual of peak reserved memory
(``predicted / measured - 1``, its worst scope) and its mechanisms (:class:`search.spread.kinds.SpreadKind`). A
plan's spread is the largest under-prediction among the records nearest its kind, plus ``coef``'s margin:

- records of its kind (the same mechanisms): those;
- else records that differ from it in one mechanism: those, and the plan says in which;
- else no record is near: the widest under-prediction of all records, and the plan says so.

``recommend --program`` multiplies in the user's program's measured peak reserved over memplan's own probe of
the same strategy (``coef.program_reserved_factor``): the program reserves its factor times the probe, which
reserves at most ``1 + spread`` times the prediction. With no table shipped the fixed ``coef.reserved_spread`` stays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from search.coefficients import Coefficients
from search.prediction import Prediction
from search.spread.kinds import SpreadKind, kind_of
from search.step.assemble import gpu_budget_bytes
from store.records import Hardware, RLHFStrategy, Strategy, Workload
from store.residuals import Residual, load_residuals

NEAR = 1  # records that differ from a plan in at most this many mechanisms are near it


@dataclass(frozen=True)
class MeasuredSpread:
    """The spread a plan keeps and what it rests on."""

    kind: SpreadKind
    spread: float  # fraction of peak reserved kept free: (1 + under-prediction + margin) x the program's factor - 1
    under: float  # the largest under-prediction among the records it rests on (0: none under-predicted)
    margin: float
    near: bool  # False: no record within NEAR mechanisms; the widest of all records is kept
    distance: int | None  # mechanisms the records differ in from the plan (None: no table)
    records: tuple[str, ...]  # the records it rests on ("<file>:<id>")
    differs_in: tuple[str, ...] = ()  # the mechanisms in which those records are not the plan's kind
    worst_record: str = ""
    program_factor: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        """The plan's ``predicted.reserved_spread_basis`` block."""
        return {
            "kind": self.kind.to_dict(),
            "spread": self.spread,
            "under_predicted": self.under,
            "margin": self.margin,
            "program_factor": self.program_factor,
            "near": self.near,
            "distance": self.distance,
            "count": len(self.records),
            "records": list(self.records),
            "worst_record": self.worst_record,
            "differs_in": list(self.differs_in),
        }


def _worst(rows: list[Residual]) -> tuple[float, str]:
    worst = min(rows, key=lambda row: row.residual)
    return max(0.0, -worst.residual), worst.record


def measured_spread(
    kind: SpreadKind, coef: Coefficients, residuals: tuple[Residual, ...] | None = None
) -> MeasuredSpread:
    """The spread of a plan of ``kind``, from ``residuals`` (the shipped table by default)."""
    rows = list(load_residuals() if residuals is None else residuals)
    margin, factor = coef.reserved_spread_margin, coef.program_reserved_factor

    def kept(under: float) -> float:
        return (1.0 + under + margin) * factor - 1.0

    if not rows:
        fixed = (1.0 + coef.reserved_spread) * factor - 1.0
        return MeasuredSpread(kind, fixed, 0.0, 0.0, False, None, (), program_factor=factor)
    apart = [(len(kind.differs(SpreadKind.from_dict(row.kind))), row) for row in rows]
    distance = min(d for d, _ in apart)
    if distance > NEAR:  # nothing near: the widest of all
        under, worst = _worst(rows)
        return MeasuredSpread(
            kind,
            kept(under),
            under,
            margin,
            near=False,
            distance=distance,
            records=(),
            worst_record=worst,
            program_factor=factor,
        )
    nearest = [row for d, row in apart if d == distance]
    differs = sorted({name for row in nearest for name in kind.differs(SpreadKind.from_dict(row.kind))})
    under, worst = _worst(nearest)
    records = tuple(row.record for row in nearest)
    return MeasuredSpread(
        kind,
        kept(under),
        under,
        margin,
        near=True,
        distance=distance,
        records=records,
        differs_in=tuple(differs),
        worst_record=worst,
        program_factor=factor,
    )


def with_measured_spread(
    prediction: Prediction,
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients,
    residuals: tuple[Residual, ...] | None = None,
) -> Prediction:
    """``prediction`` keeping the measured spread of its kind free: its usable GPU memory
    (:func:`search.step.assemble.gpu_budget_bytes` with that spread), ``reserved_uncertainty`` and the basis."""
    found = measured_spread(kind_of(workload, strategy), coef, residuals)
    budget = gpu_budget_bytes(hardware, coef.with_(reserved_spread=found.spread))
    return replace(
        prediction, gpu_budget_bytes=budget, reserved_uncertainty=found.spread, reserved_spread_basis=found.to_dict()
    )

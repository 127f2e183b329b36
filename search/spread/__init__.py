"""A plan's spread of peak reserved memory from the measured records of its kind (``store/residuals.json``)."""

from search.spread.kinds import SpreadKind, kind_of
from search.spread.measured import MeasuredSpread, measured_spread, with_measured_spread

__all__ = ["MeasuredSpread", "SpreadKind", "kind_of", "measured_spread", "with_measured_spread"]

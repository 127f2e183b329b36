"""What a search returns: candidates (a strategy with its prediction), their score and ranking.

The score is the predicted step time when GPU and host memory fit; otherwise a penalty above every feasible
time that grows with the overflow, so that among infeasible points the one that overflows least ranks first.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.prediction import Prediction
from store.records import RLHFStrategy, Strategy

INFEASIBLE_PENALTY_S = 1e6


@dataclass(frozen=True)
class Candidate:
    """A strategy (single-model or RLHF) with its prediction."""

    strategy: Strategy | RLHFStrategy
    prediction: Prediction

    @property
    def score(self) -> float:
        """Step time when it fits; otherwise a penalty growing with the overflow."""
        p = self.prediction
        return penalized_score(
            p.step_time_s, p.peak_reserved_bytes, p.gpu_budget_bytes, p.host_bytes, p.host_budget_bytes
        )

    @property
    def rank_key(self) -> tuple[float, int]:
        """Order of preference: the score, then (equal times) the lower peak reserved."""
        return (self.score, self.prediction.peak_reserved_bytes)


def penalized_score(step_time: float, reserved: int, gpu_budget: int, host: int, host_budget: int) -> float:
    """Step time when GPU and host memory fit; otherwise a penalty growing with the overflow (GiB)."""
    if reserved <= gpu_budget and host <= host_budget:
        return step_time
    overflow = max(0, reserved - gpu_budget) + max(0, host - host_budget)
    return INFEASIBLE_PENALTY_S + overflow / 2**30


@dataclass(frozen=True)
class SearchResult:
    """What a search found: every evaluated outer point's best candidate, best first."""

    ranked: tuple[Candidate, ...]
    trials: int
    sampler: str
    fastest_ignoring_memory: Candidate | None = None
    replays: int = 0  # steps the confirmation replayed (search.choose.confirm); 0 for the screen's ranking

    @property
    def best(self) -> Candidate | None:
        """The fastest strategy that fits, or None."""
        return self.ranked[0] if self.ranked and self.ranked[0].prediction.fits else None

    @property
    def feasible(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.ranked if c.prediction.fits)

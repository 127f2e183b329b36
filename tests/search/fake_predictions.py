"""A screened or replayed prediction made by hand, for the confirmation's tests (search.choose.confirm): only the
seconds and the bytes they compare matter; every other field is a fixed filler."""

from __future__ import annotations

from search.prediction import Prediction

GiB = 2**30


def prediction(seconds: float, reserved_gib: float, allocated_gib: float = 1.0) -> Prediction:
    """A prediction of ``seconds`` reserving ``reserved_gib`` of a 10 GiB budget (it fits at 10 GiB or less)."""
    return Prediction(
        peak_allocated_bytes=int(allocated_gib * GiB), peak_reserved_bytes=int(reserved_gib * GiB),
        gpu_budget_bytes=10 * GiB, host_bytes=0, host_budget_bytes=GiB, step_time_s=seconds, breakdown={},
        phases=(), peak_phase="",
    )  # fmt: skip

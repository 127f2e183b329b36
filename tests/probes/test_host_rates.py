"""The host benchmark (probes/measure/host_rates.py, issue 46 B): what a CPU can measure is measured, what needs
CUDA is said to be so. Structure and sanity bounds only, never this machine's speed."""

from __future__ import annotations

import pytest

from probes.measure.host_rates import CUDA_NEEDED, HostRates, measure_host_rates

MiB = 2**20


@pytest.fixture(scope="module")
def rates() -> HostRates:
    return measure_host_rates(buffer_bytes=16 * MiB, touch_bytes=16 * MiB)  # small: the test's own cost


def test_host_memory_bandwidth_is_measured_within_physical_bounds(rates: HostRates) -> None:
    assert rates.host_memory_gbps is not None
    assert 0.01 < rates.host_memory_gbps < 10_000  # GB/s: any DRAM, never zero or beyond any memory system
    assert rates.threads >= 1 and rates.buffer_bytes == 16 * MiB and rates.seconds > 0


def test_first_touch_is_measured_or_said_why_not(rates: HostRates) -> None:
    if rates.host_first_touch_gbps is None:
        assert "no slower" in rates.why_not["host_first_touch_gbps"]
    else:
        assert 0.001 < rates.host_first_touch_gbps < 10_000


def test_what_needs_cuda_is_not_measured_on_a_cpu_and_says_so(rates: HostRates) -> None:
    import torch

    assert "host_s_per_kernel" not in rates.measured() and "CUDA" in rates.why_not["host_s_per_kernel"]
    if not torch.cuda.is_available():
        assert rates.pageable_copy_gbps is None and rates.why_not["pageable_copy_gbps"] == CUDA_NEEDED


def test_the_stored_shape_names_the_benchmark(rates: HostRates) -> None:
    stored = rates.to_dict()
    assert stored["benchmark"] == "probes/measure/host_rates.py"
    assert set(stored["measured"]) <= {"host_memory_gbps", "host_first_touch_gbps", "pageable_copy_gbps"}
    assert stored["measured"]["host_memory_gbps"] == rates.host_memory_gbps
    assert set(stored["measured"]).isdisjoint(stored["why_not"])  # each term measured or said why not

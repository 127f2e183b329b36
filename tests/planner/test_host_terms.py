"""Each host term of the time model is measured, fitted or assumed, and a plan says which (issue 46 B)."""

from __future__ import annotations

from planner.calibration.fit import _host_rates
from planner.job.host_terms import HOST_TERMS, host_terms, host_terms_line
from search import DEFAULT_COEFFICIENTS as C


def test_a_fit_beats_the_benchmark_which_beats_the_default() -> None:
    terms = host_terms(
        C.with_(host_s_per_kernel=3e-5),
        measured={"host_memory_gbps": 42.0, "host_s_per_kernel": 1.0},
        fitted={"host_s_per_kernel"},
        why_not={"pageable_copy_gbps": "needs CUDA"},
    )
    assert set(terms) == set(HOST_TERMS)
    assert terms["host_s_per_kernel"] == {"value": 3e-5, "source": "fitted", "how": terms["host_s_per_kernel"]["how"]}
    assert terms["host_memory_gbps"]["source"] == "measured" and terms["host_memory_gbps"]["value"] == 42.0
    assert terms["pageable_copy_gbps"] == {"value": C.pageable_copy_gbps, "source": "assumed", "how": "needs CUDA"}
    assert terms["host_first_touch_gbps"]["source"] == "assumed"
    line = host_terms_line(terms)
    assert "host_memory_gbps 42 measured" in line and "pageable_copy_gbps 6.6 assumed" in line


def test_another_machines_device_is_not_measured_here() -> None:
    measured, report = _host_rates("H100-80G", run=True)
    assert measured == {} and set(report["why_not"]) == set(HOST_TERMS)
    assert all("another machine" in why for why in report["why_not"].values())
    assert _host_rates("H100-80G", run=False)[0] == {}

"""The time model's host terms, and for each whether it was measured on the host, fitted to probes or assumed.

``host_s_per_kernel``, ``host_memory_gbps``, ``host_first_touch_gbps`` and ``pageable_copy_gbps`` were one host's
figures (search.coefficients). ``planner calibrate`` run on the machine whose probes it fits measures what a CPU
can (``probes/measure/host_rates.py``) and stores it with the calibration; a fit to the stored probes that
determines a term takes precedence; every other term keeps the catalog's figure and is said to be assumed. A
plan's ``calibration`` block carries the result (``host_terms``), and the text report names each.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from search import Coefficients

HOST_TERMS = ("host_s_per_kernel", "host_memory_gbps", "host_first_touch_gbps", "pageable_copy_gbps")
BENCHMARK = "probes/measure/host_rates.py"


def host_terms(
    coef: Coefficients,
    measured: Mapping[str, float] | None = None,
    fitted: Collection[str] = (),
    why_not: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each host term's value and source: ``fitted`` (the calibration's fit to probes determined it), ``measured``
    (the host benchmark), else ``assumed`` (``coef``'s figure, with why it was not measured where known)."""
    measured, why_not = measured or {}, why_not or {}
    terms: dict[str, dict[str, Any]] = {}
    for name in HOST_TERMS:
        value = float(getattr(coef, name))
        if name in fitted:
            terms[name] = {"value": value, "source": "fitted", "how": "planner calibrate's fit to the stored probes"}
        elif name in measured:
            terms[name] = {"value": float(measured[name]), "source": "measured", "how": BENCHMARK}
        else:
            how = why_not.get(name, "the default figure (search.coefficients); no host benchmark ran for it")
            terms[name] = {"value": value, "source": "assumed", "how": how}
    return terms


def host_terms_line(terms: Mapping[str, Mapping[str, Any]]) -> str:
    """One line for the text reports: ``host terms: host_memory_gbps 2.7 measured, ... assumed``."""
    parts = [f"{name} {terms[name]['value']:.3g} {terms[name]['source']}" for name in HOST_TERMS if name in terms]
    shown = ", ".join(parts)
    return f"host terms: {shown}"

"""Human-readable output of the CLI: rich tables over the API's typed results.

The face of the text reports: a plan's and a prediction's (``planner.report.prediction_text``), measuring's and
the stored records' (``planner.report.probe_text``), on the console and in the units they share
(``planner.report.text_units``).
"""

from __future__ import annotations

from planner.report.prediction_text import host_line, render_check, render_plan, render_prediction
from planner.report.probe_text import (
    render_coefficients,
    render_plans,
    render_probe_report,
    render_probes,
    render_program_report,
)
from planner.report.text_units import console, describe

__all__ = [
    "console",
    "describe",
    "host_line",
    "render_check",
    "render_coefficients",
    "render_plan",
    "render_plans",
    "render_prediction",
    "render_probe_report",
    "render_probes",
    "render_program_report",
]

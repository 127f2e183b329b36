"""The PNG memory picture shows what the SVG shows (issue 44 item 4): x in the step's predicted seconds (each phase
run as wide as its predicted time, generation included), usable memory and peak reserved + spread as lines, only
the plan's own empty_cache calls marked. Checked on the matplotlib figure's axes and artists (their data, not
pixels), against the plan's JSON document; skipped where matplotlib (the ``plot`` extra) is not installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CliResult

from planner.report.plot import PlanFigures, write_memory_plot
from store.records import Strategy

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the plot extra) is not installed"
)
GIB = 2**30


def _document(cli: Callable[..., CliResult], db: Path, *job: str) -> dict[str, Any]:
    result = cli("recommend", "--model", "opt-1.3b", "--gpu-mem", "24G", "--cpu-mem", "64G", *job, "--json",
                 "--db", db)  # fmt: skip
    assert result.rc == 0, result.err
    document: dict[str, Any] = result.json()
    return document


def _axes(document: dict[str, Any]) -> Any:
    """The picture's memory axes, drawn from the plan's own replay as ``explain --plot`` draws it."""
    from planner.job.inputs import resolve
    from planner.planning.saved import plan_job
    from planner.report.plot_png import memory_figure
    from search import replay_timeline
    from store.records import RLHFStrategy

    job = resolve(plan_job(document))
    parse = RLHFStrategy.from_dict if job.workload.is_rlhf else Strategy.from_dict
    timeline = replay_timeline(job.workload, parse(document["strategy"]), job.hardware)
    (ax,) = memory_figure(timeline, "plan", figures=PlanFigures.from_document(document)).axes
    return ax


def _check_time_axis(document: dict[str, Any], ax: Any) -> list[tuple[str, float]]:
    per_run = {p["name"]: p["time_s"] / p["count"] for p in document["predicted"]["phases"]}
    bands = [(patch.get_gid()[len("phase:") :], patch.get_x(), patch.get_width())
             for patch in ax.patches if (patch.get_gid() or "").startswith("phase:")]  # fmt: skip
    assert bands and bands[0][1] == 0.0
    for (_, start, width), (_, following, _) in zip(bands, bands[1:], strict=False):
        assert start + width == pytest.approx(following)  # laid end to end
    for name, _, width in bands:  # each run as wide as its predicted seconds
        assert width == pytest.approx(per_run[name], rel=1e-6), name
    step = sum(per_run[name] for name, _, _ in bands)
    assert ax.get_xlim() == pytest.approx((0.0, step))
    assert ax.get_xlabel() == "predicted seconds of one step"
    lines = {line.get_gid(): line for line in ax.get_lines() if line.get_gid() in ("usable", "spread")}
    predicted = document["predicted"]
    assert list(lines["usable"].get_ydata()) == pytest.approx([predicted["gpu_budget_bytes"] / GIB] * 2)
    spread = predicted["peak_reserved_bytes"] * (1 + predicted["reserved_uncertainty"]) / GIB
    assert list(lines["spread"].get_ydata()) == pytest.approx([spread] * 2, abs=1e-9)
    assert ax.get_ylim()[1] > max(predicted["gpu_budget_bytes"] / GIB, spread)  # both lines inside the picture
    return [(name, width) for name, _, width in bands]


def _marks(ax: Any) -> list[Any]:
    return [line for line in ax.get_lines() if line.get_gid() == "empty_cache"]


def test_an_rlhf_plans_png_spans_generation_at_its_predicted_time(cli, db: Path, tmp_path: Path) -> None:
    document = _document(cli, db, "--rollout", "hybrid-engine")
    ax = _axes(document)
    widths = dict(_check_time_axis(document, ax))
    assert widths["generation"] > 0.1 * sum(widths.values())  # once a sliver: a few allocator events of a long phase
    assert len(_marks(ax)) == (0 if document["strategy"]["empty_cache"] == "never" else 1)
    png = tmp_path / "memory.png"
    result = cli("explain", document["plan_id"], "--plot", png, "--db", db)
    assert result.rc == 0, result.err
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_an_sft_plans_png_draws_each_micro_step_at_its_predicted_time(cli, db: Path) -> None:
    document = _document(cli, db, "--workload", "sft", "--batch", "32")
    names = [name for name, _ in _check_time_axis(document, _axes(document))]
    counts = {p["name"]: p["count"] for p in document["predicted"]["phases"]}
    assert names.count("forward") == counts["forward"] > 1


def test_the_png_marks_only_the_plans_own_empty_cache_calls(tmp_path: Path) -> None:
    """after-phase: one call after each phase run; every-step: one at the step's end; never: none."""
    from planner.planning.predicting import job_spec, resolve
    from planner.report.plot_png import memory_figure
    from search import replay_timeline

    job = resolve(job_spec("opt-125m", {"workload": "sft", "gpu_mem": "24G", "batch": 4, "seq_len": 256}))
    run_seconds = {"forward": 1.0, "backward": 2.0, "optimizer_step": 1.0}
    for policy, expected in (("never", 0), ("after-phase", 5), ("every-step", 1)):
        strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2, empty_cache=policy)
        timeline = replay_timeline(job.workload, strategy, job.hardware)
        figures = PlanFigures(run_seconds, 2**34, 2**33, 0.05, policy)
        (ax,) = memory_figure(timeline, policy, figures=figures).axes
        marks = _marks(ax)
        assert len(marks) == expected, policy  # 5 phase runs: forward, backward twice, then the optimizer step
        assert all(0.0 < line.get_xdata()[0] <= 8.0 for line in marks)  # inside the 8 predicted seconds
        written, _ = write_memory_plot(timeline, tmp_path / f"{policy}.png", policy, figures=figures)
        assert written.read_bytes().startswith(b"\x89PNG")

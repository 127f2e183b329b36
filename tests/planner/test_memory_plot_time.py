"""The memory picture's x-axis is time (issue 44 item 4): each phase run spans its predicted seconds (generation
included), usable memory and peak reserved + spread are lines, and only the plan's own empty_cache calls are
marked. The SVG is parsed (xml.etree) and its elements checked against the plan's JSON document."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import CliResult

from planner.report.plot import PAD, WIDTH, PlanFigures, plan_calls, write_memory_plot
from store.records import Strategy

SVG = "{http://www.w3.org/2000/svg}"
PLOT_WIDTH = WIDTH - 2 * PAD  # no rollout engine block in these plans


def _drawn(cli: Callable[..., CliResult], db: Path, tmp_path: Path, *job: str) -> tuple[dict, ET.Element]:
    result = cli("recommend", "--model", "opt-1.3b", "--gpu-mem", "24G", "--cpu-mem", "64G", *job, "--json",
                 "--db", db)  # fmt: skip
    assert result.rc == 0, result.err
    document = result.json()
    svg = tmp_path / f"{document['plan_id']}.svg"
    assert cli("explain", document["plan_id"], "--plot", svg, "--db", db).rc == 0
    return document, ET.parse(svg).getroot()


def _phase_widths(root: ET.Element) -> list[tuple[str, float]]:
    return [(rect.findtext(f"{SVG}title") or "", float(rect.get("width", "0")))
            for rect in root.iter(f"{SVG}rect") if rect.get("class") == "phase"]  # fmt: skip


def _lines(root: ET.Element, kind: str) -> list[ET.Element]:
    return [line for line in root.iter(f"{SVG}line") if line.get("class") == kind]


def _check_time_axis(document: dict, root: ET.Element) -> list[tuple[str, float]]:
    per_run = {p["name"]: p["time_s"] / p["count"] for p in document["predicted"]["phases"]}
    widths = _phase_widths(root)
    total = sum(per_run[name] for name, _ in widths)
    assert sum(width for _, width in widths) == pytest.approx(PLOT_WIDTH, abs=1.0)
    for name, width in widths:  # each run's width is its share of the step's predicted seconds
        assert width == pytest.approx(PLOT_WIDTH * per_run[name] / total, abs=1.0), name
    usable, spread = _lines(root, "usable"), _lines(root, "spread")
    assert len(usable) == 1 and len(spread) == 1
    budget = document["predicted"]["gpu_budget_bytes"] / 2**30
    assert f"{budget:.2f} GiB" in (usable[0].findtext(f"{SVG}title") or "")
    peak = document["predicted"]["peak_reserved_bytes"] * (1 + document["predicted"]["reserved_uncertainty"])
    assert f"{peak / 2**30:.2f} GiB" in (spread[0].findtext(f"{SVG}title") or "")
    axis = [t.text or "" for t in root.iter(f"{SVG}text") if t.get("class") == "axis"]
    assert axis and axis[0].startswith("predicted seconds of one step")
    return widths


def test_an_rlhf_plans_generation_spans_its_predicted_time(cli, db: Path, tmp_path: Path) -> None:
    document, root = _drawn(cli, db, tmp_path, "--rollout", "hybrid-engine")
    widths = dict(_check_time_axis(document, root))
    assert widths["generation"] > 0.1 * PLOT_WIDTH  # once 0.1 pixel: a few allocator events of a long phase
    assert len(_lines(root, "empty_cache")) == (0 if document["strategy"]["empty_cache"] == "never" else 1)


def test_an_sft_plans_phases_span_their_predicted_time(cli, db: Path, tmp_path: Path) -> None:
    document, root = _drawn(cli, db, tmp_path, "--workload", "sft", "--batch", "32")
    names = [name for name, _ in _check_time_axis(document, root)]
    counts = {p["name"]: p["count"] for p in document["predicted"]["phases"]}
    assert names.count("forward") == counts["forward"] > 1  # each micro-step's run, at its own predicted time


def test_only_the_plans_own_empty_cache_calls_are_marked(tmp_path: Path) -> None:
    from planner.planning.predicting import job_spec, resolve
    from search import replay_timeline

    job = resolve(job_spec("opt-125m", {"workload": "sft", "gpu_mem": "24G", "batch": 4, "seq_len": 256}))
    for policy, expected in (("never", 0), ("after-phase", None), ("every-step", 1)):
        strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2, empty_cache=policy)
        timeline = replay_timeline(job.workload, strategy, job.hardware)
        figures = PlanFigures({"forward": 1.0, "backward": 2.0, "optimizer_step": 1.0}, 2**34, 2**33, 0.05, policy)
        written, rows = write_memory_plot(timeline, tmp_path / f"{policy}.svg", policy, figures=figures)
        marks = _lines(ET.parse(written).getroot(), "empty_cache")
        assert len(marks) == len(plan_calls(timeline, policy)) == (len(rows) if expected is None else expected)


def test_the_drawn_allocated_line_peaks_where_the_prediction_says(tmp_path: Path) -> None:
    """One source for peak allocated: the picture's allocated line, phase by phase, peaks at the bytes the plan's
    prediction prints (the live tensors' bytes), and its table is the prediction's. Before, the line and the table
    were the replay's allocator blocks, rounding remainders included: 0.2-0.6% above what recommend printed."""
    from planner.planning.predicting import job_spec, resolve
    from planner.report.plot_layout import phase_rows
    from search import predict, replay_timeline

    job = resolve(job_spec("opt-125m", {"workload": "sft", "gpu_mem": "24G", "batch": 4, "seq_len": 256}))
    strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2)
    predicted = predict(job.workload, strategy, job.hardware).to_dict()
    timeline = replay_timeline(job.workload, strategy, job.hardware)
    drawn: dict[str, int] = {}
    for name, allocated, _ in phase_rows(timeline):
        drawn[name] = max(drawn.get(name, 0), allocated)
    printed = {p["name"]: p["peak_allocated_bytes"] for p in predicted["phases"]}
    assert drawn == printed
    document = {"predicted": predicted, "strategy": strategy.to_dict()}
    _, rows = write_memory_plot(timeline, tmp_path / "m.svg", "t", figures=PlanFigures.from_document(document))
    assert {(name, a, r) for name, a, r in rows} == {
        (p["name"], p["peak_allocated_bytes"], p["peak_reserved_bytes"]) for p in predicted["phases"]
    }

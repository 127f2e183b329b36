"""``planner explain PLAN_ID --plot FILE``: one step of the allocator replay, drawn and tabled (issue 10, part 6)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from planner_helpers import assert_one_error_line


def _plan(cli, db: Path, *extra: str) -> str:
    if "--rollout" not in extra:  # the replay draws DeepSpeed's generation (an engine plan is refused)
        extra = (*extra, "--rollout", "hybrid-engine")
    result = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G", "--db", db, *extra)
    assert result.rc == 0, result.err
    found = re.search(r"planner export (\w+)", result.out)
    assert found, result.out
    return found.group(1)


def test_plot_draws_every_phase_and_prints_the_same_as_a_table(cli, db: Path, tmp_path: Path) -> None:
    plan_id = _plan(cli, db)
    out = tmp_path / "memory.html"
    result = cli("explain", plan_id, "--plot", out, "--db", db)
    assert result.rc == 0, result.err
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page
    rows = [line.split() for line in result.out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["generation", "scoring", "actor_training", "critic_training"]
    for row in rows:
        assert f"<title>{row[0]}</title>" in page
        allocated, reserved = float(row[1]), float(row[3])
        assert 0 < allocated <= reserved  # the allocator reserves at least what it hands out


def test_a_plan_with_a_rollout_engine_draws_the_engines_turn(cli, db: Path, tmp_path: Path) -> None:
    """The engine's turn is a block of its own (awake: weights and KV cache; asleep), beside the trainer's phases,
    whose rows are the plan's predicted phases (the engine's awake bytes in generation, asleep ones beside
    training). Before, --plot refused every plan with a rollout engine."""
    plan_id = _plan(cli, db, "--rollout", "vllm", "--workload", "grpo")
    out = tmp_path / "m.svg"
    result = cli("explain", plan_id, "--plot", out, "--db", db)
    assert result.rc == 0, result.err
    page = out.read_text()
    assert "rollout engine's turn (vllm" in page and "KV cache" in page and "weights" in page
    rows = {row[0] + (" " + row[1] if row[1] in ("awake", "asleep") else ""): row for row in
            (line.split() for line in result.out.splitlines()[2:])}  # fmt: skip
    assert {"vllm awake", "vllm asleep", "generation", "weight_sync"} <= set(rows)
    doc = json.loads(cli("explain", plan_id, "--db", db).out)
    # each row is the plan's phase, its bytes the plan's own figures (one source: the table prints the prediction)
    for phase in doc["predicted"]["phases"]:
        shown = rows[phase["name"]]
        allocated = float(shown[1]) if shown[2] == "GiB" else float(shown[1]) / 1024
        reserved = float(shown[3]) if shown[4] == "GiB" else float(shown[3]) / 1024
        assert reserved == pytest.approx(phase["peak_reserved_bytes"] / 2**30, abs=0.005), phase["name"]
        assert allocated == pytest.approx(phase["peak_allocated_bytes"] / 2**30, abs=0.005), phase["name"]
    awake = float(rows["vllm awake"][2])
    assert awake == pytest.approx(doc["predicted"]["rollout"]["awake_bytes"] / 2**30, abs=0.01)


def test_plot_marks_the_empty_cache_calls(tmp_path: Path) -> None:
    """A step that empties the cache after every phase shows one call after each phase run; never, none."""
    from planner.planning.predicting import job_spec, resolve
    from planner.report.plot import write_memory_plot
    from search import replay_timeline
    from store.records import Strategy

    job = resolve(job_spec("opt-125m", {"workload": "sft", "gpu_mem": "24G", "batch": 4, "seq_len": 256}))
    for policy, expected in (("never", 0), ("after-phase", None)):
        strategy = Strategy(zero_stage=2, micro_batch=2, grad_accum=2, empty_cache=policy)
        timeline = replay_timeline(job.workload, strategy, job.hardware)
        written, rows = write_memory_plot(timeline, tmp_path / f"{policy}.svg", policy)
        calls = written.read_text().count("empty_cache()</title>")
        assert calls == (len(rows) if expected is None else expected)
        assert [name for name, _, _ in rows] == ["forward", "backward", "forward", "backward", "optimizer_step"]


def test_plot_refuses_what_it_cannot_write(cli, db: Path, tmp_path: Path) -> None:
    plan_id = _plan(cli, db)
    existing = tmp_path / "memory.svg"
    existing.write_text("kept")
    assert_one_error_line(cli("explain", plan_id, "--plot", existing, "--db", db), "exists", "--force")
    assert existing.read_text() == "kept"
    assert_one_error_line(cli("explain", plan_id, "--plot", tmp_path / "m.txt", "--db", db), ".html", ".svg")
    assert cli("explain", plan_id, "--plot", existing, "--force", "--db", db).rc == 0
    assert "<svg" in existing.read_text()


def test_png_without_matplotlib_says_what_to_install(cli, db: Path, tmp_path: Path, monkeypatch) -> None:
    plan_id = _plan(cli, db)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as where the plot extra is not installed
    result = cli("explain", plan_id, "--plot", tmp_path / "m.png", "--db", db)
    assert_one_error_line(result, "matplotlib")
    assert not (tmp_path / "m.png").exists()

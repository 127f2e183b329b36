"""``--db`` is where everything goes, and a refused command writes nothing: not even a model's shape.

A local config of an architecture without a formula (here a copy of qwen3-0.6b's) is traced on first use and
its shape kept in the plan database. ``probe``, ``explain --plot`` and ``calibrate`` keep it in the database
they were given (never in ``$PLANNER_DB`` or the user data folder), and a command refused for any input,
however late it is checked, creates no database for it. The trace itself is replaced by the catalog's shape
of the same config (what ``python -m probes.trace.catalog --write-catalog`` traced with transformers): the
database, the commands and the cache are real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO, assert_one_error_line, run_main

import planner.job.model_shapes
from store.db import open_storage
from store.measurements import ProbeRequest, ProbeResult
from store.model_shape import catalog_shape, installed_versions, shape_key
from store.models import catalog_configs

MODEL = "qwen3-0.6b"
GPU = ("--gpu-mem", "24G", "--cpu-mem", "64G", "--workload", "sft")


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A local copy of a catalog config (untraced to the planner), the count of traces, and where
    ``$PLANNER_DB`` points (a file that must never appear)."""
    folder = tmp_path / "qwen3-local"
    folder.mkdir()
    # another norm epsilon: not the catalog's shape (a copy of it is the catalog model, store.model_identity)
    config = {**catalog_configs()[MODEL], "rms_norm_eps": 1e-5}
    (folder / "config.json").write_text(json.dumps(config))
    shape = catalog_shape(MODEL)
    assert shape is not None
    traces: list[str] = []

    def trace(hf_config: dict[str, Any], source: str, versions: dict[str, str], on_note: Any) -> dict[str, Any]:
        traces.append(source)
        return {**shape, "activation_unfitted": {}}

    def with_terms(
        found: dict[str, Any], hf_config: dict[str, Any], keys: tuple[str, ...], on_note: Any
    ) -> dict[str, Any]:
        traces.append(f"terms {keys}")
        return {**found, "activation_unfitted": {**found.get("activation_unfitted", {}), **{k: "test" for k in keys}}}

    monkeypatch.setattr(planner.job.model_shapes, "_trace", trace)
    monkeypatch.setattr(planner.job.model_shapes, "_with_terms", with_terms)
    default = tmp_path / "default.db"
    monkeypatch.setenv("PLANNER_DB", str(default))
    return {"path": str(folder), "key": shape_key(config, installed_versions()), "traces": traces, "default": default}


def _cached(db: Path, key: str) -> bool:
    with open_storage(str(db)) as storage:
        return storage.load_model_shape(key) is not None


def test_probe_keeps_the_shape_in_its_own_database(
    traced: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import probes.measure.cpu_support
    from planner import probe

    monkeypatch.setattr(probes.measure.cpu_support, "cpu_bf16_is_fast", lambda: True)
    strategies = tmp_path / "strategies.json"
    strategies.write_text(json.dumps([{"zero_stage": 0, "micro_batch": 2, "grad_accum": 1}]))
    db = tmp_path / "probes.db"

    def runner(request: ProbeRequest) -> ProbeResult:
        return ProbeResult(outcome="error", phases=(), failed_phase="init", message="not run in this test")

    probe(traced["path"], workload="sft", gpu_mem="24G", cpu_mem="64G", batch=2, seq_len=32, dtype="bf16",
          device="cpu", steps=2, layers="1", strategies=str(strategies), runner=runner, db=str(db))  # fmt: skip
    assert _cached(db, traced["key"])
    assert not traced["default"].exists()


def test_explain_plot_reads_the_shape_from_the_plans_database(traced: dict[str, Any], tmp_path: Path) -> None:
    db = tmp_path / "plans.db"
    made = run_main(["recommend", "--model", traced["path"], *GPU, "--db", db, "--json"])
    assert made.rc == 0, made.err
    assert _cached(db, traced["key"]) and len(traced["traces"]) == 1
    plot = run_main(["explain", made.json()["plan_id"], "--plot", tmp_path / "memory.html", "--db", db])
    assert plot.rc == 0, plot.err
    assert len(traced["traces"]) == 1, traced["traces"]  # read from plans.db, not traced again elsewhere
    assert not traced["default"].exists()


def test_calibrate_reads_the_shape_from_its_database(traced: dict[str, Any], tmp_path: Path) -> None:
    from planner.calibration.gather import probe_observation
    from planner.calibration.records import load_records

    db = tmp_path / "probes.db"
    made = run_main(["recommend", "--model", traced["path"], *GPU, "--db", db])
    assert made.rc == 0, made.err
    record = next(p for p in load_records(REPO / "tests/data/gpu/h100-2026-11-23.json")["probes"])
    request = {**record["request"], "workload": {**record["request"]["workload"], "model": traced["path"]}}
    probe_observation("local", request, record["result"], "H100-80G", db=str(db))
    assert len(traced["traces"]) == 1, traced["traces"]
    assert not traced["default"].exists()


@pytest.mark.parametrize(
    "late",
    [["--seed", "-1"], ["--lora-rank", str(10**12)], ["--calibration", "abcd1234"], ["--rollout", "nope"]],
    ids=["seed", "lora-rank", "calibration-id", "rollout"],
)
def test_a_command_refused_after_the_trace_writes_no_shape(
    traced: dict[str, Any], tmp_path: Path, late: list[str]
) -> None:
    db = tmp_path / "typo.db"
    assert_one_error_line(run_main(["recommend", "--model", traced["path"], *GPU, *late, "--db", db]))
    assert traced["traces"], "the model was read before the refusal"
    assert not db.exists() and not traced["default"].exists()


def test_a_refused_probe_writes_no_shape(traced: dict[str, Any], tmp_path: Path) -> None:
    db = tmp_path / "probes.db"
    args = ["probe", "--model", traced["path"], *GPU, "--device", "cpu", "--dtype", "fp32", "--layers", "99"]
    assert_one_error_line(run_main([*args, "--db", db]), "--layers")
    assert not db.exists() and not traced["default"].exists()


def test_an_explicit_calibration_id_is_refused_without_a_database(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    for command in ("recommend", "predict", "check"):
        config = tmp_path / "ds.json"
        config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1}))
        args = [command, *([config] if command == "check" else []), "--model", "opt-125m", "--gpu-mem", "24G"]
        args += ["--cpu-mem", "64G", "--workload", "sft", "--calibration", "abcd1234", "--db", db]
        line = assert_one_error_line(run_main(args), "abcd1234")
        assert "does not exist" in line
        assert not db.exists()

"""A plan's figures are computed once, with the coefficients it was planned with (issue 45 item 1):
its JSON, its text report and its export carry the figures of its prediction.

Old behaviour these catch: ``planner.report.prediction`` replayed the allocator with the default coefficients
beside a ``predicted`` block from calibrated ones (a calibrated plan's ``allocator_replay`` said another peak
reserved than its prediction), and ``planner export`` solved a framework's rollout engine again under the
calibration looked up anew, losing the coefficients the plan was made with (``recommend(coefficients=...)``,
a program's spread), so the exported engine budget was not the one the plan's launch flags showed; the memory
picture of ``planner explain --plot`` replayed a calibrated plan's step under the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from planner import export, memory_plot, predict, recommend
from planner.report import text
from search import DEFAULT_COEFFICIENTS
from search.calibration import CALIBRATION_VERSION
from store.db import open_storage

GIB = 2**30
# A calibration of the H100 whose values move the allocator replay (the cuBLAS workspace goes through torch's
# caching allocator) and the time model: a record as ``planner calibrate`` stores one, built here.
VALUES = {"cublas_workspace_bytes": float(GIB), "gpu.matmul_efficiency": 0.3}
SFT_JOB: dict[str, Any] = {"gpu": "H100", "cpu_mem": "128G", "workload": "sft"}
# GRPO whose SGLang rollout OpenRLHF and TRL run as vLLM, at the utilization memplan solves for vLLM
GRPO_JOB: dict[str, Any] = {"gpu": "H100", "gpus": 2, "workload": "grpo", "rollout": "sglang"}


@dataclass(frozen=True)
class Calibrated:
    db: str
    calibration_id: str


@pytest.fixture(scope="module")
def calibrated_db(tmp_path_factory: pytest.TempPathFactory) -> Calibrated:
    db = str(tmp_path_factory.mktemp("calibrated") / "plans.db")
    with open_storage(db) as storage:
        record = storage.save_calibration(
            target="H100-80G",
            device="cuda",
            version=CALIBRATION_VERSION,
            fingerprint={"name": "NVIDIA H100 80GB HBM3"},
            values=VALUES,
            probe_ids=["probe-1"],
            report={},
        )
    return Calibrated(db, record.calibration_id)


def _rendered(render: Any, document: Any) -> str:
    with text.console.capture() as captured:
        render(document)
    return " ".join(captured.get().split())


def test_a_calibrated_plan_replays_the_allocator_with_its_own_coefficients(
    calibrated_db: Calibrated, tmp_path: Path
) -> None:
    plan = recommend("opt-125m", top=1, db=calibrated_db.db, **SFT_JOB)
    assert plan.calibration is not None and plan.calibration["id"] == calibrated_db.calibration_id
    document = plan.model_dump()
    predicted, replay = document["predicted"], document["allocator_replay"]
    assert plan.fits and predicted["reserved_from"] == "replay"
    # the calibration moves the replay: the same strategy under the defaults reserves less (no 1 GiB workspace)
    defaults = predict("opt-125m", dict(plan.strategy), calibration="none", db=calibrated_db.db, **SFT_JOB)
    assert defaults.predicted.peak_reserved_bytes < predicted["peak_reserved_bytes"]
    # the JSON: the replay block is the prediction's replay, phase by phase
    assert replay["peak_reserved_bytes"] == predicted["peak_reserved_bytes"]
    assert {p["name"]: p["peak_reserved_bytes"] for p in replay["phases"]} == {
        p["name"]: p["peak_reserved_bytes"] for p in predicted["phases"]
    }
    # the text report: the prediction's peak reserved, and the replay's figures in its caption
    shown = _rendered(text.render_plan, plan)
    assert f"peak reserved {predicted['peak_reserved_bytes'] / GIB:.2f} GiB" in shown
    assert f"{replay['after_init_reserved_bytes'] / GIB:.2f} GiB reserved once the engines are built" in shown
    assert "replay alone" not in shown  # no second reserved column: the replay is the prediction's
    # the export: the plan's document as it was made
    _, exported = export(plan.plan_id, tmp_path / "ds_config.json", db=calibrated_db.db)
    assert exported["allocator_replay"] == replay and exported["predicted"] == predicted
    # the memory picture (planner explain --plot) replays the step under the plan's calibration too
    _, rows = memory_plot(plan.plan_id, tmp_path / "memory.svg", db=calibrated_db.db)
    assert max(reserved for _, _, reserved in rows) == predicted["peak_reserved_bytes"]
    # and its table prints the plan's figures, allocated bytes too (once the replay's blocks, 0.2-0.6% more)
    assert {(name, a, r) for name, a, r in rows} == {
        (p["name"], p["peak_allocated_bytes"], p["peak_reserved_bytes"]) for p in predicted["phases"]
    }


def _flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_the_export_runs_the_engine_budget_the_plan_shows(calibrated_db: Calibrated, tmp_path: Path) -> None:
    """Coefficients given to ``recommend`` (3 GiB of CUDA context) on top of the stored calibration: the vLLM
    budget OpenRLHF and TRL get is the one solved under them, in the plan, its text and its export alike."""
    coefficients = DEFAULT_COEFFICIENTS.with_(cuda_context_bytes=3.0 * GIB)
    plan = recommend("opt-125m", top=0, db=calibrated_db.db, coefficients=coefficients, **GRPO_JOB)
    assert plan.calibration is not None and plan.calibration["id"] == calibrated_db.calibration_id
    assert plan.strategy["rollout"]["engine"] == "sglang"
    document = plan.model_dump()
    runs = document["framework_rollouts"]
    assert set(runs) == {"openrlhf", "trl"}  # veRL runs SGLang itself
    utilization = runs["openrlhf"]["strategy"]["rollout"]["gpu_memory_utilization"]
    assert runs["openrlhf"]["strategy"]["rollout"]["engine"] == "vllm" and utilization is not None
    line = document["launch_gaps"]["openrlhf"][0]
    assert line == runs["openrlhf"]["lines"][0] and f"gpu_memory_utilization {utilization:g}" in line
    assert _flag(document["launch"]["openrlhf"], "--vllm.gpu_memory_utilization") == f"{utilization:g}"
    assert _flag(document["launch"]["trl"], "--vllm_gpu_memory_utilization") == f"{utilization:g}"
    assert f"not expressible: {line}" in _rendered(text.render_plan, plan)
    # the export writes that budget and that line, whatever the calibration in the database says now
    out = tmp_path / "run_openrlhf.sh"
    _, exported = export(plan.plan_id, out, db=calibrated_db.db, format="openrlhf")
    assert exported["export"]["gaps"][0] == line
    assert f"--vllm.gpu_memory_utilization {utilization:g}" in out.read_text()

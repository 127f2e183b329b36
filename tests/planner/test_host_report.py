"""Host memory per node with its parts in the API's results (``--json``), the text line and ``check``'s reasons."""

from __future__ import annotations

from collections.abc import Callable

from planner_helpers import CliResult

Cli = Callable[..., CliResult]
GiB = 2**30
OFFLOAD = {"zero_stage": 2, "offload_optimizer": "cpu", "micro_batch": 4}
JOB = {"gpu_mem": "80G", "workload": "sft", "gpus": 2}


def test_predict_carries_the_host_breakdown_and_rejects_a_plan_over_cpu_mem() -> None:
    from planner import predict

    roomy = predict("opt-1.3b", OFFLOAD, cpu_mem="256G", **JOB)
    host = roomy.predicted
    assert roomy.fits and host.host_peak_phase == "steady"
    assert sum(host.host_breakdown.values()) == host.host_bytes == host.host_phases["steady"]
    assert set(host.host_breakdown) == {"offloaded_optimizer_states", "pinned_buffers", "buffer_slack"}
    dumped = roomy.model_dump()["predicted"]
    assert dumped["host_breakdown"] == host.host_breakdown and dumped["host_phases"] == host.host_phases
    tight = predict("opt-1.3b", OFFLOAD, cpu_mem=str(host.host_bytes - 1), **JOB)
    assert tight.predicted.peak_reserved_bytes <= tight.predicted.gpu_budget_bytes  # the GPU alone would fit
    assert tight.fits is False


def test_host_line_names_the_largest_parts_and_the_other_phase() -> None:
    from planner.report.results import Predicted
    from planner.report.text import host_line

    base = {
        "peak_allocated_bytes": 0,
        "peak_reserved_bytes": 0,
        "gpu_budget_bytes": 1,
        "step_time_s": 1.0,
        "peak_phase": "forward",
        "breakdown": {},
        "time_breakdown": {},
        "phases": [],
    }
    parts = {
        "offloaded_optimizer_states": 30 * GiB,
        "pinned_buffers": 7 * GiB // 2,
        "buffer_slack": 4 * GiB,
        "frozen_models": GiB,
        "ema": GiB // 2,
    }
    total = sum(parts.values())
    steady = Predicted(
        **base,
        host_bytes=total,
        host_budget_bytes=64 * GiB,
        host_breakdown=parts,
        host_peak_phase="steady",
        host_phases={"steady": total, "loading": 12 * GiB},
    )
    assert host_line(steady) == (
        "host per node 39.00 GiB of 64.00 GiB: offloaded optimizer states 30.00, buffer slack 4.00, "
        "pinned buffers 3.50, other 1.50 GiB; model loading (before training) 12.00 GiB"
    )
    loading = Predicted(
        **base,
        host_bytes=12 * GiB,
        host_budget_bytes=64 * GiB,
        host_breakdown={"model_loading": 12 * GiB},
        host_peak_phase="loading",
        host_phases={"steady": 0, "loading": 12 * GiB},
    )
    assert host_line(loading) == (
        "host per node 12.00 GiB of 64.00 GiB while loading the models (before training): model loading 12.00 GiB"
    )


def test_predict_and_check_text_show_the_host_line(cli: Cli, tmp_path) -> None:
    import json

    out = cli(
        "predict", "--model", "opt-1.3b", "--gpu-mem", "80G", "--workload", "sft", "--gpus", "2", "--cpu-mem", "8G",
        "--strategy", json.dumps(OFFLOAD), "--db", tmp_path / "p.db",
    ).out  # fmt: skip
    line = next(text for text in out.splitlines() if text.startswith("host per node"))
    assert "of 8.00 GiB: offloaded optimizer states" in line and "model loading (before training)" in line
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    checked = cli(
        "check", path, "--model", "opt-1.3b", "--gpu-mem", "80G", "--gpus", "2", "--cpu-mem", "8G", "--json",
        "--db", tmp_path / "p.db",
    )  # fmt: skip
    assert checked.rc == 1
    reasons = checked.json()["reasons"]
    assert any("per node exceeds --cpu-mem" in r and "largest part: offloaded optimizer states" in r for r in reasons)

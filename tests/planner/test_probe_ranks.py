"""`planner probe --gpus N`: N ranks per probe on this node, the worst rank reported; multi-node plans
probed on one node, with a note; more ranks than the device has is one line of bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import CliResult, assert_one_error_line
from test_probe import TINY_LLAMA, _job

from store.measurements import PhaseMeasurement, ProbeRequest, ProbeResult

Cli = Callable[..., CliResult]
ZERO2 = [{"zero_stage": 2, "micro_batch": 2, "grad_accum": 1}]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


@pytest.fixture
def zero2(tmp_path: Path) -> Path:
    path = tmp_path / "zero2.json"
    path.write_text(json.dumps(ZERO2))
    return path


@pytest.mark.slow
def test_two_ranks_on_the_cpu_backend_report_world_size_and_worst_rank(
    cli: Cli, db: Path, tiny: Path, zero2: Path
) -> None:
    args = _job(tiny, "--workload", "sft", "--batch", "4", "--seq-len", "32", "--strategies", zero2, "--gpus", "2")
    first = cli("probe", *args, "--json", "--db", db)
    assert first.rc == 0, first.err
    report = first.json()
    assert report["world_size"] == 2 and report["hardware"]["gpus"] == 2 and report["notes"] == []
    (row,) = report["rows"]
    assert row["outcome"] == "ok", row["message"]
    assert row["world_size"] == 2 and row["worst_rank"] in (0, 1)
    assert [p["name"] for p in row["measured"]["phases"]] == ["forward", "backward", "optimizer_step"]
    assert abs(row["errors"]["peak_allocated"]) < 0.10  # ZeRO-2 over two ranks, as predicted

    human = cli("probe", *args, "--db", db)  # the stored probe: not run again
    assert human.rc == 0, human.err
    assert "stored" in human.out and "World size 2: each probe ran 2 ranks" in human.out
    assert f"rank {row['worst_rank']}" in human.out


def test_a_multi_node_plan_is_probed_on_one_node_and_the_report_says_so(db: Path, tiny: Path, zero2: Path) -> None:
    from planner import probe

    requests: list[ProbeRequest] = []

    def runner(request: ProbeRequest) -> ProbeResult:  # what the planner hands the probes is under test here
        requests.append(request)
        phase = PhaseMeasurement("backward", 1_000_000, 1_000_000, 0.1)
        ranks = [{"rank": r, "outcome": "ok"} for r in range(2)]
        return ProbeResult("ok", (phase,), extra={"world_size": 2, "worst_rank": 1, "ranks": ranks})

    report = probe(
        str(tiny), runner=runner, workload="sft", gpu_mem="24G", cpu_mem="64G", batch=12, seq_len=32, gpus=2,
        nodes=3, strategies=str(zero2), device="cpu", steps=2, db=str(db),
    )  # fmt: skip
    (request,) = requests
    assert request.hardware["gpus"] == 2 and request.hardware["nodes"] == 1
    assert request.workload["global_batch"] == 4  # 12 over 3 nodes: this node's share
    assert report.world_size == 2 and report.hardware["nodes"] == 1
    (note,) = report.notes
    assert "3 nodes x 2 GPUs (world size 6) is probed on one node" in note and "world size of 2" in note
    assert report.rows[0].worst_rank == 1 and report.rows[0].world_size == 2


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--gpus", "5"], "the CPU backend runs at most 4 ranks"),
        (["--gpus", "2", "--nodes", "2", "--batch", "6"], "--batch"),
    ],
)
def test_too_many_ranks_is_one_line(cli: Cli, db: Path, tiny: Path, extra: list[str], fragment: str) -> None:
    args = _job(tiny, "--workload", "sft", "--seq-len", "32", *extra)
    assert_one_error_line(cli("probe", *args, "--db", db), fragment)


def test_cuda_ranks_are_limited_to_the_devices_torch_sees(
    cli: Cli, db: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = ["--model", tiny, "--device", "cuda", "--gpu-mem", "24G", "--workload", "sft", "--seq-len", "32"]
    assert_one_error_line(cli("probe", *args, "--gpus", "2", "--db", db), "this machine has 1 CUDA device")


def test_probe_help_documents_gpus(cli: Cli) -> None:
    help_text = cli("probe", "--help").out
    assert "--gpus" in help_text and "worst rank" in help_text


def test_the_probe_key_includes_the_world_size() -> None:
    def key(gpus: int) -> str:
        workload = {"kind": "sft", "model": "gpt2", "seq_len": 8, "global_batch": 2 * gpus}
        hardware = {"gpu": "generic", "gpu_memory_bytes": 24 * 2**30, "gpus": gpus, "nodes": 1}
        return ProbeRequest(workload, {"zero_stage": 2, "micro_batch": 2}, hardware).key({"torch": "x"})

    assert len({key(1), key(2), key(4)}) == 3

"""The node is part of the target: host memory and the network between nodes come from the job (``--cpu-mem``,
``--inter-node-gbps``, ``--node``) or from the GPU's typical node, never from the machine that plans.

Old behaviour these catch (issue 32, item 1): ``--cpu-mem`` defaulted to the planning machine's RAM, so
opt-1.3b SFT on a 24G GPU got ZeRO-1 + LoRA on a 23.5 GiB laptop and ZeRO-3 + offload on a 128G one; the
network between nodes was a fixed 25 GB/s that no flag changed and no plan showed, so a 70B plan on 2 x 8
H100 predicted 121 s of collectives per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO, CliResult, assert_one_error_line

import planner.job.hardware as hardware
from planner import predict, recommend
from planner.job.hardware import FALLBACK_INTER_NODE_GBPS
from planner.job.inputs import JobSpec, job_fields, resolve
from store.errors import InputError
from store.gpus import get_gpu, gpu_names
from store.nodes import REFERENCE_NODES, get_node, least_host_memory_ratio, nodes, reference_node

Cli = Callable[..., CliResult]
GIB = 2**30
TIB = 2**40
SFT_24G: dict[str, Any] = {"gpu_mem": "24G", "workload": "sft"}
SEVENTY_B = "llama-3-70b"
TWO_DGX: dict[str, Any] = {"node": "dgx-h100", "nodes": 2, "workload": "sft"}
# The words that say where a hardware figure came from: a flag, a catalog, a datasheet, this machine, an assumption.
SOURCES = ("--cpu-mem", "--inter-node-gbps", "datasheet", "specifications", "catalog", "this machine", "assumed")
HARDWARE_READINGS = ("node:", "host memory", "between nodes", "GPU-to-GPU", "GPU rates")


def _machine_with(monkeypatch: pytest.MonkeyPatch, gib: int) -> None:
    monkeypatch.setattr(hardware, "host_memory_bytes", lambda: gib * GIB)


# --- (a) the planning machine's memory never stands in for the target's --------------------------------------


def test_the_same_job_gets_the_same_plan_on_any_planning_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = {}
    for gib in (8, 256):
        _machine_with(monkeypatch, gib)
        plans[gib] = recommend("opt-1.3b", save=False, **SFT_24G).model_dump()
    small, large = plans[8], plans[256]
    assert small["strategy"] == large["strategy"]
    assert small["hardware"] == large["hardware"]
    assert small["predicted"]["step_time_s"] == large["predicted"]["step_time_s"]
    assert small["readings"] == large["readings"]
    assert small["hardware"]["cpu_memory_bytes"] not in (8 * GIB, 256 * GIB)
    (host,) = [line for line in small["readings"] if line.startswith("host memory")]
    assert "assumed" in host and "not this machine's" in host and "--cpu-mem" in host


def test_a_probe_runs_here_so_its_host_memory_is_this_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine_with(monkeypatch, 8)
    spec = JobSpec(model="opt-125m", **SFT_24G)
    here = resolve(spec, local=True)
    assert here.hardware.cpu_memory_bytes == 8 * GIB
    assert any("this machine's, where the probes run" in line for line in here.readings)
    elsewhere = resolve(spec)
    assert elsewhere.hardware.cpu_memory_bytes != 8 * GIB
    with pytest.raises(InputError, match="--node"):
        resolve(replace(spec, node="dgx-h100"), local=True)


def test_the_assumed_host_memory_follows_the_gpus_typical_node() -> None:
    one = resolve(JobSpec(model="opt-125m", gpu="H100-80G", workload="sft")).hardware
    eight = resolve(JobSpec(model="opt-125m", gpu="H100-80G", gpus=8, workload="sft")).hardware
    assert eight.cpu_memory_bytes == get_node("dgx-h100").host_memory_bytes == 8 * one.cpu_memory_bytes
    ratio, least = least_host_memory_ratio()
    assert least.name == "p4de.24xlarge" and ratio == pytest.approx(1.8)
    generic = resolve(JobSpec(model="opt-125m", **SFT_24G)).hardware
    assert generic.cpu_memory_bytes == pytest.approx(1.8 * 24 * GIB, rel=1e-4)


# --- (b) the 70B two-node plan: the node's network and host memory ------------------------------------------------


@pytest.fixture(scope="module")
def seventy_b_on_two_dgx() -> dict[str, Any]:
    return recommend(SEVENTY_B, save=False, **TWO_DGX).model_dump()


def test_the_two_node_plan_uses_the_nodes_network_and_host_memory(seventy_b_on_two_dgx: dict[str, Any]) -> None:
    plan = seventy_b_on_two_dgx
    hardware = plan["hardware"]
    assert (hardware["gpu"], hardware["gpus"], hardware["nodes"]) == ("H100-80G", 8, 2)
    assert hardware["cpu_memory_bytes"] == 2 * TIB
    assert hardware["inter_node_gbps"] == 400 and hardware["node"] == "dgx-h100"
    readings = plan["readings"]
    assert any(line.startswith("host memory per node: 2.00 TiB (dgx-h100") for line in readings), readings
    assert any(line.startswith("between nodes: 400 GB/s per node") and "dgx-h100" in line for line in readings)
    assert plan["fits"]
    # the collectives cross the node's 400 GB/s links, not a 25 GB/s default: a sixteenth of that network's
    slow = predict(SEVENTY_B, plan["strategy"], inter_node_gbps=25, **TWO_DGX).predicted
    sixteenth = slow.time_terms["collectives"] / 16
    assert plan["predicted"]["time_terms"]["collectives"] == pytest.approx(sixteenth, rel=0.02)


def test_a_slower_network_costs_collectives_only(seventy_b_on_two_dgx: dict[str, Any]) -> None:
    strategy = seventy_b_on_two_dgx["strategy"]
    fast = predict(SEVENTY_B, strategy, **TWO_DGX).predicted
    slow = predict(SEVENTY_B, strategy, inter_node_gbps=25, **TWO_DGX).predicted
    assert slow.step_time_s > fast.step_time_s
    added = slow.step_time_s - fast.step_time_s
    assert slow.time_terms["collectives"] - fast.time_terms["collectives"] == pytest.approx(added, rel=1e-4)
    assert slow.time_breakdown["communication"] - fast.time_breakdown["communication"] == pytest.approx(added, rel=1e-4)
    for term in ("compute", "offload", "optimizer"):
        assert slow.time_breakdown[term] == fast.time_breakdown[term], term
    assert slow.peak_reserved_bytes == fast.peak_reserved_bytes


def test_the_two_node_plan_keeps_its_parameters_on_the_gpus(seventy_b_on_two_dgx: dict[str, Any]) -> None:
    """A 70B model cannot be built whole on one GPU: it is built under zero.Init (search.streams.init), so its
    16-bit partitions (8.8 GB a GPU on 16) stay on the GPUs instead of being offloaded."""
    assert seventy_b_on_two_dgx["strategy"]["offload_param"] == "none"


# --- (c) --node sets the GPU, GPUs per node, host memory and network; flags override it -----------------------


def test_the_node_sets_the_target() -> None:
    hardware = resolve(JobSpec(model="opt-125m", node="p4d.24xlarge", nodes=2, workload="sft")).hardware
    node = get_node("p4d.24xlarge")
    assert hardware.gpu.name == node.gpu == "A100-40G"
    assert hardware.gpus == 8 and hardware.cpu_memory_bytes == 1152 * GIB and hardware.inter_node_gbps == 50
    assert hardware.gpu.interconnect_gbps == node.intra_node_gbps
    assert get_node("AWS-P4D") is node and get_node("DGX_H100") is get_node("dgx-h100")  # aliases, any case


def test_explicit_flags_override_the_node() -> None:
    job = resolve(
        JobSpec(
            model="opt-125m",
            node="dgx-h100",
            gpu="H200",
            gpus=4,
            nodes=2,
            cpu_mem="512G",
            inter_node_gbps=100,
            workload="sft",
        )
    )
    hardware = job.hardware
    assert (hardware.gpu.name, hardware.gpus, hardware.cpu_memory_bytes) == ("H200", 4, 512 * GIB)
    assert hardware.inter_node_gbps == 100 and hardware.node == "dgx-h100"
    assert any("in place of dgx-h100's" in line and "--gpus 4" in line for line in job.readings)
    memory = resolve(JobSpec(model="opt-125m", node="dgx-h100", gpu_mem="40G", workload="sft")).hardware
    assert memory.gpu.name == "H100-80G" and memory.gpu_memory_bytes == 40 * GIB


def test_the_node_flags_on_the_command_line(cli: Cli, db: Path) -> None:
    doc = cli(
        "predict", "--model", "opt-125m", "--node", "dgx-a100", "--nodes", "2", "--inter-node-gbps", "150",
        "--workload", "sft", "--zero", "2", "--json", "--db", db,
    ).json()  # fmt: skip
    hardware = doc["hardware"]
    assert (hardware["gpu"], hardware["gpus"], hardware["node"], hardware["inter_node_gbps"]) == (
        "A100-80G",
        8,
        "dgx-a100",
        150,
    )
    assert hardware["cpu_memory_bytes"] == 2 * TIB


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--node", "dgx-h10"], ("unknown node", "dgx-h100")),
        (["--node", "workstation-4090", "--nodes", "2"], ("--inter-node-gbps",)),
        (["--node", "dgx-h100", "--gpus", "16"], ("--gpus 16", "8 GPUs")),
        (["--gpu", "H100-80G", "--nodes", "2", "--inter-node-gbps", "0"], ("--inter-node-gbps",)),
        (["--gpu", "H100-80G", "--nodes", "2", "--inter-node-gbps", "nan"], ("--inter-node-gbps",)),
    ],
)
def test_bad_node_input_is_one_line(cli: Cli, db: Path, args: list[str], fragments: tuple[str, ...]) -> None:
    result = cli("recommend", "--model", "opt-125m", "--workload", "sft", *args, "--db", db)
    assert_one_error_line(result, *fragments)


def test_a_probe_offers_no_node(cli: Cli) -> None:
    result = cli("probe", "--model", "opt-125m", "--node", "dgx-h100")
    assert result.rc == 2 and "--node" in result.err


# --- (d) every hardware figure says where it came from --------------------------------------------------------------


@pytest.mark.parametrize(
    "job",
    [
        SFT_24G,
        {"gpu": "H100-80G", "gpus": 8, "nodes": 2, "workload": "sft"},
        {"gpu": "L4", "gpus": 2, "nodes": 2, "workload": "sft"},
        {"gpu_mem": "48G", "gpus": 4, "nodes": 3, "workload": "sft"},
        {"node": "dgx-a100", "nodes": 4, "workload": "sft"},
        {"node": "workstation-4090", "workload": "sft"},
        {"gpu": "A100-40G", "gpus": 8, "nodes": 2, "cpu_mem": "1T", "inter_node_gbps": 100, "workload": "sft"},
    ],
    ids=["gpu-mem", "h100-2-nodes", "l4-2-nodes", "generic-3-nodes", "dgx-a100", "workstation", "flags"],
)
def test_every_hardware_reading_names_its_source(job: dict[str, Any]) -> None:
    resolved = resolve(JobSpec(model="opt-125m", **job))
    lines = [line for line in resolved.readings if line.startswith(HARDWARE_READINGS)]
    assert any(line.startswith("host memory") for line in lines)
    assert any(line.startswith("between nodes") for line in lines) == (resolved.hardware.nodes > 1)
    assert any(line.startswith("GPU-to-GPU") for line in lines) == (resolved.hardware.gpus > 1)
    for line in lines:
        assert any(source in line for source in SOURCES), line


def test_the_fallback_network_is_said_to_be_assumed() -> None:
    job = resolve(JobSpec(model="opt-125m", gpu="L4", nodes=2, workload="sft"))
    assert job.hardware.inter_node_gbps == FALLBACK_INTER_NODE_GBPS
    (line,) = [line for line in job.readings if line.startswith("between nodes")]
    assert "assumed" in line and "no node of L4" in line and "--inter-node-gbps" in line


# --- the catalog and what keeps it honest -----------------------------------------------------------------------------


def test_the_node_catalog_is_consistent() -> None:
    for node in nodes():
        assert node.gpu in gpu_names(), node.name
        assert get_gpu(node.gpu).name == node.gpu
        assert node.source and ":" in node.source, node.name  # a title, then the numbers it gives
        assert node.host_memory_bytes >= node.gpus_per_node * get_gpu(node.gpu).memory_bytes, node.name
        assert node.inter_node_gbps is None or 0 < node.inter_node_gbps <= 1000, node.name
    for gpu, name in REFERENCE_NODES.items():
        typical = reference_node(gpu)
        assert typical is not None and typical.name == name and typical.gpu == gpu


def test_docs_list_every_node_with_its_numbers() -> None:
    text = (REPO / "docs" / "jobs.md").read_text()
    table = text[text.index("## Target node") :]
    for node in nodes():
        row = next((line for line in table.splitlines() if line.startswith(f"| `{node.name}` |")), None)
        assert row is not None, node.name
        assert node.gpu in row and f"{node.intra_node_gbps:g}" in row, row
        assert (f"{node.inter_node_gbps:g}" if node.inter_node_gbps else "none") in row, row


def test_a_saved_plan_is_read_back_with_its_target() -> None:
    job = resolve(JobSpec(model="opt-125m", node="dgx-h100", nodes=2, workload="sft"))
    fields = job_fields(job.workload.to_dict(), job.hardware.to_dict())
    again = resolve(JobSpec(model="opt-125m", **fields)).hardware
    assert again == job.hardware
    old = job.hardware.to_dict()
    del old["inter_node_gbps"], old["node"]  # saved before the node catalog: made with the fallback network
    assert resolve(JobSpec(model="opt-125m", **job_fields(job.workload.to_dict(), old))).hardware.inter_node_gbps == 25


def test_the_host_memory_note_says_what_the_plan_needs() -> None:
    """It once said "94.16 GiB of host memory fits": four times the planning machine's, where 29 GiB was needed."""
    plan = recommend("opt-1.3b", save=False, cpu_mem="8G", **SFT_24G)
    (line,) = [s for s in plan.suggestions if "of host memory per node fits" in s]
    assert "(the job has 8.00 GiB)" in line and "32.00 GiB" not in line, line
    needed = float(line.split(" GiB", 1)[0])
    assert 8 < needed <= 32 and f"--cpu-mem {int(needed) + 1}G" in line, line

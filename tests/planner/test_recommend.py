"""``planner recommend --json``: the docs/contracts.md document, its invariants, size parsing, monotonicity, saving."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import (
    CPU_MEM,
    GIB,
    STRATEGY_KEYS,
    CliResult,
    check_ds_config_batch,
    check_predicted_block,
    fits_by_numbers,
)

Cli = Callable[..., CliResult]

TOP_KEYS = {"plan_id", "workload", "hardware", "strategy", "fits", "predicted", "ds_config", "alternatives"}
OFFLOADS = {"none", "cpu", "nvme"}
EMPTY_CACHE = {"never", "after-generation", "after-inference", "after-phase", "every-step"}
ALLOCATORS = {"default", "expandable-segments"}


def _check_strategy_shape(strategy: dict) -> None:
    assert set(strategy) == STRATEGY_KEYS
    assert strategy["zero_stage"] in (0, 1, 2, 3)
    assert strategy["offload_optimizer"] in OFFLOADS and strategy["offload_param"] in OFFLOADS
    assert isinstance(strategy["gradient_checkpointing"], bool)
    assert isinstance(strategy["lora_rank"], int) and strategy["lora_rank"] >= 0
    assert isinstance(strategy["micro_batch"], int) and strategy["micro_batch"] >= 1
    assert isinstance(strategy["grad_accum"], int) and strategy["grad_accum"] >= 1
    assert strategy["empty_cache"] in EMPTY_CACHE
    assert strategy["allocator"] in ALLOCATORS
    if strategy["offload_param"] != "none":
        assert strategy["zero_stage"] == 3


def test_document_has_the_design_keys(opt13_24g) -> None:
    doc = opt13_24g.doc
    assert set(doc) >= TOP_KEYS
    assert isinstance(doc["plan_id"], str) and doc["plan_id"]
    assert doc["workload"]["kind"] == "sft"
    assert doc["workload"]["model"] == "opt-1.3b"
    hardware = doc["hardware"]
    assert set(hardware) >= {"gpu", "gpu_memory_bytes", "gpus", "nodes", "cpu_memory_bytes"}
    assert isinstance(hardware["gpu"], str) and hardware["gpu"]
    assert hardware["gpu_memory_bytes"] == 24 * GIB
    assert hardware["cpu_memory_bytes"] == 64 * GIB
    assert (hardware["gpus"], hardware["nodes"]) == (1, 1)
    assert isinstance(doc["fits"], bool)
    _check_strategy_shape(doc["strategy"])
    assert isinstance(doc["ds_config"], dict) and "zero_optimization" in doc["ds_config"]
    assert isinstance(doc["alternatives"], list)
    for alt in doc["alternatives"]:
        assert set(alt) >= {"strategy", "predicted"}
        _check_strategy_shape(alt["strategy"])


def test_predicted_blocks_are_consistent(opt13_24g, nothing_fits) -> None:
    for rec in (opt13_24g, nothing_fits):
        doc = rec.doc
        check_predicted_block(doc["predicted"], doc["hardware"])
        assert doc["fits"] == fits_by_numbers(doc["predicted"], doc["hardware"])
        for alt in doc["alternatives"]:
            check_predicted_block(alt["predicted"], doc["hardware"])


def test_headline_job_fits(opt13_24g) -> None:
    # 1.3B parameters train on 24 GiB (ZeRO-Offload trains 13B on 32 GB): the plan must fit.
    doc = opt13_24g.doc
    assert doc["fits"] is True
    assert doc["predicted"]["peak_reserved_bytes"] <= doc["predicted"]["gpu_budget_bytes"] < 24 * GIB
    assert doc["predicted"]["host_bytes"] <= 64 * GIB


def test_chosen_is_fastest_and_alternatives_differ(opt13_24g) -> None:
    doc = opt13_24g.doc
    assert doc["alternatives"], "a 1.3B model on 24G has more than one strategy that fits"
    chosen = doc["predicted"]["step_time_s"]
    for alt in doc["alternatives"]:
        assert chosen <= alt["predicted"]["step_time_s"]
        assert alt["strategy"] != doc["strategy"]
    strategies = [tuple(sorted(a["strategy"].items())) for a in doc["alternatives"]]
    assert len(set(strategies)) == len(strategies)


def test_top_limits_the_alternatives(cli: Cli, db: Path) -> None:
    result = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G", *CPU_MEM, "--top", "1", "--json", "--db", db)
    assert result.rc == 0, result.err
    assert len(result.json()["alternatives"]) <= 1
    result = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G", *CPU_MEM, "--top", "0", "--json", "--db", db)
    assert result.json()["alternatives"] == []


def test_ds_config_matches_global_batch_and_strategy(opt13_24g) -> None:
    doc = opt13_24g.doc
    ds = doc["ds_config"]
    check_ds_config_batch(ds, doc["strategy"], doc)
    assert ds["zero_optimization"]["stage"] == doc["strategy"]["zero_stage"]
    offload = ds["zero_optimization"].get("offload_optimizer", {}).get("device", "none")
    assert offload == doc["strategy"]["offload_optimizer"]
    # bf16 is the default dtype (docs/contracts.md: --dtype bf16|fp16|fp32, default bf16 on GPUs that have it).
    assert doc["workload"]["dtype"] == "bf16"
    assert ds["bf16"]["enabled"] is True
    assert ds.get("fp16", {}).get("enabled", False) is False


def test_batch_splits_over_gpus_and_nodes(cli: Cli, db: Path) -> None:
    result = cli(
        "recommend",
        "--model",
        "opt-125m",
        "--gpu-mem",
        "24G",
        *CPU_MEM,
        "--gpus",
        "2",
        "--nodes",
        "2",
        "--batch",
        "32",
        "--json",
        "--db",
        db,
    )
    assert result.rc == 0, result.err
    doc = result.json()
    assert (doc["hardware"]["gpus"], doc["hardware"]["nodes"]) == (2, 2)
    assert doc["workload"]["global_batch"] == 32
    check_ds_config_batch(doc["ds_config"], doc["strategy"], doc)
    # 32 samples over 4 GPUs: 8 per GPU per optimizer step.
    assert doc["strategy"]["micro_batch"] * doc["strategy"]["grad_accum"] == 8
    for alt in doc["alternatives"]:
        assert alt["strategy"]["micro_batch"] * alt["strategy"]["grad_accum"] == 8


@pytest.mark.parametrize("spelling", ["24G", "24GB", "24GiB", "24576MiB", "25769803776", "24 GB", "24gib"])
def test_gpu_mem_spellings_mean_24_gib(cli: Cli, db: Path, spelling: str) -> None:
    result = cli("recommend", "--model", "opt-125m", "--gpu-mem", spelling, *CPU_MEM, "--json", "--db", db)
    assert result.rc == 0, result.err
    doc = result.json()
    assert doc["hardware"]["gpu_memory_bytes"] == 24 * 2**30
    # The output says how it read the number.
    assert any(spelling in line and str(24 * 2**30) in line for line in doc.get("readings", [])), doc.get("readings")


def test_same_memory_same_plan_whatever_the_spelling(cli: Cli, db: Path) -> None:
    docs = []
    for spelling in ("24G", "24576MiB", "25769803776"):
        result = cli("recommend", "--model", "opt-125m", "--gpu-mem", spelling, *CPU_MEM, "--json", "--db", db)
        docs.append(result.json())
    assert all(d["strategy"] == docs[0]["strategy"] for d in docs)
    assert all(d["predicted"] == docs[0]["predicted"] for d in docs)


def test_more_gpu_memory_never_slows_the_best_plan(cli: Cli, db: Path, opt13_24g) -> None:
    docs = {}
    for mem in ("16G", "80G"):
        result = cli("recommend", "--model", "opt-1.3b", "--gpu-mem", mem, *CPU_MEM, "--json", "--db", db)
        assert result.rc == 0, result.err
        docs[mem] = result.json()
    docs["24G"] = opt13_24g.doc
    times = [docs[m]["predicted"]["step_time_s"] for m in ("16G", "24G", "80G")]
    fits = [docs[m]["fits"] for m in ("16G", "24G", "80G")]
    assert fits == [True, True, True]
    assert times[0] >= times[1] >= times[2]
    # 80 GiB holds 1.3B params with plain Adam states (16 bytes each, ~21 GiB) and activations: no offload,
    # so it is strictly faster than any plan on 16 GiB, which cannot hold the states on the GPU.
    assert docs["80G"]["strategy"]["offload_optimizer"] == "none"
    assert times[2] < times[0]


def test_plan_is_saved_and_listed(cli: Cli, opt13_24g) -> None:
    listed = cli("plans", "--json", "--db", opt13_24g.db)
    assert listed.rc == 0, listed.err
    documents = listed.json()
    ids = [d["plan_id"] for d in documents]
    assert opt13_24g.doc["plan_id"] in ids
    saved = documents[ids.index(opt13_24g.doc["plan_id"])]
    assert saved == opt13_24g.doc
    table = cli("plans", "--db", opt13_24g.db)
    assert table.rc == 0 and opt13_24g.doc["plan_id"] in table.out
    shown = cli("explain", opt13_24g.doc["plan_id"], "--db", opt13_24g.db)
    assert shown.rc == 0 and shown.json() == opt13_24g.doc


def test_same_inputs_give_the_same_plan(cli: Cli, opt13_24g) -> None:
    again = cli("recommend", *opt13_24g.args, "--json", "--db", opt13_24g.db)
    assert again.rc == 0, again.err
    doc = again.json()
    assert doc["plan_id"] != opt13_24g.doc["plan_id"], "each recommend saves a new plan"
    for key in ("strategy", "predicted", "ds_config", "fits", "alternatives"):
        assert doc[key] == opt13_24g.doc[key], key


def test_without_db_flag_the_plan_goes_to_planner_db(cli: Cli, tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "from_env.db"
    monkeypatch.setenv("PLANNER_DB", str(target))
    result = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G", *CPU_MEM, "--json")
    assert result.rc == 0, result.err
    assert target.is_file()
    listed = cli("plans", "--json", "--db", target)
    assert [d["plan_id"] for d in listed.json()] == [result.json()["plan_id"]]


def test_human_output_names_the_plan(cli: Cli, db: Path) -> None:
    result = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G", *CPU_MEM, "--db", db)
    assert result.rc == 0, result.err
    plan_id = cli("plans", "--json", "--db", db).json()[0]["plan_id"]
    assert plan_id in result.out
    assert "ZeRO-" in result.out


def test_catalog_gpu_sets_the_memory(cli: Cli, db: Path) -> None:
    result = cli("recommend", "--model", "opt-125m", "--gpu", "A100-80G", *CPU_MEM, "--json", "--db", db)
    assert result.rc == 0, result.err
    hardware = result.json()["hardware"]
    assert hardware["gpu"] == "A100-80G" and hardware["gpu_memory_bytes"] == 80 * GIB
    # --gpu-mem wins over the catalog's memory (a MIG slice, say); the GPU's rates stay.
    both = cli(
        "recommend", "--model", "opt-125m", "--gpu", "A100-80G", "--gpu-mem", "20G", *CPU_MEM, "--json", "--db", db
    )
    hardware = both.json()["hardware"]
    assert hardware["gpu"] == "A100-80G" and hardware["gpu_memory_bytes"] == 20 * GIB


def test_gpu_without_bf16_defaults_to_fp16(cli: Cli, db: Path) -> None:
    # V100s have no bf16: the default dtype falls back to fp16 and the config enables fp16 loss scaling.
    result = cli("recommend", "--model", "opt-125m", "--gpu", "V100-32G", *CPU_MEM, "--json", "--db", db)
    assert result.rc == 0, result.err
    doc = result.json()
    assert doc["workload"]["dtype"] == "fp16"
    assert doc["ds_config"]["fp16"]["enabled"] is True
    assert doc["ds_config"].get("bf16", {}).get("enabled", False) is False


def test_the_reserved_spread_is_kept_free_beyond_usable_memory(cli: Cli, opt13_24g, nothing_fits) -> None:
    """Usable memory leaves room for peak reserved x (1 + spread) beside the CUDA context, so a plan that fits
    has its spread kept free; the table says so (it once said the headroom did not cover it)."""
    from search import DEFAULT_COEFFICIENTS

    predicted = opt13_24g.doc["predicted"]
    spread = predicted["reserved_uncertainty"]
    assert spread > 0
    device = opt13_24g.doc["hardware"]["gpu_memory_bytes"] - DEFAULT_COEFFICIENTS.cuda_context_bytes
    assert predicted["peak_reserved_bytes"] * (1 + spread) <= device
    shown = cli("recommend", *opt13_24g.args, "--db", opt13_24g.db)
    assert shown.rc == 0, shown.err
    row = next(line for line in shown.out.splitlines() if "reserved spread" in line)
    assert "kept free beyond usable" in row
    over = cli("recommend", *nothing_fits.args, "--db", nothing_fits.db)
    assert over.rc == 1, over.err  # nothing fits
    row = next(line for line in over.out.splitlines() if "reserved spread" in line)
    assert "not kept: over usable" in row

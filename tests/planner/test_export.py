"""``planner export``: which plan, overwriting, the settings outside the config, bad output paths.

THE headline: the config exported for ``recommend --model opt-1.3b --gpu-mem 24G --workload sft`` is
accepted by DeepSpeed's own ``DeepSpeedConfig``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from planner_helpers import CPU_MEM, CliResult, assert_one_error_line, run_main

Cli = Callable[..., CliResult]


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_headline_export_is_accepted_by_deepspeed(cli: Cli, db: Path, tmp_path: Path, deepspeed_config) -> None:
    result = cli(
        "recommend", "--model", "opt-1.3b", "--gpu-mem", "24G", "--workload", "sft", "--json", *CPU_MEM, "--db", db
    )
    assert result.rc == 0, result.err
    doc = result.json()
    out = tmp_path / "ds_config.json"
    exported = cli("export", "-o", out, "--db", db)
    assert exported.rc == 0, exported.err
    assert json.loads(out.read_text()) == doc["ds_config"]

    ds = deepspeed_config(out)  # raises on any key or value DeepSpeed does not accept
    strategy = doc["strategy"]
    assert ds.train_batch_size == doc["workload"]["global_batch"]
    assert ds.train_micro_batch_size_per_gpu == strategy["micro_batch"]
    assert ds.gradient_accumulation_steps == strategy["grad_accum"]
    assert ds.zero_optimization_stage == strategy["zero_stage"]
    assert ds.bfloat16_config.enabled is True
    assert ds.float16_config.enabled is False
    device = ds.zero_config.offload_optimizer.device if ds.zero_config.offload_optimizer else "none"
    assert str(getattr(device, "value", device)) == strategy["offload_optimizer"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--zero", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu", "--grad-ckpt"],
        ["--zero", "2", "--dtype", "fp16", "--micro-batch", "2"],
        ["--zero", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme", "--nvme-path", "/local_nvme"],
        ["--zero", "0", "--dtype", "fp32"],
    ],
    ids=["zero3-offload-cpu", "zero2-fp16", "zero3-nvme", "zero0-fp32"],
)
def test_predicted_configs_are_accepted_by_deepspeed(cli: Cli, deepspeed_config, flags: list[str]) -> None:
    result = cli("predict", "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, *flags, "--json")
    assert result.rc == 0, result.err
    doc = result.json()
    ds = deepspeed_config(doc["ds_config"])
    assert ds.zero_optimization_stage == doc["strategy"]["zero_stage"]
    assert ds.train_batch_size == doc["workload"]["global_batch"]
    assert ds.float16_config.enabled == (doc["workload"]["dtype"] == "fp16")
    assert ds.bfloat16_config.enabled == (doc["workload"]["dtype"] == "bf16")


@dataclass(frozen=True)
class TwoPlans:
    db: Path
    first: dict
    second: dict


@pytest.fixture(scope="module")
def two_plans(tmp_path_factory: pytest.TempPathFactory) -> TwoPlans:
    """Two saved plans that differ by their global batch (8, then 16): train_batch_size tells them apart."""
    db = tmp_path_factory.mktemp("two") / "plans.db"
    docs = []
    for batch in ("8", "16"):
        result = run_main(
            ["recommend", "--model", "opt-125m", "--gpu-mem", "24G", *CPU_MEM, "--batch", batch, "--json", "--db", db]
        )
        assert result.rc == 0, result.err
        docs.append(result.json())
    return TwoPlans(db, docs[0], docs[1])


def test_export_defaults_to_the_latest_plan(cli: Cli, two_plans: TwoPlans, tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    result = cli("export", "-o", out, "--db", two_plans.db)
    assert result.rc == 0, result.err
    written = json.loads(out.read_text())
    assert written == two_plans.second["ds_config"]
    assert written["train_batch_size"] == 16
    assert two_plans.second["plan_id"] in result.out


def test_export_by_id_and_by_unique_prefix(cli: Cli, two_plans: TwoPlans, tmp_path: Path) -> None:
    first_id, second_id = two_plans.first["plan_id"], two_plans.second["plan_id"]
    length = 4
    while second_id.startswith(first_id[:length]):
        length += 1
    for i, given in enumerate((first_id, first_id[:length], first_id.upper())):
        out = tmp_path / f"by_id_{i}.json"
        result = cli("export", given, "-o", out, "--db", two_plans.db)
        assert result.rc == 0, (given, result.err)
        written = json.loads(out.read_text())
        assert written == two_plans.first["ds_config"]
        assert written["train_batch_size"] == 8


def test_export_unknown_or_too_short_id(cli: Cli, two_plans: TwoPlans, tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    unknown = "g" * 12  # plan ids are hex: no plan starts with g
    assert_one_error_line(cli("export", unknown, "-o", out, "--db", two_plans.db))
    assert_one_error_line(cli("export", two_plans.first["plan_id"][:2], "-o", out, "--db", two_plans.db))
    assert not out.exists()


def test_export_refuses_to_overwrite_without_force(cli: Cli, two_plans: TwoPlans, tmp_path: Path) -> None:
    out = tmp_path / "ds_config.json"
    out.write_text("keep me\n")
    result = cli("export", "-o", out, "--db", two_plans.db)
    assert_one_error_line(result, "--force")
    assert out.read_text() == "keep me\n"
    assert _listing(tmp_path) == ["ds_config.json"]

    forced = cli("export", "-o", out, "--force", "--db", two_plans.db)
    assert forced.rc == 0, forced.err
    assert json.loads(out.read_text()) == two_plans.second["ds_config"]
    assert _listing(tmp_path) == ["ds_config.json"]


@pytest.mark.parametrize("which", ["opt13_24g", "nothing_fits"])
def test_export_prints_the_outside_settings(cli: Cli, tmp_path: Path, request, which: str) -> None:
    rec = request.getfixturevalue(which)
    doc = rec.doc
    out = tmp_path / "ds.json"
    result = cli("export", doc["plan_id"], "-o", out, "--db", rec.db)
    assert result.rc == 0, result.err
    outside = doc["outside_settings"]
    assert {"gradient_checkpointing", "empty_cache", "PYTORCH_CUDA_ALLOC_CONF"} <= set(outside)
    for name, text in outside.items():
        assert name in result.out
        if text:
            assert text in result.out
    expandable = doc["strategy"]["allocator"] == "expandable-segments"
    assert ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in result.out) == expandable
    # None of these are DeepSpeed keys: the file holds the DeepSpeed config only.
    written = json.loads(out.read_text())
    assert written == doc["ds_config"]
    assert not {"gradient_checkpointing", "empty_cache", "PYTORCH_CUDA_ALLOC_CONF", "lora"} & set(written)


def test_export_into_missing_folder(cli: Cli, two_plans: TwoPlans, tmp_path: Path) -> None:
    before = _listing(tmp_path)
    out = tmp_path / "missing" / "ds_config.json"
    assert_one_error_line(cli("export", "-o", out, "--db", two_plans.db))
    assert not out.parent.exists()
    assert _listing(tmp_path) == before


def test_export_onto_a_directory(cli: Cli, two_plans: TwoPlans, tmp_path: Path) -> None:
    folder = tmp_path / "a_folder"
    folder.mkdir()
    before = _listing(tmp_path)
    for force in ([], ["--force"]):
        assert_one_error_line(cli("export", "-o", folder, *force, "--db", two_plans.db))
        assert folder.is_dir() and _listing(folder) == []
        assert _listing(tmp_path) == before


def test_export_below_a_file(cli: Cli, two_plans: TwoPlans, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert_one_error_line(cli("export", "-o", blocker / "ds.json", "--db", two_plans.db))
    assert blocker.read_text() == "x"
    assert _listing(tmp_path) == ["a_file"]


def test_export_with_no_plans_yet(cli: Cli, db: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds.json"
    assert_one_error_line(cli("export", "-o", out, "--db", db), "no plans")
    assert not out.exists()

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
    assert _listing(tmp_path) == ["ds_config.json", "ds_config.memplan.json"]  # the settings outside it beside it


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


# --- export --format: the frameworks' files (launch.frameworks) -------------------------------------------


@dataclass(frozen=True)
class FormatPlans:
    db: Path
    grpo: str  # GRPO with a colocated vLLM rollout
    sft: str


@pytest.fixture(scope="module")
def format_plans(tmp_path_factory: pytest.TempPathFactory) -> FormatPlans:
    """Plans saved through the API: GRPO with a vLLM rollout (the search does not choose engines yet), and SFT."""
    from planner import predict
    from planner.planning.saved import save_plan
    from planner.report.results import Plan

    db = tmp_path_factory.mktemp("formats") / "plans.db"
    job = {"gpu_mem": "24G", "cpu_mem": "64G", "batch": 16}
    rollout = {"engine": "vllm", "gpu_memory_utilization": 0.4, "sleep_level": 1}
    grpo = predict(
        "opt-125m",
        workload="grpo",
        prompt_len=128,
        gen_len=128,
        strategy={"actor": {"zero_stage": 2}, "hybrid_engine": False, "rollout": rollout, "micro_batch": 2},
        **job,
    )
    sft = predict("opt-125m", workload="sft", seq_len=512, strategy={"zero_stage": 3, "micro_batch": 4}, **job)
    ids = [save_plan(Plan(**report.model_dump()), str(db)).plan_id for report in (grpo, sft)]
    assert all(ids)
    return FormatPlans(db, str(ids[0]), str(ids[1]))


@pytest.mark.parametrize("fmt,files", [("openrlhf", ["run_openrlhf.sh"]), ("verl", ["run_verl.sh"])])
def test_export_rlhf_script_formats(cli: Cli, format_plans: FormatPlans, tmp_path: Path, fmt: str, files) -> None:
    out = tmp_path / files[0]
    result = cli("export", format_plans.grpo, "--format", fmt, "-o", out, "--db", format_plans.db)
    assert result.rc == 0, result.err
    assert _listing(tmp_path) == files and f"wrote {out}" in result.out
    text = out.read_text()
    assert "Not expressible" in result.out  # the plan's empty_cache after-generation at least
    for line in result.out.splitlines():
        if line.startswith("  - "):
            assert f"# - {line[4:]}" in text  # each printed gap is also in the script
    assert '"${ACTOR_MODEL:?' in text
    engine = "--vllm.gpu_memory_utilization 0.4" if fmt == "openrlhf" else "rollout.gpu_memory_utilization=0.4"
    assert engine in text


def test_export_trl_writes_python_yaml_and_ds_config(cli: Cli, format_plans: FormatPlans, tmp_path: Path) -> None:
    import ast

    import yaml

    out = tmp_path / "grpo.py"
    result = cli("export", format_plans.grpo, "--format", "trl", "-o", out, "--db", format_plans.db)
    assert result.rc == 0, result.err
    assert _listing(tmp_path) == ["grpo.ds_config.json", "grpo.py", "grpo.yaml"]
    ast.parse(out.read_text())
    config = yaml.safe_load((tmp_path / "grpo.yaml").read_text())
    assert config["use_vllm"] is True and config["vllm_mode"] == "colocate" and config["num_generations"] >= 2
    assert config["deepspeed"] == str(tmp_path / "grpo.ds_config.json")
    assert json.loads((tmp_path / "grpo.ds_config.json").read_text())["train_batch_size"] == "auto"
    assert "level 2" in result.out  # TRL sleeps vLLM at level 2, the plan asks for 1


@pytest.mark.parametrize("fmt", ["hf", "accelerate", "trl"])
def test_export_single_model_formats(cli: Cli, format_plans: FormatPlans, tmp_path: Path, fmt: str) -> None:
    result = cli("export", format_plans.sft, "--format", fmt, "-o", tmp_path / "job.x", "--db", format_plans.db)
    assert result.rc == 0, result.err
    assert len(_listing(tmp_path)) >= 2  # the framework's file and the DeepSpeed config it points at
    configs = [json.loads(p.read_text()) for p in tmp_path.iterdir() if p.read_text().startswith("{")]
    assert [c["zero_optimization"]["stage"] for c in configs] == [3]  # hf: job.x itself; others: job.ds_config.json


def test_export_format_errors_are_one_line(cli: Cli, format_plans: FormatPlans, tmp_path: Path) -> None:
    out = tmp_path / "x"
    db = format_plans.db
    assert_one_error_line(cli("export", format_plans.grpo, "--format", "yaml", "-o", out, "--db", db), "--format")
    assert_one_error_line(cli("export", format_plans.grpo, "--format", "hf", "-o", out, "--db", db), "single-model")
    assert_one_error_line(cli("export", format_plans.sft, "--format", "verl", "-o", out, "--db", db), "RLHF plans")
    assert _listing(tmp_path) == []


def test_export_format_refuses_to_overwrite_any_file(cli: Cli, format_plans: FormatPlans, tmp_path: Path) -> None:
    companion = tmp_path / "cfg.yaml"
    companion.write_text("keep me\n")
    result = cli("export", format_plans.grpo, "--format", "trl", "-o", tmp_path / "cfg.py", "--db", format_plans.db)
    assert_one_error_line(result, "--force")
    assert _listing(tmp_path) == ["cfg.yaml"] and companion.read_text() == "keep me\n"
    forced = cli(
        "export", format_plans.grpo, "--format", "trl", "-o", tmp_path / "cfg.py", "-f", "--db", format_plans.db
    )
    assert forced.rc == 0, forced.err
    assert _listing(tmp_path) == ["cfg.ds_config.json", "cfg.py", "cfg.yaml"] and "keep me" not in companion.read_text()


def test_export_api_format_argument(format_plans: FormatPlans, tmp_path: Path, monkeypatch) -> None:
    from planner import export

    monkeypatch.chdir(tmp_path)
    paths, document = export(format_plans.sft, db=str(format_plans.db))  # old call: the DeepSpeed config
    assert paths == [Path("ds_config.json"), Path("ds_config.memplan.json")] and "export" not in document
    paths, document = export(format_plans.grpo, db=str(format_plans.db), format="openrlhf")
    assert paths == [Path("run_openrlhf.sh")] and document["export"]["format"] == "openrlhf"
    assert document["plan_id"] == format_plans.grpo and document["export"]["gaps"]


def test_export_writes_the_settings_outside_the_config_beside_it(cli: Cli, db: Path, tmp_path: Path) -> None:
    """A single-model plan's export carries its knobs outside DeepSpeed's keys in ``<stem>.memplan.json``; an RLHF
    plan's per-model configs get none (``check`` reads single-model configs)."""
    job = ("--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G")
    sft = cli("recommend", *job, "--workload", "sft", "--lora-rank", "8", "--json", "--db", db)
    assert sft.rc == 0, sft.err
    doc = sft.json()
    out = tmp_path / "sft.json"
    exported = cli("export", doc["plan_id"], "-o", out, "--db", db)
    assert exported.rc == 0, exported.err
    sidecar = tmp_path / "sft.memplan.json"
    assert f"wrote {sidecar}" in exported.out
    written = json.loads(sidecar.read_text())
    assert written["plan_id"] == doc["plan_id"] and written["config"] == "sft.json"
    strategy = doc["strategy"]
    assert written["settings"] == {
        "gradient_checkpointing": strategy["gradient_checkpointing"],
        "lora_rank": 8,
        "empty_cache": strategy["empty_cache"],
        "allocator": strategy["allocator"],
        "loss": strategy.get("loss", "hf"),
        "quantization": strategy.get("quantization", "none"),
    }
    assert json.loads(out.read_text()) == doc["ds_config"]  # the DeepSpeed config itself is unchanged

    ppo = cli("recommend", *job, "--workload", "ppo", "--json", "--db", db)
    assert ppo.rc == 0, ppo.err
    assert ppo.json()["workload"]["kind"] == "ppo"
    rlhf = tmp_path / "rlhf"
    rlhf.mkdir()
    assert cli("export", ppo.json()["plan_id"], "-o", rlhf / "ds.json", "--db", db).rc == 0
    assert not [p.name for p in rlhf.iterdir() if "memplan" in p.name]

"""The Python API: ``from planner import recommend, predict, check``; pydantic results equal to the --json documents."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import CPU_MEM, CliResult
from pydantic import BaseModel

Cli = Callable[..., CliResult]
JOB = {"gpu_mem": "24G", "workload": "sft", "cpu_mem": "64G"}


@pytest.fixture(scope="module")
def api_plan(tmp_path_factory: pytest.TempPathFactory):
    from planner import recommend

    db = tmp_path_factory.mktemp("api") / "plans.db"
    return recommend("opt-1.3b", db=str(db), **JOB), db


def test_public_names() -> None:
    import planner

    for name in ("recommend", "predict", "check"):
        assert callable(getattr(planner, name)), name
        assert name in getattr(planner, "__all__", [name])
    from planner import check, predict, recommend  # noqa: F401


def test_recommend_returns_the_json_document(cli: Cli, api_plan, opt13_24g) -> None:
    plan, db = api_plan
    assert isinstance(plan, BaseModel)
    dumped = plan.model_dump()
    assert isinstance(dumped["plan_id"], str) and dumped["plan_id"]
    # Same inputs through the CLI (opt13_24g: --model opt-1.3b --gpu-mem 24G --workload sft --cpu-mem 64G).
    cli_doc = dict(opt13_24g.doc)
    assert dumped["plan_id"] != cli_doc["plan_id"]
    dumped.pop("plan_id")
    cli_doc.pop("plan_id")
    assert dumped == cli_doc
    assert json.loads(json.dumps(plan.model_dump())) == plan.model_dump()  # plain JSON types only
    # The API saved its plan too.
    listed = cli("plans", "--json", "--db", db).json()
    assert [d["plan_id"] for d in listed] == [plan.plan_id]


def test_plan_exposes_ds_config_and_predicted(api_plan, opt13_24g) -> None:
    plan, _ = api_plan
    assert plan.ds_config == opt13_24g.doc["ds_config"]
    assert plan.strategy == opt13_24g.doc["strategy"]
    assert plan.predicted.peak_reserved_bytes == opt13_24g.doc["predicted"]["peak_reserved_bytes"]
    assert plan.fits is True


def test_predict_returns_the_json_document(cli: Cli, api_plan) -> None:
    from planner import predict

    plan, _ = api_plan
    report = predict("opt-1.3b", plan.strategy, **JOB)
    assert isinstance(report, BaseModel)
    assert report.predicted == plan.predicted
    cli_doc = cli(
        "predict",
        "--model",
        "opt-1.3b",
        "--gpu-mem",
        "24G",
        *CPU_MEM,
        "--strategy",
        json.dumps(plan.strategy),
        "--json",
    ).json()
    assert report.model_dump() == cli_doc


def test_check_returns_the_json_document(cli: Cli, api_plan, tmp_path: Path) -> None:
    from planner import check

    plan, _ = api_plan
    result = check(plan.ds_config, "opt-1.3b", **JOB)
    assert isinstance(result, BaseModel)
    assert result.fits is True
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(plan.ds_config))
    from_file = check(path, "opt-1.3b", **JOB)
    assert from_file.model_dump() == result.model_dump()
    cli_doc = cli("check", path, "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, "--json").json()
    assert result.model_dump() == cli_doc
    small = check(plan.ds_config, "opt-1.3b", **{**JOB, "gpu_mem": "4G"})
    assert small.fits is False and small.reasons


def test_save_is_atomic_and_refuses_to_overwrite(api_plan, tmp_path: Path) -> None:
    from store.errors import InputError

    plan, _ = api_plan
    target = tmp_path / "ds_config.json"
    written = plan.save(target)
    assert written == [target]
    assert json.loads(target.read_text()) == plan.ds_config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds_config.json"]  # no temporary file left

    target.write_text("mine\n")
    with pytest.raises(InputError):
        plan.save(target)
    assert target.read_text() == "mine\n"
    plan.save(target, force=True)
    assert json.loads(target.read_text()) == plan.ds_config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds_config.json"]

    with pytest.raises(InputError):
        plan.save(tmp_path / "missing" / "ds.json")
    with pytest.raises(InputError):
        plan.save(tmp_path)  # a folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds_config.json"]


def test_bad_input_raises_input_error(tmp_path: Path) -> None:
    from planner import predict, recommend
    from store.errors import InputError

    with pytest.raises(InputError, match="--gpu"):
        recommend("opt-1.3b", cpu_mem="64G", db=str(tmp_path / "p.db"))
    with pytest.raises(InputError):
        recommend("opt-1.3b", gpu_mem="lots", cpu_mem="64G", db=str(tmp_path / "p.db"))
    with pytest.raises(InputError, match="offload_param"):
        predict("opt-1.3b", {"zero_stage": 2, "offload_optimizer": "cpu", "offload_param": "cpu"}, **JOB)
    assert issubclass(InputError, ValueError)


def test_recommend_without_saving(tmp_path: Path) -> None:
    from planner import recommend

    db = tmp_path / "never.db"
    plan = recommend("opt-125m", db=str(db), save=False, **JOB)
    assert plan.plan_id is None
    assert not db.exists()

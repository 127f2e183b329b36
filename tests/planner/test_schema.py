"""The versioned JSON Schemas of the ``--json`` documents (``planner/schema/*.schema.json``).

The committed schemas are the ones the result models generate (a changed field fails here until
``python -m planner.schema --write``), and real documents of ``recommend``, ``predict`` and ``check``, single-model
and RLHF, validate against them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from planner_helpers import CliResult

from planner.report.results import SCHEMA_VERSION
from planner.schema import DOCUMENTS, committed_schema, generated_schema, render, schema_path, stale

Cli = Callable[..., CliResult]
HOST = ("--cpu-mem", "64G")


def _validate(name: str, document: dict[str, Any]) -> None:
    schema = committed_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(document)


def _invalid(name: str, document: dict[str, Any]) -> bool:
    return not jsonschema.Draft202012Validator(committed_schema(name)).is_valid(document)


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_the_committed_schema_is_the_generated_one(name: str) -> None:
    path = schema_path(name)
    assert path.is_file(), f"{path} is missing: run python -m planner.schema --write"
    assert path.read_text(encoding="utf-8") == render(generated_schema(name)), (
        f"{path.name} is stale: run python -m planner.schema --write (and bump SCHEMA_VERSION in "
        "planner/report/versioned.py when a field was removed, renamed or changed meaning)"
    )
    schema = committed_schema(name)
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert "schema_version" in schema["required"]
    assert schema["$id"].endswith(f":v{SCHEMA_VERSION}")
    assert stale() == []


def test_the_module_checks_and_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.schema as schemas
    from planner.schema.__main__ import main

    assert main([]) == 0
    monkeypatch.setattr(schemas, "SCHEMA_DIR", tmp_path)
    assert main([]) == 1  # nothing committed there yet
    assert main(["--write"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.schema.json" for name in DOCUMENTS)
    assert main([]) == 0


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Real documents of the CLI: recommend and predict for sft and ppo, check of the sft plan's export."""
    from planner_helpers import run_main

    folder = tmp_path_factory.mktemp("schema")
    db = str(folder / "plans.db")
    docs: dict[str, dict[str, Any]] = {}

    def run(*args: str) -> dict[str, Any]:
        result = run_main([*args, "--json"])
        assert result.rc in (0, 1), result.err
        return result.json()

    sft = ("--model", "opt-125m", "--gpu-mem", "24G", *HOST, "--workload", "sft")
    ppo = ("--model", "opt-125m", "--gpu-mem", "24G", *HOST, "--workload", "ppo")
    docs["plan-sft"] = run("recommend", *sft, "--lora-rank", "8", "--db", db)
    docs["plan-ppo"] = run("recommend", *ppo, "--db", db)
    docs["prediction-sft"] = run("predict", *sft, "--zero", "2", "--grad-ckpt", "--micro-batch", "4")
    docs["prediction-ppo"] = run("predict", *ppo, "--strategy", json.dumps(docs["plan-ppo"]["strategy"]))
    config = folder / "ds_config.json"
    exported = run_main(["export", docs["plan-sft"]["plan_id"], "-o", str(config), "--db", db])
    assert exported.rc == 0, exported.err
    docs["check-sft"] = run("check", str(config), *sft, "--db", db)
    return docs


@pytest.mark.parametrize("which", ["plan-sft", "plan-ppo", "prediction-sft", "prediction-ppo", "check-sft"])
def test_real_documents_validate(documents: dict[str, dict[str, Any]], which: str) -> None:
    document = documents[which]
    name = which.split("-")[0]
    assert document["schema_version"] == SCHEMA_VERSION
    _validate(name, document)
    if name == "check":
        assert document["report"]["strategy"]["lora_rank"] == 8  # from the export's settings file
        return
    rlhf = document["workload"]["kind"] == "ppo"
    assert ("ds_configs" in document, "ds_config" in document) == (rlhf, not rlhf)


def test_a_plan_where_nothing_fits_validates(nothing_fits) -> None:
    assert nothing_fits.doc["fits"] is False
    _validate("plan", nothing_fits.doc)


def test_one_config_key_by_workload(documents: dict[str, dict[str, Any]]) -> None:
    """The schema says which config key a document has: ``ds_config`` (single-model) or ``ds_configs`` (RLHF)."""
    sft, ppo = documents["plan-sft"], documents["plan-ppo"]
    swapped = copy.deepcopy(sft)
    swapped["ds_configs"] = {"actor": swapped.pop("ds_config")}
    assert _invalid("plan", swapped)  # a single-model workload with per-model configs
    both = copy.deepcopy(ppo)
    both["ds_config"] = {}
    assert _invalid("plan", both)
    neither = copy.deepcopy(ppo)
    neither.pop("ds_configs")
    assert _invalid("plan", neither)
    wrong_kind = copy.deepcopy(ppo)
    wrong_kind["workload"]["kind"] = "sft"
    assert _invalid("plan", wrong_kind)
    old = copy.deepcopy(sft)
    old["schema_version"] = "0"
    assert _invalid("plan", old)
    old.pop("schema_version")
    assert _invalid("plan", old)
    check = copy.deepcopy(documents["check-sft"])
    check["report"]["ds_configs"] = {"actor": check["report"]["ds_config"]}
    assert _invalid("check", check)


def test_a_saved_plan_reads_back_as_the_current_version(documents: dict[str, dict[str, Any]]) -> None:
    """A document saved before ``schema_version`` (or under another) is the current version once read as a Plan."""
    from planner.report.results import Plan

    saved = copy.deepcopy(documents["plan-sft"])
    saved.pop("schema_version")
    assert Plan(**saved).model_dump()["schema_version"] == SCHEMA_VERSION
    saved["schema_version"] = "0"
    assert Plan(**saved).model_dump() == documents["plan-sft"]

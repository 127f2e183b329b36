"""Each closed set is declared once (``store.choices``): the CLI's choices, the JSON Schemas' enum lists and the
values the store accepts all read it, and a member is the plain string the documents hold."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import pytest
import typer

from planner.cli import app
from planner.cli.choices import AUTO
from planner.schema import DOCUMENTS, committed_schema
from search.choose.rollout_space import ROLLOUT_FAMILIES
from store import frameworks, phases, quantization, records, rollout
from store.choices import (
    AllocatorSetting,
    EmptyCachePolicyName,
    Framework,
    OffloadDevice,
    Phase,
    Quantization,
    RolloutEngine,
)
from store.errors import InputError

# What the store accepts of each set, by the names its modules export.
STORE_SETS: list[tuple[type[StrEnum], object]] = [
    (OffloadDevice, records.OFFLOADS),
    (EmptyCachePolicyName, records.EMPTY_CACHE_POLICIES),
    (EmptyCachePolicyName, tuple(phases.EMPTY_CACHE_AFTER)),
    (AllocatorSetting, records.ALLOCATORS),
    (Quantization, quantization.QUANTIZATIONS),
    (Framework, frameworks.FRAMEWORKS),
    (Framework, tuple(frameworks.WORKLOADS)),
    (RolloutEngine, rollout.ROLLOUT_ENGINES),
    (RolloutEngine, ROLLOUT_FAMILIES),
    (Phase, tuple(sorted(phases.ALL_PHASES))),
]

# The CLI options that take a closed set: (subcommand, flag) -> its enum (some also take "auto").
CLI_SETS: dict[tuple[str, str], type[StrEnum]] = {
    ("predict", "--offload-optimizer"): OffloadDevice,
    ("predict", "--offload-param"): OffloadDevice,
    ("predict", "--quantization"): Quantization,
    ("predict", "--empty-cache"): EmptyCachePolicyName,
    ("predict", "--allocator"): AllocatorSetting,
    ("check", "--empty-cache"): EmptyCachePolicyName,
    ("check", "--allocator"): AllocatorSetting,
    ("check", "--quantization"): Quantization,
    ("recommend", "--quantization"): Quantization,
    ("recommend", "--rollout"): RolloutEngine,
    ("recommend", "--framework"): Framework,
    ("predict", "--framework"): Framework,
    ("check", "--framework"): Framework,
    ("tune", "--framework"): Framework,
}


def _option(command: str, flag: str) -> Any:
    group = typer.main.get_command(app)
    sub = group.commands[command]  # type: ignore[attr-defined]
    return next(param for param in sub.params if flag in getattr(param, "opts", ()))


def _metavar_choices(metavar: str) -> set[str]:
    """``[a|b|c]`` (or ``[a|b],...`` for a comma-separated list) -> {a, b, c}, less ``auto``."""
    inner = metavar.removesuffix(",...")
    assert inner.startswith("[") and inner.endswith("]"), f"no choices in the metavar {metavar!r}"
    return set(inner[1:-1].split("|")) - {AUTO}


@pytest.mark.parametrize(("choices", "store_values"), STORE_SETS, ids=lambda v: getattr(v, "__name__", ""))
def test_the_store_accepts_exactly_the_enum(choices: type[StrEnum], store_values: tuple[str, ...]) -> None:
    assert set(store_values) == {member.value for member in choices}
    assert all(type(value) is str for value in store_values)  # plain strings: stored rows and JSON as before


@pytest.mark.parametrize(("command", "flag"), list(CLI_SETS), ids=lambda v: v)
def test_the_cli_offers_exactly_the_enum(command: str, flag: str) -> None:
    option = _option(command, flag)
    assert _metavar_choices(option.metavar) == {member.value for member in CLI_SETS[command, flag]}


def _strategy_enums(schema: dict[str, Any]) -> dict[str, set[str]]:
    props = schema["properties"]["strategy"]["properties"]
    return {
        "offload_optimizer": set(props["offload_optimizer"]["enum"]),
        "actor.offload_param": set(props["actor"]["properties"]["offload_param"]["enum"]),
        "reference.offload": set(props["reference"]["properties"]["offload"]["enum"]),
        "empty_cache": set(props["empty_cache"]["enum"]),
        "allocator": set(props["allocator"]["enum"]),
        "critic.quantization": set(props["critic"]["properties"]["quantization"]["enum"]),
        "rollout.engine": set(props["rollout"]["properties"]["engine"]["enum"]),
        "workload.framework": set(schema["properties"]["workload"]["properties"]["framework"]["enum"]),
    }


SCHEMA_SETS: dict[str, type[StrEnum]] = {
    "offload_optimizer": OffloadDevice,
    "actor.offload_param": OffloadDevice,
    "reference.offload": OffloadDevice,
    "empty_cache": EmptyCachePolicyName,
    "allocator": AllocatorSetting,
    "critic.quantization": Quantization,
    "rollout.engine": RolloutEngine,
    "workload.framework": Framework,
}


@pytest.mark.parametrize("document", ["plan", "prediction"])
def test_the_committed_schemas_list_exactly_the_enum(document: str) -> None:
    assert document in DOCUMENTS
    enums = _strategy_enums(committed_schema(document))
    for key, choices in SCHEMA_SETS.items():
        assert enums[key] == {member.value for member in choices}, key


def test_a_member_is_the_string_the_documents_hold() -> None:
    assert OffloadDevice.CPU == "cpu"
    assert json.dumps({"offload_optimizer": OffloadDevice.NVME}) == json.dumps({"offload_optimizer": "nvme"})
    assert f"{EmptyCachePolicyName.AFTER_GENERATION}" == "after-generation"
    assert {Framework.TRL: 1}["trl"] == 1  # hashes as its value


def test_the_store_refuses_a_value_outside_the_set() -> None:
    with pytest.raises(InputError, match="offload"):
        records.Strategy.from_dict({"zero_stage": 2, "offload_optimizer": "disk"})
    for device in OffloadDevice:
        stage = 3 if device is OffloadDevice.NVME else 2
        strategy = records.Strategy.from_dict({"zero_stage": stage, "offload_optimizer": device})
        assert strategy.offload_optimizer == device

"""The storage contract (store.db.BaseStorage), run against every backend on a real database.

The backends, and the ``reopen``/``storage`` fixtures, are in conftest.py (``BACKENDS``).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from store.db import BaseStorage, PlanRecord
from store.errors import InputError

Opener = Callable[[], BaseStorage]  # reopens the database under test (conftest.py)


def sft_plan(**overrides: Any) -> dict[str, Any]:
    """The keyword arguments of save_plan for a realistic single-model plan."""
    workload = {"kind": "sft", "model": "opt-1.3b", "batch": 8, "seq_len": 512, "dtype": "bf16"}
    hardware = {
        "gpu": "A100-80G",
        "gpu_memory_bytes": 80 * 2**30,
        "gpus": 1,
        "nodes": 1,
        "cpu_memory_bytes": 64 * 2**30,
    }
    strategy = {
        "zero_stage": 2,
        "offload_optimizer": "none",
        "offload_param": "none",
        "gradient_checkpointing": False,
        "lora_rank": 0,
        "micro_batch": 8,
        "grad_accum": 1,
        "empty_cache": "never",
        "allocator": "default",
    }
    predicted = {
        "peak_allocated_bytes": 23_456_789_012,
        "peak_reserved_bytes": 25_769_803_776,
        "gpu_budget_bytes": 84_825_604_096,
        "host_bytes": 0,
        "step_time_s": 0.4375,
        "breakdown": {"parameters": 2_631_000_000, "activations": 9_876_543_210, "fragmentation": 0},
        "phases": [{"name": "train", "peak_allocated_bytes": 1, "peak_reserved_bytes": 2, "time_s": 0.5}],
    }
    ds_config = {"train_batch_size": 8, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    plan: dict[str, Any] = {
        "kind": "sft",
        "model": "opt-1.3b",
        "fits": True,
        "workload": workload,
        "hardware": hardware,
        "strategy": strategy,
        "predicted": predicted,
        "ds_config": ds_config,
        "document": {
            "workload": workload,
            "hardware": hardware,
            "strategy": strategy,
            "fits": True,
            "predicted": predicted,
            "ds_config": ds_config,
            "alternatives": [],
        },
    }
    plan.update(overrides)
    return plan


def ppo_plan() -> dict[str, Any]:
    """An RLHF plan: a DeepSpeed config per model, and one that does not fit."""
    configs = {name: {"zero_optimization": {"stage": 3}} for name in ("actor", "critic", "reference", "reward")}
    return sft_plan(
        kind="ppo",
        model="llama-3-8b",
        fits=False,
        workload={"kind": "ppo", "model": "llama-3-8b", "prompt_len": 256, "gen_len": 256},
        ds_config=configs,
        document={"workload": {"kind": "ppo"}, "fits": False, "ds_configs": configs},
    )


def count(storage: BaseStorage) -> int:
    """How many plans the storage holds."""
    return len(storage.list_plans(limit=10_000))


def test_save_then_get_round_trips_every_field(storage: BaseStorage) -> None:
    plan = sft_plan()
    before = datetime.now(timezone.utc)
    saved = storage.save_plan(**plan)
    after = datetime.now(timezone.utc)

    assert isinstance(saved, PlanRecord)
    assert re.fullmatch(r"[0-9a-f]{12}", saved.plan_id)
    assert saved.created_at.tzinfo is not None and saved.created_at.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= saved.created_at <= after + timedelta(seconds=1)
    for name in ("kind", "model", "fits", "workload", "hardware", "strategy", "predicted", "ds_config"):
        assert getattr(saved, name) == plan[name], name
    assert saved.document == {"plan_id": saved.plan_id, **plan["document"]}
    assert next(iter(saved.document)) == "plan_id"
    assert "plan_id" not in plan["document"]  # the caller's dict is left alone

    assert storage.get_plan(saved.plan_id) == saved


def test_rlhf_plan_keeps_a_config_per_model(storage: BaseStorage) -> None:
    plan = ppo_plan()
    saved = storage.save_plan(**plan)
    got = storage.get_plan(saved.plan_id)
    assert got.fits is False
    assert got.ds_config == plan["ds_config"]
    assert set(got.ds_config) == {"actor", "critic", "reference", "reward"}


def test_a_stale_plan_id_in_the_document_is_replaced(storage: BaseStorage) -> None:
    saved = storage.save_plan(**sft_plan(document={"plan_id": "old", "fits": True}))
    assert saved.document == {"plan_id": saved.plan_id, "fits": True}


def test_values_come_back_as_json_gives_them(storage: BaseStorage) -> None:
    saved = storage.save_plan(**sft_plan(workload={"shape": (2, 3), "nested": {"t": (1,)}}))
    assert saved.workload == {"shape": [2, 3], "nested": {"t": [1]}}
    assert storage.get_plan(saved.plan_id).workload == saved.workload


def test_plan_ids_are_unique(storage: BaseStorage) -> None:
    ids = {storage.save_plan(**sft_plan()).plan_id for _ in range(20)}
    assert len(ids) == 20


def test_get_by_prefix(storage: BaseStorage) -> None:
    saved = storage.save_plan(**sft_plan())
    assert storage.get_plan(saved.plan_id[:4]) == saved
    assert storage.get_plan(saved.plan_id[:7]) == saved
    assert storage.get_plan(f"  {saved.plan_id[:6].upper()}\n") == saved


def test_too_short_prefix_is_input_error(storage: BaseStorage) -> None:
    saved = storage.save_plan(**sft_plan())
    with pytest.raises(InputError, match="at least 4 characters"):
        storage.get_plan(saved.plan_id[:3])


@pytest.mark.parametrize("wanted", ["ffff0000ffff", "zzzz", "ab%_", "____"])
def test_unknown_id_is_input_error(storage: BaseStorage, wanted: str) -> None:
    storage.save_plan(**sft_plan())
    with pytest.raises(InputError) as info:
        storage.get_plan(wanted)
    message = str(info.value)
    assert "\n" not in message
    assert "no saved plan" in message and wanted.lower() in message


def test_ambiguous_prefix_is_input_error(storage: BaseStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = iter([uuid.UUID("abcd1111" + "0" * 24), uuid.UUID("abcd2222" + "0" * 24), uuid.UUID("abce3333" + "0" * 24)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(fresh))
    first = storage.save_plan(**sft_plan())
    second = storage.save_plan(**sft_plan())
    third = storage.save_plan(**sft_plan())

    with pytest.raises(InputError) as info:
        storage.get_plan("abcd")
    message = str(info.value)
    assert "\n" not in message
    assert "ambiguous" in message and first.plan_id in message and second.plan_id in message
    assert storage.get_plan("abcd1") == first
    assert storage.get_plan("abce") == third


def test_latest_plan(storage: BaseStorage) -> None:
    assert storage.latest_plan() is None
    storage.save_plan(**sft_plan())
    newest = storage.save_plan(**ppo_plan())
    assert storage.latest_plan() == newest


def test_list_plans_newest_first_with_limit_and_kind(storage: BaseStorage) -> None:
    assert storage.list_plans() == []
    saved = [storage.save_plan(**(ppo_plan() if i % 3 == 0 else sft_plan())) for i in range(25)]
    newest_first = saved[::-1]

    assert storage.list_plans() == newest_first[:20]
    assert storage.list_plans(limit=5) == newest_first[:5]
    assert storage.list_plans(limit=100) == newest_first
    assert storage.list_plans(kind="ppo") == [p for p in newest_first if p.kind == "ppo"]
    assert storage.list_plans(limit=2, kind="sft") == [p for p in newest_first if p.kind == "sft"][:2]
    assert storage.list_plans(kind="dpo") == []
    times = [p.created_at for p in storage.list_plans(limit=100)]
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize("limit", [0, -1])
def test_list_plans_rejects_a_limit_below_one(storage: BaseStorage, limit: int) -> None:
    with pytest.raises(InputError, match=">= 1"):
        storage.list_plans(limit=limit)


def test_records_are_frozen(storage: BaseStorage) -> None:
    saved = storage.save_plan(**sft_plan())
    with pytest.raises(dataclasses.FrozenInstanceError):
        saved.fits = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        saved.plan_id = "0" * 12  # type: ignore[misc]


def test_mutating_a_record_changes_nothing_stored(storage: BaseStorage) -> None:
    plan = sft_plan()
    saved = storage.save_plan(**plan)
    expected = storage.get_plan(saved.plan_id)

    saved.workload["batch"] = 1
    saved.predicted["breakdown"]["activations"] = 0
    saved.document["strategy"]["zero_stage"] = 3
    got = storage.get_plan(saved.plan_id)
    got.ds_config.clear()
    storage.list_plans()[0].hardware["gpus"] = 99
    plan["strategy"]["zero_stage"] = 1  # the caller's own dicts, after the save

    assert storage.get_plan(saved.plan_id) == expected
    assert storage.latest_plan() == expected
    assert expected.strategy["zero_stage"] == 2


def test_data_survives_close_and_reopen(reopen: Opener) -> None:
    first = reopen()
    saved = [first.save_plan(**sft_plan()), first.save_plan(**ppo_plan())]
    first.close()

    second = reopen()
    assert second.list_plans() == saved[::-1]
    assert second.get_plan(saved[0].plan_id) == saved[0]
    newer = second.save_plan(**sft_plan())
    assert second.latest_plan() == newer


@pytest.mark.parametrize(
    "bad",
    [
        {"predicted": {"step_time_s": {1, 2}}},
        {"ds_config": {"path": Path("/tmp")}},
        {"predicted": {"step_time_s": float("nan")}},
        {"predicted": {"step_time_s": float("inf")}},
        {"document": ["not", "a", "dict"]},
    ],
    ids=["set", "path", "nan", "inf", "not-a-dict"],
)
def test_a_failed_save_writes_nothing(storage: BaseStorage, bad: dict[str, Any]) -> None:
    storage.save_plan(**sft_plan())
    before = storage.list_plans()
    with pytest.raises(TypeError, match=next(iter(bad))):
        storage.save_plan(**sft_plan(**bad))
    assert storage.list_plans() == before


@pytest.mark.parametrize("bad", [{"kind": ""}, {"model": None}, {"fits": "yes"}], ids=str)
def test_bad_scalar_fields_are_refused(storage: BaseStorage, bad: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=next(iter(bad))):
        storage.save_plan(**sft_plan(**bad))
    assert count(storage) == 0


def test_storage_is_a_context_manager(reopen: Opener) -> None:
    with reopen() as storage:
        saved = storage.save_plan(**sft_plan())
    assert reopen().get_plan(saved.plan_id) == saved

"""The shape cache of the storage contract: traced model shapes saved and loaded by key, on a real database."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from test_db_probes import assert_schema_is_the_orm, key_of, probe_request, probe_result, stored_versions

from store.db import BaseStorage, SQLAlchemyStorage
from store.db._schema import HEAD_REVISION, alembic_config

Opener = Callable[[], BaseStorage]  # reopens the database under test (conftest.py)

SHAPE = {"model_type": "qwen3_moe", "total_params": 30532122624, "layer_param_counts": [623120640, 623120640]}


def test_a_saved_shape_comes_back_after_reopening(storage: BaseStorage, reopen: Opener) -> None:
    storage.save_model_shape("k" * 32, SHAPE)
    with reopen() as again:
        assert again.load_model_shape("k" * 32) == SHAPE


def test_an_unknown_key_has_no_shape(storage: BaseStorage) -> None:
    assert storage.load_model_shape("nothing-here") is None


def test_saving_again_under_a_key_replaces_the_shape(storage: BaseStorage) -> None:
    storage.save_model_shape("key", SHAPE)
    storage.save_model_shape("key", {**SHAPE, "total_params": 1})
    loaded = storage.load_model_shape("key")
    assert loaded is not None and loaded["total_params"] == 1


def test_a_loaded_shape_is_a_copy(storage: BaseStorage) -> None:
    storage.save_model_shape("key", SHAPE)
    first = storage.load_model_shape("key")
    assert first is not None
    first["layer_param_counts"].append(0)
    assert storage.load_model_shape("key") == SHAPE


@pytest.mark.parametrize(
    ("key", "shape"),
    [("", SHAPE), ("x" * 65, SHAPE), ("key", {"total_params": 1}), ("key", {"model_type": "x", "bad": {1, 2}})],
    ids=["empty-key", "long-key", "no-model-type", "not-json"],
)
def test_a_bad_key_or_shape_is_refused_and_nothing_written(storage: BaseStorage, key: str, shape: dict) -> None:
    with pytest.raises(TypeError):
        storage.save_model_shape(key, shape)
    assert storage.load_model_shape(key or "key") is None


def test_a_0003_database_is_upgraded_on_open_and_keeps_its_probes(tmp_path: Path) -> None:
    path = tmp_path / "shapes.db"
    url = f"sqlite:///{path}"
    with SQLAlchemyStorage(url) as storage:
        saved = storage.save_probe(probe_request(), probe_result(), key=key_of(probe_request()))
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    command.downgrade(config, "0003")  # what memplan built before the shape cache existed
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "model_shapes" not in tables and stored_versions(path) == ["0003"]

    with SQLAlchemyStorage(url) as storage:
        assert storage.get_probe(saved.probe_id) == saved
        storage.save_model_shape("key", SHAPE)
        assert storage.load_model_shape("key") == SHAPE
    assert stored_versions(path) == [HEAD_REVISION]
    assert_schema_is_the_orm(url)

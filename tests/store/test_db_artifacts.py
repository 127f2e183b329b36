"""Probe artifacts in the storage contract (store.db.BaseStorage), against every backend on a real database,
plus the schema migration that added them (0002 probes -> 0003 probe_artifacts).

To check a new backend, add a factory to ``BACKENDS`` in conftest.py.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import create_engine, inspect
from test_db_probes import assert_schema_is_the_orm, key_of, probe_request, probe_result, stored_versions

from store.alloc_stream import STREAM_FORMAT, StreamBuilder, decode, encode
from store.artifacts import (
    ALLOC_STREAM,
    CUDA_SNAPSHOT,
    SNAPSHOT_FORMAT,
    ProbeArtifact,
    pack_snapshot,
    snapshot_pickle,
    unpack_snapshot,
)
from store.db import BaseStorage, SQLAlchemyStorage
from store.db._schema import HEAD_REVISION, alembic_config
from store.errors import InputError

Opener = Callable[[], BaseStorage]  # reopens the database under test (conftest.py)


def stream_artifact() -> ProbeArtifact:
    builder = StreamBuilder()
    builder.phase("setup")
    key = builder.alloc(4096, "parameters")
    builder.phase("forward")
    builder.free(builder.alloc(2**33 + 7))
    builder.free(key)
    return ProbeArtifact(ALLOC_STREAM, STREAM_FORMAT, encode(builder.build()))


SNAPSHOT = {
    "segments": [{"device": 0, "address": 1 << 40, "total_size": 2**21, "stream": 0, "blocks": []}],
    "device_traces": [[{"action": "alloc", "addr": 1 << 40, "size": 513, "stream": 0, "frames": []}]],
}


def saved_with(storage: BaseStorage, *artifacts: ProbeArtifact, **request: Any) -> str:
    """Save a probe whose result carries ``artifacts``; returns its id."""
    req = probe_request(**request)
    result = dataclasses.replace(probe_result(), artifacts=artifacts)
    return storage.save_probe(req, result, key=key_of(req)).probe_id


def test_save_probe_keeps_the_result_artifacts_and_load_gives_them_back(storage: BaseStorage) -> None:
    stream = stream_artifact()
    snapshot = ProbeArtifact(CUDA_SNAPSHOT, SNAPSHOT_FORMAT, pack_snapshot(SNAPSHOT))
    probe_id = saved_with(storage, stream, snapshot)
    assert storage.list_probe_artifacts(probe_id) == {ALLOC_STREAM: len(stream.data), CUDA_SNAPSHOT: len(snapshot.data)}
    loaded = storage.load_probe_artifact(probe_id[:6].upper(), ALLOC_STREAM)
    assert loaded == stream and decode(loaded.data) == decode(stream.data)
    again = storage.load_probe_artifact(probe_id, CUDA_SNAPSHOT)
    assert again is not None and unpack_snapshot(again.data) == SNAPSHOT
    assert storage.load_probe_artifact(probe_id, "nothing-here") is None
    record = storage.get_probe(probe_id)
    assert record.result.artifacts == ()  # read by name, not with the record
    assert record.result == probe_result()  # artifacts are not part of a result's equality


def test_a_probe_without_artifacts_lists_none(storage: BaseStorage) -> None:
    probe_id = saved_with(storage)
    assert storage.list_probe_artifacts(probe_id) == {}
    assert storage.load_probe_artifact(probe_id, ALLOC_STREAM) is None


def test_save_probe_artifact_adds_and_replaces_by_name(storage: BaseStorage) -> None:
    probe_id = saved_with(storage, stream_artifact())
    other = saved_with(storage, stream_artifact(), model="opt-350m")
    replacement = ProbeArtifact(ALLOC_STREAM, STREAM_FORMAT, encode(StreamBuilder().build()))
    assert storage.save_probe_artifact(probe_id, replacement) == replacement
    extra = ProbeArtifact("notes.v2", "text/plain", b"\x00\xff raw bytes")
    storage.save_probe_artifact(probe_id, extra)
    assert storage.load_probe_artifact(probe_id, ALLOC_STREAM) == replacement
    assert storage.load_probe_artifact(probe_id, "notes.v2") == extra
    assert list(storage.list_probe_artifacts(probe_id)) == [ALLOC_STREAM, "notes.v2"]
    assert storage.load_probe_artifact(other, ALLOC_STREAM) == stream_artifact()  # the other probe's stays


@pytest.mark.parametrize("call", ["save", "load", "list"])
def test_an_unknown_probe_id_is_one_input_error_line(storage: BaseStorage, call: str) -> None:
    saved_with(storage)
    actions = {
        "save": lambda: storage.save_probe_artifact("ffffffffffff", stream_artifact()),
        "load": lambda: storage.load_probe_artifact("ffffffffffff", ALLOC_STREAM),
        "list": lambda: storage.list_probe_artifacts("ffffffffffff"),
    }
    with pytest.raises(InputError, match="no saved probe has an id starting with 'ffffffffffff'") as caught:
        actions[call]()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("artifacts", "error", "match"),
    [
        (("stream",), TypeError, "ProbeArtifact"),
        ((ProbeArtifact("../escape", "x", b""),), TypeError, "name"),
        ((ProbeArtifact("a", "", b""),), TypeError, "format"),
        ((ProbeArtifact("a", "x", "text"),), TypeError, "bytes"),  # type: ignore[arg-type]
        ((ProbeArtifact("a", "x", b"1"), ProbeArtifact("a", "y", b"2")), ValueError, "given twice: a"),
    ],
    ids=["not-an-artifact", "path-name", "empty-format", "str-data", "same-name"],
)
def test_bad_artifacts_write_nothing(storage: BaseStorage, artifacts: tuple[Any, ...], error: type, match: str) -> None:
    req = probe_request()
    with pytest.raises(error, match=match):
        storage.save_probe(req, dataclasses.replace(probe_result(), artifacts=artifacts), key=key_of(req))
    assert storage.list_probes() == []  # the probe is not saved without its artifacts
    probe_id = saved_with(storage)
    if len(artifacts) == 1:
        with pytest.raises(error, match=match):
            storage.save_probe_artifact(probe_id, artifacts[0])
    assert storage.list_probe_artifacts(probe_id) == {}


def test_artifacts_survive_close_and_reopen(reopen: Opener) -> None:
    first = reopen()
    probe_id = saved_with(first, stream_artifact())
    first.close()
    assert reopen().load_probe_artifact(probe_id, ALLOC_STREAM) == stream_artifact()


def test_a_stored_snapshot_opens_as_plain_data_only() -> None:
    data = pack_snapshot(SNAPSHOT)
    assert snapshot_pickle(data).startswith(b"\x80\x04")  # the plain pickle memory_viz opens
    import pickle
    import zlib

    hostile = zlib.compress(pickle.dumps(Path("/etc/passwd")))
    with pytest.raises(ValueError, match="plain data, not pathlib"):
        unpack_snapshot(hostile)
    with pytest.raises(ValueError, match="corrupt"):
        unpack_snapshot(b"not zlib")
    with pytest.raises(ValueError, match="not a dict"):
        unpack_snapshot(zlib.compress(pickle.dumps([1, 2])))


# The schema --------------------------------------------------------------------------------------


def test_a_0002_database_is_upgraded_on_open_and_keeps_its_probes(tmp_path: Path) -> None:
    path = tmp_path / "probes.db"
    url = f"sqlite:///{path}"
    with SQLAlchemyStorage(url) as storage:
        saved = storage.save_probe(probe_request(), probe_result(), key=key_of(probe_request()))
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    command.downgrade(config, "0002")  # what memplan built before artifacts existed
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "probe_artifacts" not in tables and stored_versions(path) == ["0002"]

    with SQLAlchemyStorage(url) as storage:
        assert storage.get_probe(saved.probe_id) == saved
        assert storage.list_probe_artifacts(saved.probe_id) == {}
        storage.save_probe_artifact(saved.probe_id, stream_artifact())
    assert stored_versions(path) == [HEAD_REVISION]
    assert_schema_is_the_orm(url)
    engine = create_engine(url)
    try:
        indexes = {ix["name"]: ix for ix in inspect(engine).get_indexes("probe_artifacts")}
        assert indexes["ix_probe_artifacts_probe_id_name"]["column_names"] == ["probe_id", "name"]
        assert indexes["ix_probe_artifacts_probe_id_name"]["unique"]
    finally:
        engine.dispose()

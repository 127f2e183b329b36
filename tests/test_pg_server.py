"""Where the tests' PostgreSQL server comes from (``tests/pg_server.py``): the binaries are found on PATH or
in the distributions' folders (newest first), root runs them as an unprivileged user, and where none of
that works the reason is one line that the PostgreSQL tests skip with.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pg_server
import pytest
from pg_server import NoPostgres


def fake_binaries(folder: Path) -> Path:
    """``folder`` holding executable stand-ins for initdb, pg_ctl and postgres."""
    folder.mkdir(parents=True)
    for tool in ("initdb", "pg_ctl", "postgres"):
        (folder / tool).write_text("#!/bin/sh\nexit 1\n")
        (folder / tool).chmod(0o755)
    return folder


def test_no_binaries_anywhere_is_a_reason_to_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(pg_server, "_SEARCH_GLOBS", (str(tmp_path / "lib" / "*" / "bin"),))
    with pytest.raises(NoPostgres, match=r"^no PostgreSQL server: initdb and pg_ctl are neither on PATH"):
        pg_server.find_binaries()


def test_the_newest_distribution_folder_wins_and_path_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for version in ("9.6", "13", "16"):
        fake_binaries(tmp_path / "lib" / version / "bin")
    monkeypatch.setattr(pg_server, "_SEARCH_GLOBS", (str(tmp_path / "lib" / "*" / "bin"),))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert pg_server.find_binaries() == tmp_path / "lib" / "16" / "bin"
    on_path = fake_binaries(tmp_path / "mine")
    monkeypatch.setenv("PATH", str(on_path))
    assert pg_server.find_binaries() == on_path


def test_root_runs_the_server_as_an_unprivileged_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    try:
        prefix, uid = pg_server._run_as_prefix()
    except NoPostgres as exc:  # a machine without runuser and setpriv, or without such a user
        pytest.skip(str(exc))
    assert uid is not None and uid != 0
    assert Path(prefix[0]).name in ("runuser", "setpriv") and prefix[-1] == "--"


def test_root_without_runuser_or_setpriv_is_a_reason_to_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(NoPostgres, match="running as root, which initdb refuses"):
        pg_server._run_as_prefix()


def test_no_psycopg_is_a_reason_to_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    real = pg_server.importlib.util.find_spec
    monkeypatch.setattr(
        pg_server.importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a)
    )
    with pytest.raises(NoPostgres, match=r"psycopg is not installed \(pip install 'memplan\[postgres\]'\)"):
        pg_server.get_server()

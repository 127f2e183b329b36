"""Fixtures of every test: no test reads or writes the user's own plan database, and a real PostgreSQL
server (``tests/pg_server.py`` says where it comes from) with an empty database on it per test.

``PLANNER_DB``, ``XDG_DATA_HOME`` and ``XDG_CACHE_HOME`` point at a throwaway folder for the whole session, so a
command or API call that names no ``db`` (``predict`` looking up a calibration, ``recommend`` saving its plan) meets
an empty database of its own, never the developer's probes and calibrations (nor the host rates they cached).

The tests' helpers in this folder (``tiny_models``, ``script_cases``, ``pg_server``) are importable from every
test folder under any import mode, and the ``parse`` fixture reads a config with DeepSpeed's own parser.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_server import NoPostgres, PostgresFailed, PostgresServer, get_server, required

from probes.process.op_cache import default_ops_folder, pin_ninja

# every test phase within a CPU-seconds budget (tests/cpu_budget.py), DeepSpeed's ops built before the first test
# (tests/op_builds.py), the heaviest modules first (tests/schedule.py); pytester runs those checks on themselves
pytest_plugins = ["cpu_budget", "op_builds", "schedule", "pytester"]

# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set: without them each pytest-xdist worker
# rewrites every test module's asserts anew (about 10 of its 30 CPU s of collection on a 2-core EPYC), and each
# probe child or planner command a test starts compiles the memplan sources edited since `make setup`. They go to
# __pycache__ folders, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# One OpenMP thread per process (unless the developer set a number): `make test` runs two workers on two cores, each
# with probe children, and torch's default of one thread per core had their threads spin-wait for a core the other
# held. Two copies of tests/probes/test_warmup.py + test_qlora_probe.py side by side on the 2-core EPYC spent 72
# CPU s each, 51 with one thread. Set before torch is imported here (OpenMP reads it when torch loads it); a
# tree of children inherits it, so single-rank probes and rank groups (torchrun's OMP_NUM_THREADS=1) share a
# preloaded starter.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def guard_default_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point PLANNER_DB and the user data folder at a throwaway place for the whole session."""
    home = tmp_path_factory.mktemp("guard")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLANNER_DB", str(home / "guard.db"))
        mp.setenv("XDG_DATA_HOME", str(home / "xdg"))
        mp.setenv("DS_ACCELERATOR", "cpu")
        # DeepSpeed's ops loaded in this process and in the probe children: one folder, memplan's own
        mp.setenv("TORCH_EXTENSIONS_DIR", os.environ.get("TORCH_EXTENSIONS_DIR") or str(default_ops_folder("cpu")))
        # built by one ninja, this environment's, as in the probe children (probes.process.op_cache.pin_ninja)
        mp.setenv("PATH", pin_ninja({"PATH": os.environ.get("PATH", os.defpath)})["PATH"])
        # what memplan keeps per user (the host's CPU rates: planner.probing.cpu_rates) in a throwaway folder too,
        # set after the op folder above was chosen: measured once per worker, never read from the developer's
        mp.setenv("XDG_CACHE_HOME", str(home / "cache"))
        yield home / "guard.db"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The PostgreSQL server of this test session, started on first use and stopped at the end; the
    tests that use it skip, with the reason, where there is none."""
    try:
        server = get_server()
    except NoPostgres as exc:
        if required():
            pytest.fail(f"{exc} (and $MEMPLAN_TEST_POSTGRES_REQUIRED is set)")
        pytest.skip(str(exc))
    except PostgresFailed as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The SQLAlchemy URL (``postgresql+psycopg://...``) of an empty database for this test: a fresh
    schema that the URL's connections use as their only one (``PostgresServer.create_schema``), dropped
    after the test. Close what opened it before the test ends."""
    url = postgres_server.create_schema()
    try:
        yield url
    finally:
        postgres_server.drop_schema(url)


@pytest.fixture
def sql_ascii_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A database created as ``initdb`` creates them under the C locale: encoding SQL_ASCII."""
    name = f"memplan_test_{uuid.uuid4().hex[:12]}"
    postgres_server._admin(f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' TEMPLATE template0")
    url = postgres_server.admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        postgres_server.drop_database(url)


class DataParallelOnly:
    """``mpu`` stand-in: the one method DeepSpeedConfig asks of it, the data-parallel world size."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size

    def get_data_parallel_world_size(self) -> int:
        return self._world_size


@pytest.fixture
def parse(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, Any], int], Any]:
    """Parse a config with DeepSpeed's own DeepSpeedConfig at the given data-parallel world size.

    Without a process group ``DeepSpeedConfig`` would silently fall back to world size 1: ``get_rank`` is
    patched to 0 (undone after the test) and :class:`DataParallelOnly` reports the world size.
    """
    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda group=None: 0)

    def _parse(config: dict[str, Any], world_size: int) -> Any:
        return DeepSpeedConfig(json.loads(json.dumps(config)), mpu=DataParallelOnly(world_size))

    return _parse

"""Fixtures of every test: no test reads or writes the user's own plan database.

``PLANNER_DB`` and ``XDG_DATA_HOME`` point at a throwaway folder for the whole session, so a command or API
call that names no ``db`` (``predict`` looking up a calibration, ``recommend`` saving its plan) meets an
empty database of its own, never the developer's probes and calibrations.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def guard_default_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point PLANNER_DB and the user data folder at a throwaway place for the whole session."""
    home = tmp_path_factory.mktemp("guard")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLANNER_DB", str(home / "guard.db"))
        mp.setenv("XDG_DATA_HOME", str(home / "xdg"))
        mp.setenv("DS_ACCELERATOR", "cpu")
        yield home / "guard.db"

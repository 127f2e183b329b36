"""Shared setup of tests/probes: the ``tiny_models`` helper importable under any import mode, and the
``parse`` fixture (DeepSpeed's config parser at a given world size)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


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

"""One preloaded starter for the probes of many tests: without pytest's per-phase variable in the probe's environment.

pytest sets ``PYTEST_CURRENT_TEST`` in ``os.environ`` to the running test's id at the start of each phase (setup,
call, teardown), and a probe child's environment is a copy of ``os.environ`` (``probes.process.isolation.child_env``).
The preloaded starters are kept one per environment (``probes.process.preloaded.server_key``), at most two at a time,
so each test that probes would start a starter of its own (its imports: about 6 CPU seconds here) and evict an
earlier one (its CPU seconds then counted in that later test's phase). Nothing a probe child imports reads the
variable, so the tests that probe remove it for the rest of their phase, and their probes share one starter.
"""

from __future__ import annotations

import pytest

VARIABLE = "PYTEST_CURRENT_TEST"


def share_one_starter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove ``PYTEST_CURRENT_TEST`` until the test ends (call it in the test's body or in the fixture that probes:
    pytest sets it anew at the start of each phase); monkeypatch puts it back before pytest reads it again."""
    monkeypatch.delenv(VARIABLE, raising=False)

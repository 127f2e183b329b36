"""One preloaded starter for the probes of many tests: a probe environment that does not change from test to test.

The preloaded starters are kept one per environment (``probes.process.preloaded.server_key``), at most two at a
time, and a probe child's environment is a copy of ``os.environ`` (``probes.process.isolation.child_env``). Two
things change ``os.environ`` in a test session, and each change would start a starter of its own (its imports:
about 6 CPU seconds here) and evict an earlier one (its CPU seconds then counted in the later test's phase):

- pytest sets ``PYTEST_CURRENT_TEST`` to the running test's id at the start of each phase (setup, call, teardown).
  Nothing a probe child imports reads it, so the tests that probe remove it for the rest of their phase.
- the first import of DeepSpeed in this process sets ``PYTORCH_NVML_BASED_CUDA_CHECK`` (``deepspeed/__init__.py``,
  0.19.8: ``os.environ.setdefault``), and that of bitsandbytes sets ``TORCHINDUCTOR_CACHE_DIR`` (through torch's
  ``torch._inductor.runtime.cache_dir_utils.cache_dir``). :func:`settle_environment` makes both happen before the
  first probe, so every probe of the session sees the environment the later ones would.
"""

from __future__ import annotations

import pytest

VARIABLE = "PYTEST_CURRENT_TEST"


def settle_environment() -> None:
    """Set in ``os.environ`` what the libraries' imports set there, once (the later calls find it done)."""
    import deepspeed  # noqa: F401 - sets PYTORCH_NVML_BASED_CUDA_CHECK as it is imported
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache_dir()  # sets TORCHINDUCTOR_CACHE_DIR, as importing bitsandbytes does


def share_one_starter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove ``PYTEST_CURRENT_TEST`` until the test ends and settle the rest (call it in the test's body or in the
    fixture that probes: pytest sets the variable anew at the start of each phase); monkeypatch puts it back before
    pytest reads it again."""
    settle_environment()
    monkeypatch.delenv(VARIABLE, raising=False)

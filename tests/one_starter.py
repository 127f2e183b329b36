"""One preloaded starter for the probes of many tests: a probe environment that does not change from test to test.

The preloaded starters are kept one per environment (``probes.process.preloaded.server_key``, which leaves out
what each child sets on its own and pytest's per-phase ``PYTEST_CURRENT_TEST``), at most ``MAX_SERVERS`` at a
time, and a probe child's environment is a copy of ``os.environ`` (``probes.process.isolation.child_env``). Two
imports change ``os.environ`` in a test session, and each change would start a starter of its own (its imports:
about 6 CPU seconds here) and may evict an earlier one: the first import of DeepSpeed in this process sets
``PYTORCH_NVML_BASED_CUDA_CHECK`` (``deepspeed/__init__.py``, 0.19.8: ``os.environ.setdefault``), and that of
bitsandbytes sets ``TORCHINDUCTOR_CACHE_DIR`` (through torch's
``torch._inductor.runtime.cache_dir_utils.cache_dir``). :func:`settle_environment` makes both happen before the
first probe, so every probe of the session sees the environment the later ones would.
"""

from __future__ import annotations


def settle_environment() -> None:
    """Set in ``os.environ`` what the libraries' imports set there, once (the later calls find it done)."""
    import deepspeed  # noqa: F401 - sets PYTORCH_NVML_BASED_CUDA_CHECK as it is imported
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache_dir()  # sets TORCHINDUCTOR_CACHE_DIR, as importing bitsandbytes does

"""DeepSpeed's ops, built once per venv before the first test and outside every test's budget.

DeepSpeed JIT-compiles an op the first time an engine loads it. In the suite that first load used to fall inside
whichever test came first (an Accelerate run paid CPU-Adam's build, 405 CPU seconds on an AVX2-only EPYC against
a budget of 300), so a cold cache or a slower compiler failed a correct suite. This plugin therefore:

- at session start, in the controlling process only (before pytest-xdist starts its workers), loads every op the
  suite's engines load (:func:`suite_ops`: what :func:`probes.ops.prepare.ops_for_configs` says DeepSpeed loads for
  an Adam engine with and without optimizer offload on the CPU accelerator) in one ``python -m probes.ops.child``
  process, into the folder the whole session uses (``TORCH_EXTENSIONS_DIR``, else
  :func:`probes.process.op_cache.default_ops_folder`), and says so in one line: built, or loaded from the cache;
- watches that folder around every test phase: a phase after which an op there is new or rebuilt has built it
  itself, and fails naming the op, so a new op is added here instead of being charged to one test on one machine.

The folder is read once, when pytest starts: a folder of a test's own (a test that sets ``TORCH_EXTENSIONS_DIR``
for its child, as the fault tests do to stop a build midway) is not watched. ``MEMPLAN_TEST_BUILD_OPS=0`` skips
the build (the watch stays; the plugin's own test runs so).
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from probes.ops.prepare import BUILD_TIMEOUT_S, BuildOutcome, build_in_child, ops_for_configs
from probes.process.isolation import child_env
from probes.process.op_cache import VARIABLE, default_ops_folder

# the engines the suite starts on the CPU accelerator: Adam/AdamW with the optimizer on the "device" and offloaded
SUITE_CONFIGS: tuple[dict[str, Any], ...] = (
    {"optimizer": {"type": "AdamW"}},
    {"optimizer": {"type": "AdamW"}, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
)
SKIP_VARIABLE = "MEMPLAN_TEST_BUILD_OPS"
_built_key = pytest.StashKey[dict[str, frozenset[str]]]()
_session: dict[str, Path] = {}


def suite_ops() -> tuple[str, ...]:
    """The op builders DeepSpeed loads for the suite's engines, in build order."""
    return ops_for_configs(SUITE_CONFIGS, "cpu")


def session_ops_folder() -> Path:
    """The folder every engine of this session loads its ops from (``tests/conftest.py`` sets it for the tests),
    as the environment said when pytest started."""
    if "folder" not in _session:
        _session["folder"] = Path(os.environ.get(VARIABLE) or default_ops_folder("cpu"))
    return _session["folder"]


def pytest_configure(config: pytest.Config) -> None:
    """Read the session's op folder before any test can change the environment."""
    session_ops_folder()


def build_stamps(folder: Path) -> dict[str, float]:
    """The ops built in ``folder`` (its subfolders that hold a compiled extension) and when each was built last."""
    stamps: dict[str, float] = {}
    try:
        for sub in folder.iterdir():
            built = [so.stat().st_mtime for so in sub.glob("*.so")] if sub.is_dir() else []
            if built:
                stamps[sub.name] = max(built)
    except OSError:
        pass
    return stamps


def built_ops(folder: Path) -> frozenset[str]:
    """The ops built in ``folder``."""
    return frozenset(build_stamps(folder))


def build_suite_ops(folder: Path) -> tuple[BuildOutcome, float]:
    """Load (building where missing) every op of :func:`suite_ops` into ``folder`` in one build child (its
    compiler runs an op's sources in parallel); the outcome and the wall seconds. The child is ended with its
    compilers when the session is interrupted (:func:`probes.process.isolation.run_child`)."""
    env = child_env("cpu", "default")
    env[VARIABLE] = str(folder)
    start = time.perf_counter()
    outcome = build_in_child("cpu", suite_ops(), env, BUILD_TIMEOUT_S)
    return outcome, time.perf_counter() - start


def _summary(outcome: BuildOutcome, wall_s: float, before: frozenset[str], folder: Path) -> str:
    names = ", ".join(op.removesuffix("Builder") for op in suite_ops())
    if not outcome.ok:
        reason = f"{outcome.failed or outcome.last_step or 'startup'}: {outcome.message or outcome.log_tail[-200:]}"
        return f"DeepSpeed ops {names}: the build before the tests failed ({reason}); tests that load them will say so"
    new = sorted(built_ops(folder) - before)
    how = f"built {', '.join(new)} for this venv (first run only)" if new else "loaded from this venv's cache"
    return f"DeepSpeed ops {names}: {how} in {wall_s:.0f} s, before the tests and outside their budgets ({folder})"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the suite's ops once, in the controlling process, before any worker or test starts."""
    config = session.config
    if _is_worker(config) or config.getoption("collectonly", False):
        return
    if os.environ.get(SKIP_VARIABLE, "").strip() == "0":
        return
    folder = session_ops_folder()
    folder.mkdir(parents=True, exist_ok=True)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"DeepSpeed ops: loading {', '.join(suite_ops())} before the tests (a first run builds them)"
        )
    before = built_ops(folder)
    outcome, wall_s = build_suite_ops(folder)
    line = _summary(outcome, wall_s, before, folder)
    if reporter is not None:
        reporter.write_line(line)


def _watched(item: pytest.Item, phase: str) -> Generator[None, Any, None]:
    folder = session_ops_folder()
    before = build_stamps(folder)
    try:
        yield
    finally:
        new = frozenset(name for name, stamp in build_stamps(folder).items() if before.get(name) != stamp)
        if new:
            item.stash.setdefault(_built_key, {})[phase] = new


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, None]:
    yield from _watched(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    yield from _watched(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, None]:
    yield from _watched(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    new = item.stash.get(_built_key, {}).get(call.when)
    if new and report.outcome == "passed":
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} ({call.when}) built DeepSpeed's op {', '.join(sorted(new))} in {session_ops_folder()}: "
            "the session builds its ops before the tests (tests/op_builds.py SUITE_CONFIGS); add the engine that "
            "loads it there, so that no test pays for a build"
        )

"""A test module run as a script: one case in a fresh one-rank DeepSpeed process on the CPU accelerator.

The parent (:func:`run_script_case`) runs the module as ``__main__`` with ``'<case json>'`` as its argument
(through ``script_case_child``, started in this folder) with the probes' own child environment
(``probes.process.isolation.child_env``: RANK 0 of 1, a free MASTER_PORT, ``DS_ACCELERATOR=cpu``), forked from the
preloaded starter as a CPU probe child is (``probes.process.preloaded``: a process of its own, started after torch,
DeepSpeed and transformers were imported and before any of them ran, so no DeepSpeed state of another case is in
it; ``MEMPLAN_PRELOAD=0`` starts it plainly). It removes DeepSpeed's shm allreduce buffer afterwards (it never
unlinks it) and returns the case's result. The child (:func:`report`) prints that result on one
``MEMPLAN_RESULT <json>`` line.

The cases and the probes share one starter (a starter serves one environment): the environment is a probe's, with
what the libraries' imports set (``one_starter.py``), and the helpers are found in the child's working folder, not
through a ``PYTHONPATH`` of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from one_starter import settle_environment

from probes.process import preloaded
from probes.process.isolation import child_env, release_shared_memory

RESULT_TAG = "MEMPLAN_RESULT "
HELPERS = Path(__file__).resolve().parent  # tiny_models, script_cases: what the scripts import
CHILD = "script_case_child"  # in HELPERS


def run_script_case(script: str, name: str, case: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run ``script`` on ``case`` in its own process; the result it reported (assert it did, with its output)."""
    settle_environment()
    env = child_env("cpu", "default")
    arguments = [str(Path(script).resolve()), json.dumps(case)]
    with tempfile.TemporaryDirectory(prefix="memplan-case-") as folder:
        log_path = Path(folder) / "case.log"
        try:
            with (
                log_path.open("wb") as log,
                mock.patch.object(preloaded, "PRELOADABLE_CHILDREN", preloaded.PRELOADABLE_CHILDREN | {CHILD}),
            ):
                child = preloaded.start_child(CHILD, arguments, HELPERS, env, log)
            try:
                returncode = child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, 9)
                child.wait(60)
                raise AssertionError(f"case {name} ran past {timeout_s:g} s:\n{log_path.read_text()[-6000:]}") from None
        finally:
            release_shared_memory(env["MASTER_PORT"])
        output = log_path.read_text(encoding="utf-8", errors="replace")
    lines = [line for line in output.splitlines() if line.startswith(RESULT_TAG)]
    assert returncode == 0 and lines, f"case {name} failed (rc {returncode}):\n{output[-6000:]}"
    return json.loads(lines[-1][len(RESULT_TAG) :])


def report(outcome: dict[str, Any]) -> None:
    """The child's last word: its result on one tagged line of stdout."""
    print(RESULT_TAG + json.dumps(outcome), flush=True)

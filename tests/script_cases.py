"""A test module run as a script: one case in a fresh one-rank DeepSpeed process on the CPU accelerator.

The parent (:func:`run_script_case`) starts ``python <module> '<case json>'`` with the probes' own child
environment (``probes.process.isolation.child_env``: RANK 0 of 1, a free MASTER_PORT, ``DS_ACCELERATOR=cpu``),
removes DeepSpeed's shm allreduce buffer afterwards (it never unlinks it) and returns the case's result.
The child (:func:`report`) prints that result on one ``MEMPLAN_RESULT <json>`` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from probes.process.isolation import PROJECT_ROOT, child_env, release_shared_memory

RESULT_TAG = "MEMPLAN_RESULT "


def run_script_case(script: str, name: str, case: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run ``script`` on ``case`` in its own process; the result it reported (assert it did, with its output)."""
    env = child_env("cpu", "default")
    # the script imports the tests' helpers (tiny_models, script_cases) from this folder, wherever it lives
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(
            [sys.executable, script, json.dumps(case)],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    finally:
        release_shared_memory(env["MASTER_PORT"])
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and lines, f"case {name} failed (rc {proc.returncode}):\n{output[-6000:]}"
    return json.loads(lines[-1][len(RESULT_TAG) :])


def report(outcome: dict[str, Any]) -> None:
    """The child's last word: its result on one tagged line of stdout."""
    print(RESULT_TAG + json.dumps(outcome), flush=True)

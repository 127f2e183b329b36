"""The op-build child: ``python -m probes.ops.child DIR`` loads (JIT-building where needed) DeepSpeed's ops.

``DIR/request.json`` is ``{"device": "cuda" | "cpu", "ops": ["FusedAdamBuilder", ...], "optional": [...]}``:
op builder class names as DeepSpeed's accelerator knows them (``get_accelerator().create_op_builder``).
The parent (:mod:`probes.ops.prepare`) starts this child with the probe children's environment
(:func:`probes.process.isolation.child_env`: ``DS_ACCELERATOR``, a parseable ``TORCH_CUDA_ARCH_LIST``), so the
probes later load what it built from the torch extensions folder (``TORCH_EXTENSIONS_DIR``, a folder of
memplan's environment unless the user set one: :mod:`probes.process.op_cache`) in a fraction of a second. It ends,
with its compiler processes, when the planner dies (:mod:`probes.process.parent_watch`).

Reads top to bottom: report ``import`` and import deepspeed (for cuda, a CUDA device must be visible),
then for each op report ``build <name>`` and call the builder's ``load()`` (an op already built, or
installed with DeepSpeed, just loads). It stops at the first failure. An optional op (DeepSpeed's CPU
shared-memory allreduce) that DeepSpeed itself would skip on this machine (builder missing or not
compatible) is skipped. ``DIR/result.json``::

    {"ok": true, "built": [...], "skipped": [...], "failed": null | name, "message": "Type: first line",
     "seconds": {name: s}, "arch_list": the TORCH_CUDA_ARCH_LIST after the builds, "capability": "9.0"}
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from probes.process.isolation import REQUEST_FILE, RESULT_FILE
from probes.step.child import Reporter, describe


def build(request: dict[str, Any], reporter: Reporter, out: dict[str, Any]) -> None:
    """Load every op of ``request`` in order; raises what the first failing builder raised."""
    reporter.enter("import")
    from probes.process.jit_lock import install, waiting_step

    # before the first load: a lock this process leaves names it (probes.process.jit_lock);
    # a wait on another's lock is a step of its own
    install(on_wait=lambda lock: reporter.enter(waiting_step(lock)))
    from probes.process.cpu_info import cache_cpu_info

    cache_cpu_info()  # each op's builder asks py-cpuinfo, which starts a process each time
    import deepspeed  # noqa: F401 - sets up the accelerator DS_ACCELERATOR names
    from deepspeed.accelerator import get_accelerator

    if request.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("device cuda asked for, but torch sees no CUDA device")
        major, minor = torch.cuda.get_device_capability(0)
        out["capability"] = f"{major}.{minor}"
    accelerator = get_accelerator()
    optional = set(request.get("optional") or ())
    for name in request.get("ops") or ():
        reporter.enter(f"build {name}")
        out["failed"] = name
        builder = accelerator.create_op_builder(name)
        if name in optional and (builder is None or not builder.is_compatible()):
            out["skipped"].append(name)
            out["failed"] = None
            continue
        if builder is None:
            raise RuntimeError(f"DeepSpeed's {type(accelerator).__name__} has no op builder {name}")
        start = time.perf_counter()
        builder.load()
        out["seconds"][name] = round(time.perf_counter() - start, 3)
        out["built"].append(name)
        out["failed"] = None


def main(folder: Path) -> int:
    request = json.loads((folder / REQUEST_FILE).read_text(encoding="utf-8"))
    reporter = Reporter(folder)
    out: dict[str, Any] = {"ok": False, "built": [], "skipped": [], "failed": None, "message": "", "seconds": {}}
    try:
        build(request, reporter, out)
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - every failure is the build's outcome
        out["message"] = describe(exc)
        out["traceback"] = traceback.format_exc()[-4000:]
    out["arch_list"] = os.environ.get("TORCH_CUDA_ARCH_LIST")
    temporary = folder / (RESULT_FILE + ".tmp")
    temporary.write_text(json.dumps(out), encoding="utf-8")
    temporary.replace(folder / RESULT_FILE)
    return 0


if __name__ == "__main__":
    from probes.process.parent_watch import watch_parent

    watch_parent()  # this process and its helpers end with the planner, however it ends
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

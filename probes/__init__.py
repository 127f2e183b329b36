"""probes: measuring. Short real runs of a strategy (with the DeepSpeed configs ``launch`` renders) that
measure its memory and time, and meta-device tracing for the model catalog.

Layers, each importing only those below (docs/layout.md): ``runner`` and ``script`` (the user's own program),
``ops``, ``step`` and ``trace``, ``model``, ``measure`` and ``process``.

Public API (loaded on first use, so that ``import probes`` on the planner's fast path stays light: nothing here
imports torch)::

    from probes import run_probe, prepare_ops, PHASES
    prepare_ops(requests, on_note=print)  # DeepSpeed's ops, built once before any probe (OpBuildError)
    result = run_probe(ProbeRequest(workload=..., strategy=..., hardware=..., device="cpu", steps=3))

``run_probe(request) -> ProbeResult`` runs one probe in a fresh process (``probes.runner``);
``prepare_ops(requests)`` builds the DeepSpeed ops those probes load, once per process, in a child of its
own, and raises ``OpBuildError`` (an InputError: one line) when it cannot (``probes.ops.prepare``);
``PHASES`` maps each workload kind to its phase names, in step order (``probes.step.phases``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PHASES", "OpBuildError", "prepare_ops", "run_probe"]


def __getattr__(name: str) -> Any:
    if name == "run_probe":
        from probes.runner import run_probe

        return run_probe
    if name in ("prepare_ops", "OpBuildError"):
        import probes.ops.prepare

        return getattr(probes.ops.prepare, name)
    if name == "PHASES":
        from probes.step.phases import PHASES

        return PHASES
    raise AttributeError(f"module 'probes' has no attribute {name!r}")

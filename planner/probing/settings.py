"""How each probe runs, as one record every caller passes: ``planner probe``, ``planner probe -- CMD`` and
``planner tune`` check their run options into a :class:`ProbeSettings` once, and the planning of probes
(:func:`planner.probing.plan.plan_probes`), a program's run (:func:`planner.probing.program.run_program_strategy`)
and a tune's rounds read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.probing.limits import check_run
from store.measurements import ProbeRequest, ProbeResult
from store.sizes import parse_size

__all__ = ["ProbeSettings"]


@dataclass(frozen=True)
class ProbeSettings:
    """How each probe runs: on ``device`` (cuda or cpu) for ``steps`` optimizer steps within ``timeout_s``
    seconds, capped at ``memory_cap_bytes`` of device memory (None: the device's own), by ``runner`` (None:
    ``probes.run_probe``, with DeepSpeed's ops built first)."""

    device: str
    steps: int
    timeout_s: float
    memory_cap_bytes: int | None = None
    runner: Callable[[ProbeRequest], ProbeResult] | None = None

    @classmethod
    def checked(
        cls,
        *,
        device: str,
        steps: int,
        timeout_s: float,
        memory_cap: str | int | None = None,
        runner: Callable[[ProbeRequest], ProbeResult] | None = None,
    ) -> ProbeSettings:
        """The settings of a command's run options, each checked (one InputError line for a bad value):
        ``memory_cap`` a size as ``--memory-cap`` takes it (``8G``, bytes) or None."""
        device, steps, timeout_s = check_run(device, steps, timeout_s)
        cap = parse_size(memory_cap, "--memory-cap") if memory_cap is not None else None
        return cls(device, steps, float(timeout_s), cap, runner)

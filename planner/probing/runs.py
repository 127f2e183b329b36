"""One probe loop for ``planner probe`` and ``planner tune``: find a stored probe of the same request (reused:
nothing runs twice), build DeepSpeed's ops once before the first probe that runs, run it, save its result.

A probe's timeout is not part of its key (:meth:`store.measurements.ProbeRequest.key`): a stored ``ok``, ``oom``
or ``error`` answers the request whatever the timeout asked now. A stored ``timeout`` answers it only when it was
given at least as long as is asked now; asked for longer, the probe runs again and its new result is stored as
the newest (:func:`reusable`).

``ProbeSession`` holds the open database and the runner; ``probe`` (:mod:`planner.probing.session`) drives it
over its planned strategies inside a probe run, ``tune`` (:mod:`planner.tuning.study`) one candidate at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.probing.plan import PlannedProbe
from planner.probing.settings import ProbeSettings as ProbeSettings  # where callers have found it
from store.measurements import ProbeRequest, ProbeResult


def reusable(known: Any, request: ProbeRequest) -> bool:
    """Whether the stored probe ``known`` (a ``ProbeRecord``) answers ``request``: any outcome but ``timeout``;
    a timeout only when its own timeout was at least the one asked now (given longer, it may finish)."""
    if known.result.outcome != "timeout":
        return True
    return float(known.request.timeout_s) >= float(request.timeout_s)


class ProbeSession:
    """Probes against one open storage. ``runner`` defaults to ``probes.run_probe`` (each probe in a fresh
    process); only that real runner loads DeepSpeed's ops, so only it has them built first."""

    def __init__(
        self,
        storage: Any,
        runner: Callable[[ProbeRequest], ProbeResult] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.storage = storage
        self.builds_ops = runner is None
        if runner is None:
            from probes import run_probe  # lazy on purpose: probes loads torch

            runner = run_probe
        self.runner = runner
        self.on_note = on_note

    def find(self, item: PlannedProbe) -> Any:
        """The newest stored probe of the same request, reusable or not, or None."""
        return self.storage.find_probe(item.key)

    def stored(self, item: PlannedProbe) -> Any:
        """The stored probe of the same request, or None where there is none or it is not reusable (a timeout
        under a shorter timeout than asked now: :func:`reusable`)."""
        known = self.find(item)
        return known if known is not None and reusable(known, item.request) else None

    def prepare(self, requests: list[ProbeRequest]) -> None:
        """Build the DeepSpeed ops these probes load, once per process, before the first of them runs
        (``probes.prepare_ops``; ``OpBuildError`` when it cannot). Nothing with an injected runner."""
        if self.builds_ops:
            from probes import prepare_ops  # lazy on purpose: probes loads torch

            prepare_ops(requests, on_note=self.on_note)

    def run(self, item: PlannedProbe, run_id: str | None = None) -> tuple[str, ProbeResult]:
        """(probe id, result) of running the planned probe now and saving it (in probe run ``run_id``)."""
        result = self.runner(item.request)
        record = self.storage.save_probe(item.request, result, key=item.key, run_id=run_id)
        return record.probe_id, result

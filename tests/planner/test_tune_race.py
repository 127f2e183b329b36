"""Two tunes of one shared study that pick the same candidate at the same moment (issue 43): the race, made
deterministic. Each tune (of the CPU backend, as the issue's were) runs in a thread of this process on one SQLite
file, with real Optuna and the simulated device of ``test_tune``. Checkpoints hold a tune at its first claim
(``Claims.take``, the one place a tune makes a candidate its own, before the claim is taken) and tune A in its
first probe, until the test lets it go:

1. tune A looks at the study, picks the candidate predicted fastest and stops at its claim;
2. tune B looks at the study (A holds nothing yet), picks the same candidate and stops at its claim;
3. A claims it and starts probing it (and stays in that probe);
4. B claims the candidate it picked in step 2, which A holds, then goes on and ends;
5. A's probe ends, and A goes on and ends.

Each candidate must be probed once, and neither tune may fail. Nothing runs at the same time as anything else,
so the outcome does not depend on timing; the waits have a generous bound only so that a broken tune fails the
test instead of hanging it.

The code before ``planner/tuning/claims.py`` failed this order as the issue's four processes did. Its claim was
Optuna's pop of a waiting trial (``Study._pop_waiting_trial_id``), which reads the trial's state and then
writes RUNNING; on SQLite the read holds no lock. With the same checkpoint between that read and the write, both
tunes probed the candidate and A's ``study.tell`` raised ``UpdateFinishedTrialError``.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

WAIT_S = 300.0  # a bound on a wait, not a timing: each step runs alone
CHECKPOINTS = (("A", "claim"), ("B", "claim"), ("A", "probe"))


class Checkpoints:
    """Holds a thread at the first time it reaches a named point until the test lets it go; records what it
    held there (the candidate picked)."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], str] = {}
        self.arrived = {point: threading.Event() for point in CHECKPOINTS}
        self.go = {point: threading.Event() for point in CHECKPOINTS}

    def reach(self, where: str, what: str) -> None:
        """Called at point ``where`` of the thread: waits there, the first time only, for the test's go."""
        point = (threading.current_thread().name, where)
        if point not in self.arrived or point in self.held:
            return
        self.held[point] = what
        self.arrived[point].set()
        if not self.go[point].wait(WAIT_S):
            raise RuntimeError(f"tune {point[0]} was never let go at its {where}")

    def wait_for(self, point: tuple[str, str], thread: threading.Thread) -> None:
        """Wait until ``thread`` is held at ``point`` (it must not end first)."""
        while not self.arrived[point].wait(1.0):
            assert thread.is_alive(), f"tune {point[0]} ended before it reached its {point[1]}"


def _start(name: str, body: Callable[[], Any], errors: dict[str, BaseException]) -> threading.Thread:
    def target() -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - any failure of a tune is the test's finding
            errors[name] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _ended(thread: threading.Thread) -> None:
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"tune {thread.name} did not end"


def test_two_tunes_picking_one_candidate_at_once_probe_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_tune import SimulatedDevice, _tune

    from planner import probes
    from planner.tuning.claims import Claims
    from store.measurements import ProbeRequest, ProbeResult

    db = str(tmp_path / "plans.db")
    points = Checkpoints()
    take = Claims.take

    def held_take(self: Claims, candidate: str) -> bool:
        points.reach("claim", candidate)
        return take(self, candidate)

    class HeldDevice(SimulatedDevice):
        def __call__(self, request: ProbeRequest) -> ProbeResult:
            points.reach("probe", json.dumps(request.strategy, sort_keys=True))
            return super().__call__(request)

    monkeypatch.setattr(Claims, "take", held_take)
    devices = {"A": HeldDevice(), "B": HeldDevice()}
    errors: dict[str, BaseException] = {}
    tunes: dict[str, threading.Thread] = {}
    for name in ("A", "B"):  # steps 1 and 2
        run = partial(_tune, db, devices[name], "opt-125m", max_probes=12, study="shared", device="cpu")
        tunes[name] = _start(name, run, errors)
        points.wait_for((name, "claim"), tunes[name])
    assert points.held["A", "claim"] == points.held["B", "claim"]  # both picked the same candidate
    points.go["A", "claim"].set()  # step 3
    points.wait_for(("A", "probe"), tunes["A"])
    points.go["B", "claim"].set()  # step 4
    _ended(tunes["B"])
    points.go["A", "probe"].set()  # step 5
    _ended(tunes["A"])
    assert not errors, {name: f"{type(exc).__name__}: {exc}" for name, exc in errors.items()}
    raced = json.dumps(json.loads(points.held["A", "claim"]), sort_keys=True)
    assert points.held["A", "probe"] == raced and raced not in devices["B"].ran  # A's to probe; B moved on
    assert devices["B"].ran  # B probed other candidates meanwhile
    ran = Counter(devices["A"].ran + devices["B"].ran)
    stored = Counter(json.dumps(p.request.strategy, sort_keys=True) for p in probes(db=db, limit=1000))
    assert max(ran.values()) == 1 and stored == ran  # every candidate probed once, every probe stored once

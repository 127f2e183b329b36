"""The cyclic garbage collector during a command: paused for the commands that end in seconds.

A command's objects are freed by their reference counts: a search builds hundreds of thousands of short-lived
steps and predictions, and the ~900 modules it imports (SQLAlchemy, pydantic, optuna, numpy) stay alive to the
end. The cyclic collector finds neither, yet each of its full passes walks every live object: in
``planner recommend --model opt-1.3b --gpu-mem 24G`` (benchmarks/latency.py) 1,994 passes took 1.9 of 13.3 CPU s
(8 full passes 1.24 s), and 0.3 of 2.2 s with ``--workload sft``, with the peak resident memory the same within
2% without them (257 and 263 MB). The commands that run programs for minutes to hours (``probe``, ``tune``) keep it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

COLLECTED_COMMANDS = ("probe", "tune")  # run the user's program or memplan's probes, for minutes to hours


def pauses_collector(args: Sequence[str]) -> bool:
    """Whether the command in ``args`` (the words after ``planner``) runs with the cyclic collector paused: every
    command but those in :data:`COLLECTED_COMMANDS` (and help or no command, which pause it too)."""
    return not args or args[0] not in COLLECTED_COMMANDS


@contextmanager
def collector_paused(args: Sequence[str]) -> Iterator[None]:
    """Pause the cyclic garbage collector for the command in ``args`` where :func:`pauses_collector` says so, and
    turn it back on after (an in-process caller of :func:`planner.cli.main` keeps its collector)."""
    pause = pauses_collector(args) and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()

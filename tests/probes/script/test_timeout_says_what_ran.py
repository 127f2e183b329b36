"""A program's timeout says the phase and what was running (issue 44 item 3): the log's last line, such as the
JIT build of a DeepSpeed op that torch announces (``torch.utils.cpp_extension``: "Building extension module")."""

from __future__ import annotations

from typing import Any

from probes.script.outcome import RankReport, decide
from probes.script.settings import ScriptProbeSettings

BUILDING = "Emitting ninja build file /x/fused_adam/build.ninja...\nBuilding extension module fused_adam..."


def _decide(ranks: list[RankReport], log_tail: str) -> Any:
    settings = ScriptProbeSettings(ds_overrides={}, timed_steps=1)
    return decide(ranks, settings=settings, timed_out=True, exit_code=-9, exited=False, timeout_s=400.0,
                  log_tail=log_tail)  # fmt: skip


def test_a_timeout_in_setup_names_the_op_build_under_way() -> None:
    setup = RankReport(rank=0, events=({"initialize": 1}, {"phase": "setup"}))
    found = _decide([setup], BUILDING)
    assert found.outcome == "timeout" and "in phase setup" in found.message
    assert found.message.endswith("it was running: Building extension module fused_adam...")


def test_a_timeout_before_initialize_names_it_too_and_a_silent_program_adds_nothing() -> None:
    found = _decide([], "Building extension module cpu_adam...")
    assert found.reason == "timeout" and found.message.endswith("it was running: Building extension module cpu_adam...")
    assert "it was running" not in _decide([], "").message

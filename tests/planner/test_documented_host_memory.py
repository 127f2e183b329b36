"""The docs say what the code does for the default of ``--cpu-mem`` (issue 44 item 5).

docs/plans.md once said it defaults to this machine's memory while the code (``planner.job.inputs``) takes the
target's: the ``--node``'s, else the GPU's typical node's host memory per GPU times ``--gpus``; only a probe or
tune, which runs here, takes this machine's. Each doc that states the default must say the code's.
"""

from __future__ import annotations

import re

from planner_helpers import REPO

from planner.job.hardware import resolve_hardware
from planner.job.inputs import JobSpec
from store.nodes import get_node, reference_node

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _stated_defaults() -> dict[str, str]:
    """Each doc's sentence that says what ``--cpu-mem`` defaults to (the job-defaults table's row included)."""
    found = {}
    for path in DOCS:
        raw = path.read_text()
        text = " ".join(raw.split())
        for match in re.finditer(r"`--cpu-mem`[^.|]{0,40}? defaults? to ([^.]*)\.", text):
            found[f"{path.name}: {match.group(0)[:60]}"] = match.group(1)
        row = re.search(r"^\| `--cpu-mem`[^|]*\| ([^|]*)\|", raw, re.MULTILINE)  # the job-defaults table
        if row:
            found[f"{path.name}: table"] = row.group(1)
    return found


def test_the_docs_that_state_the_default_say_the_target_not_this_machine() -> None:
    stated = _stated_defaults()
    assert any(name.startswith("plans.md") for name in stated), stated  # the sentence the issue named
    for name, default in stated.items():
        assert "target" in default, (name, default)
        assert not re.match(r"\s*this machine", default), (name, default)


def test_the_code_takes_the_target_node_for_a_plan_and_this_machine_for_a_probe() -> None:
    typical = reference_node("A100-80G")
    assert typical is not None
    plan = resolve_hardware(JobSpec(model="opt-1.3b", gpu="A100-80G", gpus=2), [])
    assert plan.cpu_memory_bytes == 2 * typical.host_memory_bytes // typical.gpus_per_node
    node = get_node("dgx-h100")
    on_node = resolve_hardware(JobSpec(model="opt-1.3b", node="dgx-h100"), [])
    assert on_node.cpu_memory_bytes == node.host_memory_bytes
    import os

    here = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    probe = resolve_hardware(JobSpec(model="opt-1.3b", gpu="A100-80G"), [], local=True)
    assert abs(probe.cpu_memory_bytes - here) <= here // 100  # this machine's (within the reading's rounding)

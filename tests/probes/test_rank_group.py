"""``probes.process.rank_group``: N ranks under the real ``torch.distributed.run``, ended as one probe, no orphans.

The launcher, its ranks and their helpers are real processes. The group's behaviour on a failing or hung
rank is shown with a small rank program (written to a temporary folder, no torch): every rank announces
itself and starts a helper process (as DeepSpeed's compiler workers are), then one rank fails or none
finishes, as a rank that runs out of memory while the others wait for it in a collective would. Then a
real two-rank DeepSpeed probe that times out. The timeouts are generous (a failure must end the group long
before them) or are the thing under test (then any time the machine takes ends in the same outcome).
"""

from __future__ import annotations

import json
import os
import textwrap
from collections import OrderedDict
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from one_starter import settle_environment
from test_runner import single
from tiny_models import make_hardware

from probes import PHASES, run_probe
from probes.process import preloaded, rank_group
from probes.process.isolation import child_env
from probes.process.rank_group import descendants, launcher_command, rank_env, run_group

pytestmark = pytest.mark.slow

RANK_PROGRAM = """
import json, os, subprocess, sys, time
from pathlib import Path

rank = int(os.environ["RANK"])
folder = Path(sys.argv[1]) / f"rank{rank}"
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with (folder / "events.jsonl").open("a") as events:
    events.write(json.dumps({"pid": os.getpid(), "rank": rank}) + "\\n")
    events.write(json.dumps({"helper": helper.pid, "phase": "backward", "t": 0, "rss": 0}) + "\\n")
request = json.loads((Path(sys.argv[1]) / "request.json").read_text())
if rank == request.get("crashing_rank"):  # ends with a code of its own and no result, as a segfaulting rank does
    logs = [Path(sys.argv[1]) / f"rank{r}" / "events.jsonl" for r in range(int(os.environ["WORLD_SIZE"]))]
    while not all(log.exists() and "helper" in log.read_text() for log in logs):
        time.sleep(0.05)
    os._exit(3)
if rank == request["failing_rank"]:  # fails once every rank has announced itself and its helper
    logs = [Path(sys.argv[1]) / f"rank{r}" / "events.jsonl" for r in range(int(os.environ["WORLD_SIZE"]))]
    while not all(log.exists() and "helper" in log.read_text() for log in logs):
        time.sleep(0.05)
    result = {"outcome": "oom", "failed_phase": "backward", "message": "ProbeOOM: probe memory cap", "phases": []}
    (folder / "result.json.tmp").write_text(json.dumps(result))
    (folder / "result.json.tmp").replace(folder / "result.json")
    sys.exit(1)
time.sleep(600)  # waiting in a collective for the rank that failed
"""


@pytest.fixture(params=["launched", "forked"])
def program(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, str]]]:
    """The rank program and its environment; its ranks under the real launcher, or forked from the preloaded
    starter as a CPU probe's ranks are (``MEMPLAN_PRELOAD`` unset), here one that preloads nothing (the program
    imports no torch). The test's starters are its own: closed at its end, the probes' starters left running."""
    (tmp_path / "rank_program.py").write_text(textwrap.dedent(RANK_PROGRAM))
    env = child_env("cpu", "default")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    env.pop(preloaded.PRELOAD_VARIABLE, None)
    monkeypatch.setattr(preloaded, "_servers", OrderedDict())
    if request.param == "forked":
        monkeypatch.setattr(preloaded, "PRELOADABLE_CHILDREN", frozenset({"rank_program"}))
        monkeypatch.setattr(rank_group, "prepare", partial(preloaded.prepare, modules=()))
        monkeypatch.setattr(rank_group, "start_child", partial(preloaded.start_child, modules=()))
    yield "rank_program", env
    preloaded.close_all()


def pids_of(ranks: list) -> list[int]:
    found = []
    for rank in ranks:
        for event in rank.events:
            found += [event[key] for key in ("pid", "helper") if isinstance(event.get(key), int)]
    return found


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_launcher_runs_one_node_of_n_ranks() -> None:
    command = launcher_command(3, "29999", "probes.step.child", Path("/tmp/x"))
    assert command[1:4] == ["-m", "probes.process.watched", "torch.distributed.run"]
    joined = " ".join(command)
    assert "--nnodes 1 --nproc-per-node 3" in joined and "--master-port 29999" in joined
    assert "--max-restarts 0" in joined and joined.endswith("-m probes.step.child /tmp/x")


def test_a_forked_rank_gets_what_the_launcher_gives_it() -> None:
    env = rank_env({"MASTER_PORT": "29999", "PATH": "/bin"}, 2, 4)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("2", "2", "4", "4")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == (
        "0",
        "1",
        "2",
        "4",
    )
    assert env["MASTER_PORT"] == "29999" and env["OMP_NUM_THREADS"] == "1"  # as torchrun sets it for several ranks
    assert rank_env({"OMP_NUM_THREADS": "2"}, 0, 2)["OMP_NUM_THREADS"] == "2"
    # every rank of a group is served by one starter: the rank variables are each child's own
    assert preloaded.server_key(rank_env(env, 0, 4)) == preloaded.server_key(rank_env(env, 3, 4))


def test_one_failing_rank_ends_the_group_and_nothing_is_left(program: tuple[str, dict[str, str]]) -> None:
    module, env = program
    group = run_group({"failing_rank": 2}, env, timeout_s=300.0, world_size=3, module=module)
    assert group.stopped_after_failure and not group.timed_out
    assert [r.result is not None for r in group.ranks] == [False, False, True]
    assert group.ranks[2].result["outcome"] == "oom"
    assert [r.last_phase for r in group.ranks] == ["backward"] * 3
    pids = pids_of(group.ranks)
    assert len(pids) == 6  # three ranks, three helpers
    assert_gone(pids + [group.pid])
    assert descendants(group.pid) == []


def test_a_rank_that_crashes_ends_the_group_with_its_own_exit_code(program: tuple[str, dict[str, str]]) -> None:
    """The group's return code is the crashed rank's (or, launched, torchrun's for it), not the SIGKILL that
    ended the rank still waiting for it."""
    module, env = program
    group = run_group({"failing_rank": -1, "crashing_rank": 1}, env, timeout_s=300.0, world_size=2, module=module)
    assert not group.timed_out
    forked = group.pid == group.ranks[0].pid  # a forked group is named by rank 0, a launched one by torchrun
    assert group.returncode == (3 if forked else 1), group.log_tail
    assert all(r.result is None for r in group.ranks)
    assert_gone(pids_of(group.ranks) + [group.pid])


def test_a_group_that_never_finishes_is_killed_at_the_timeout(program: tuple[str, dict[str, str]]) -> None:
    module, env = program
    group = run_group({"failing_rank": -1}, env, timeout_s=3.0, world_size=2, module=module)
    assert group.timed_out and not group.stopped_after_failure
    assert all(r.result is None for r in group.ranks)
    assert_gone(pids_of(group.ranks) + [group.pid])


def test_a_real_two_rank_probe_that_times_out_leaves_no_process() -> None:
    settle_environment()
    # far more steps than 2 s hold: ranks forked from the preloaded starter finish a few steps within them
    request = single(timeout_s=2.0, steps=100_000, hardware=make_hardware(gpus=2).to_dict())
    request.workload["global_batch"] = 4
    result = run_probe(request)
    assert result.outcome == "timeout", result.message
    assert result.failed_phase in (None, "startup", "setup", *PHASES["sft"])
    assert "rank group killed" in result.message
    assert result.extra["world_size"] == 2 and len(result.extra["ranks"]) == 2
    assert_gone([r["pid"] for r in result.extra["ranks"] if r.get("pid")])
    assert json.dumps(result.to_dict())  # the record stays JSON

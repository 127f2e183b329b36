"""A CPU probe child forked from the preloaded starter is the child ``python -m`` would have started.

Real processes: the real starter (:mod:`probes.process.preload_server`, here with nothing to preload, so each test
costs a Python start) forks small programs written into the test's folder; one test runs the same tiny probe
with the starter and without it and compares what the tracker measured.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import textwrap
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest
from one_starter import settle_environment
from tiny_models import make_hardware, tiny_llama_hf_config

from probes.process import preloaded
from probes.process.isolation import child_env
from probes.process.preloaded import ForkedChild, start_child
from store.processes import pid_alive

PATIENCE_S = 120.0  # the most a small program may take to start and end on a busy 2-core machine

PROGRAM = """
import gc, json, os, sys, time
out = {
    "name": __name__, "argv": sys.argv[1:], "cwd": os.getcwd(), "marker": os.environ.get("MARKER"),
    "port": os.environ.get("MASTER_PORT"), "own_group": os.getpgid(0) == os.getpid(),
    "own_session": os.getsid(0) == os.getpid(), "ppid": os.getppid(), "stdin": sys.stdin.read(),
    "frozen": gc.get_freeze_count(),
}
with open("seen.json", "w") as handle:
    json.dump(out, handle)
print("to stdout")
print("to stderr", file=sys.stderr)
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


@pytest.fixture
def program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, dict[str, str]]]:
    """A folder holding ``memplan_forked_program.py``, an environment for it, starters that preload nothing: the
    test's own, closed at its end (the probes' starters are left running, and out of its count)."""
    (tmp_path / "memplan_forked_program.py").write_text(textwrap.dedent(PROGRAM), encoding="utf-8")
    monkeypatch.setattr(preloaded, "PRELOADABLE_CHILDREN", frozenset({"memplan_forked_program"}))
    monkeypatch.setattr(preloaded, "_servers", OrderedDict())
    env = child_env("cpu", "default")
    env.pop(preloaded.PRELOAD_VARIABLE, None)
    env["MARKER"] = "forked"
    yield tmp_path, env
    preloaded.close_all()


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.05)


def start(folder: Path, env: dict[str, str], *args: str) -> preloaded.StartedChild:
    with (folder / "child.log").open("wb") as log:
        return start_child("memplan_forked_program", list(args), folder, env, log, modules=())


def test_a_forked_child_is_the_module_run_as_main_in_its_folder_session_and_environment(
    program: tuple[Path, dict[str, str]],
) -> None:
    folder, env = program
    child = start(folder, env, "0", "0", "3")
    assert isinstance(child, ForkedChild)  # forked by the starter, not started by Popen
    assert child.wait(PATIENCE_S) == 3
    seen = json.loads((folder / "seen.json").read_text(encoding="utf-8"))
    assert seen["name"] == "__main__" and seen["argv"] == ["0", "0", "3"]
    assert Path(seen["cwd"]) == folder.resolve() and seen["marker"] == "forked" and seen["port"] == env["MASTER_PORT"]
    assert seen["own_group"] and seen["own_session"] and seen["stdin"] == ""
    assert seen["ppid"] != os.getpid()  # the starter's child, not ours
    # what the starter imported is out of the collector's reach: a child's gc.collect() walks only its own objects
    assert seen["frozen"] > 0
    log = (folder / "child.log").read_text(encoding="utf-8")
    assert "to stdout" in log and "to stderr" in log


def test_a_child_ended_by_a_signal_reads_as_popen_says_and_its_cpu_seconds_are_counted(
    program: tuple[Path, dict[str, str]],
) -> None:
    folder, env = program
    before = preloaded.reaped_cpu_s()
    busy = start(folder, env, "0.3", "0", "0")
    assert busy.wait(PATIENCE_S) == 0
    assert preloaded.reaped_cpu_s() - before >= 0.3  # its CPU, reported by the starter that reaped it
    sleeper = start(folder, env, "0", "600", "0")
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(0.2)
    shown = Path(f"/proc/{sleeper.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    assert shown[1:3] == [b"-m", b"memplan_forked_program"]  # what ps shows: the child it is (cut to the room)
    os.killpg(sleeper.pid, signal.SIGKILL)  # its group is its pid, as with start_new_session
    assert sleeper.wait(PATIENCE_S) == -signal.SIGKILL


def test_a_closed_starters_children_count_once(program: tuple[Path, dict[str, str]]) -> None:
    """While the starter runs, its ended children's CPU seconds are in reaped_cpu_s; once it is reaped they are in
    this process's RUSAGE_CHILDREN, and only there."""
    folder, env = program
    before = preloaded.reaped_cpu_s()
    assert start(folder, env, "0.5", "0", "0").wait(PATIENCE_S) == 0
    reported = preloaded.reaped_cpu_s() - before
    assert reported >= 0.5
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    preloaded.close_all()  # the test's own starter
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime >= reported - 0.02
    assert preloaded.reaped_cpu_s() == pytest.approx(before)


def test_one_starter_serves_one_environment_but_each_child_its_own_port(program: tuple[Path, dict[str, str]]) -> None:
    folder, env = program
    first = start(folder, env, "0", "0", "0")
    second = start(folder, {**env, "MASTER_PORT": "1", "PYTEST_CURRENT_TEST": "a.py::b (call)"}, "0", "0", "0")
    other = start(folder, {**env, "MARKER": "other"}, "0", "0", "0")
    assert isinstance(first, ForkedChild) and isinstance(second, ForkedChild) and isinstance(other, ForkedChild)
    assert first.server is second.server and other.server is not first.server
    for child in (first, second, other):
        assert child.wait(PATIENCE_S) == 0


def test_a_starter_with_a_child_running_is_not_evicted_for_another_environment(
    program: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, env = program
    monkeypatch.setattr(preloaded, "MAX_SERVERS", 1)
    sleeper = start(folder, env, "0", "600", "0")  # another thread's probe, still running
    assert isinstance(sleeper, ForkedChild)
    wait_for(folder / "seen.json")
    other = start(folder, {**env, "MARKER": "other"}, "0", "0", "0")
    assert isinstance(other, subprocess.Popen)  # started plainly: no room for a starter of its own
    assert other.wait(PATIENCE_S) == 0
    assert pid_alive(sleeper.pid)  # the running child was left alone
    os.killpg(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(PATIENCE_S) == -signal.SIGKILL
    again = start(folder, {**env, "MARKER": "other"}, "0", "0", "0")
    assert isinstance(again, ForkedChild) and again.server is not sleeper.server  # the idle starter made room
    assert again.wait(PATIENCE_S) == 0


def test_closing_the_starter_ends_the_children_still_running(program: tuple[Path, dict[str, str]]) -> None:
    folder, env = program
    sleeper = start(folder, env, "0", "600", "0")
    assert isinstance(sleeper, ForkedChild)
    wait_for(folder / "seen.json")
    preloaded.close_all()
    assert not pid_alive(sleeper.pid)


def test_switched_off_or_on_another_device_the_child_is_started_plainly(program: tuple[Path, dict[str, str]]) -> None:
    folder, env = program
    for changed in ({preloaded.PRELOAD_VARIABLE: "0"}, {"DS_ACCELERATOR": "cuda"}):
        child = start(folder, {**env, **changed}, "0", "0", "0")
        assert isinstance(child, subprocess.Popen)
        assert child.wait(PATIENCE_S) == 0


@pytest.mark.slow
def test_a_probe_forked_from_the_starter_measures_what_a_fresh_process_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from probes import run_probe
    from store.measurements import ProbeRequest

    config = {"model_type": "llama", **tiny_llama_hf_config(), "num_hidden_layers": 2}
    workload = {"kind": "sft", "model": "tiny", "seq_len": 16, "global_batch": 2, "dtype": "bf16",
                "attn_impl": "sdpa", "hf_configs": {"model": config}}  # fmt: skip
    request = ProbeRequest(
        workload, {"zero_stage": 0, "micro_batch": 2}, make_hardware().to_dict(), device="cpu", steps=2,
        timeout_s=3600.0,
    )  # fmt: skip
    settle_environment()  # the forked run's starter is the one the other probes of the session use
    peaks, extras = {}, {}
    for switch in ("0", "1"):
        if switch == "0":
            monkeypatch.setenv(preloaded.PRELOAD_VARIABLE, switch)
        else:  # unset: on, as by default
            monkeypatch.delenv(preloaded.PRELOAD_VARIABLE)
        before = preloaded.reaped_cpu_s()
        result = run_probe(request)
        assert result.outcome == "ok", result.message
        assert (preloaded.reaped_cpu_s() > before) == (switch == "1")  # forked only when switched on
        peaks[switch] = [(p.name, p.peak_allocated_bytes) for p in result.phases]
        extras[switch] = {key: result.extra.get(key) for key in ("bytes_before_setup", "resident_bytes")}
    assert peaks["1"] == peaks["0"] and len(peaks["0"]) == 3
    assert extras["1"] == extras["0"]


def test_py_cpuinfo_is_asked_once_a_process() -> None:
    cpuinfo = pytest.importorskip("cpuinfo")
    from probes.process.cpu_info import cache_cpu_info

    asked: list[int] = []
    original = cpuinfo.get_cpu_info
    try:
        cpuinfo.get_cpu_info = lambda: asked.append(1) or {"flags": ["avx2"], "arch": "X86_64"}
        cache_cpu_info()
        first = cpuinfo.get_cpu_info()
        first["flags"].append("changed by a caller")  # a caller's change does not reach the next caller's answer
        second = cpuinfo.get_cpu_info()
        cache_cpu_info()  # a second call keeps the one cache
        assert cpuinfo.get_cpu_info()["arch"] == "X86_64"
    finally:
        cpuinfo.get_cpu_info = original
    assert len(asked) == 1 and "changed by a caller" not in second["flags"]

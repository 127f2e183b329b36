"""A probe killed while it holds torch's JIT-extension lock leaves no lock that hangs the next load.

Found in the suite: a timeout test killed a rank inside ``deepspeed.init_distributed``'s load of the
shared-memory allreduce op, ``<torch_extensions>/py311_cpu/deepspeed_shm_comm/lock`` stayed behind, and the
next probe slept in ``FileBaton.wait`` until its own timeout. The processes here are real (torch's own
``FileBaton``, the probes' own ``run_child``); the holder kills itself at a known point, so nothing depends on
how fast this machine is, and every wait has a generous timeout that only a hang would reach.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from probes.process.isolation import child_env, run_child
from probes.process.jit_lock import extensions_root, holder_is_gone, release_stale_locks

HANG_GUARD_S = 300.0  # only a process that waits forever reaches it


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lock(root: Path, name: str, text: str) -> Path:
    lock = root / "py311_cpu" / name / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(text)
    return lock


def test_only_locks_of_holders_gone_from_this_host_are_released(tmp_path: Path) -> None:
    host = socket.gethostname()
    dead = _lock(tmp_path, "cpu_adam", f"{host} {_dead_pid()}")
    live = _lock(tmp_path, "fused_adam", f"{host} {os.getpid()}")
    unnamed = _lock(tmp_path, "deepspeed_shm_comm", "")  # torch's own baton: no holder written
    elsewhere = _lock(tmp_path, "async_io", f"not-{host} {_dead_pid()}")
    assert release_stale_locks(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and unnamed.exists() and elsewhere.exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="zombie state is read from /proc (Linux)")
def test_a_killed_holder_not_yet_reaped_is_gone(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    lock = _lock(tmp_path, "cpu_adam", f"{socket.gethostname()} {proc.pid}")
    try:
        assert not holder_is_gone(lock)
        proc.kill()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, still a zombie: not reaped
        assert holder_is_gone(lock)
    finally:
        proc.wait()


def test_the_extensions_root_is_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert extensions_root({"TORCH_EXTENSIONS_DIR": "/x/ext"}) == Path("/x/ext")
    assert extensions_root({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/torch_extensions")
    # torch's own answer, here (it reads XDG_CACHE_HOME and HOME as it is called, as a child would)
    from torch.utils.cpp_extension import get_default_build_root

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "")
    assert Path(get_default_build_root()) == extensions_root().resolve()


HOLDER = """
import os, signal, sys
from pathlib import Path
from probes.process.jit_lock import extensions_root, install
install()
from torch.utils.file_baton import FileBaton
lock = extensions_root() / "py311_cpu" / "deepspeed_shm_comm" / "lock"
lock.parent.mkdir(parents=True, exist_ok=True)
baton = FileBaton(str(lock))
assert baton.try_acquire()
print("holder:", lock.read_text(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # killed inside the load, as a probe at its timeout
"""

WAITER = """
from probes.process.jit_lock import extensions_root, install
install()
from torch.utils.file_baton import FileBaton
lock = extensions_root() / "py311_cpu" / "deepspeed_shm_comm" / "lock"
FileBaton(str(lock)).wait()
print("waited", lock.exists())
"""


def _script(tmp_path: Path, name: str, text: str) -> tuple[str, dict[str, str]]:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    env = child_env("cpu", "default")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    return name, env


def test_the_parent_releases_the_lock_its_killed_child_held(tmp_path: Path) -> None:
    module, env = _script(tmp_path, "holder", HOLDER)
    run = run_child({}, env, timeout_s=HANG_GUARD_S, module=module)
    assert run.returncode == -signal.SIGKILL and not run.timed_out, run.log_tail
    assert f"holder: {socket.gethostname()} {run.pid}" in run.log_tail  # the baton named its holder
    assert not (tmp_path / "ext" / "py311_cpu" / "deepspeed_shm_comm" / "lock").exists()


def test_a_probe_outwaits_only_a_live_holder(tmp_path: Path) -> None:
    """The waiter's side, for a lock no parent released (the parent died too): it is taken over."""
    module, env = _script(tmp_path, "waiter", WAITER)
    lock = _lock(tmp_path / "ext", "deepspeed_shm_comm", f"{socket.gethostname()} {_dead_pid()}")
    done = subprocess.run(
        [sys.executable, "-m", module], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0 and "waited False" in done.stdout, done.stderr[-2000:]
    assert not lock.exists()


TOLD = """
from probes.process.jit_lock import extensions_root, install, waiting_step
def told(lock):
    print("step:", waiting_step(lock), flush=True)
    lock.unlink()  # the other process's build ends
install(on_wait=told)
from torch.utils.file_baton import FileBaton
lock = extensions_root() / "py311_cpu" / "fused_adam" / "lock"
FileBaton(str(lock)).wait()
print("waited", lock.exists())
"""


def test_a_wait_on_a_lock_of_unknown_holder_is_reported_as_a_step_naming_the_file(tmp_path: Path) -> None:
    """A lock torch's own baton took (no holder written) may be a build that is running: the child waits, and
    says on what, so a build that times out names the file to look at."""
    module, env = _script(tmp_path, "told", TOLD)
    lock = _lock(tmp_path / "ext", "fused_adam", "")
    done = subprocess.run(
        [sys.executable, "-m", module], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"step: waiting on {lock} (another process's build" in done.stdout and "waited False" in done.stdout

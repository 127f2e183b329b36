"""torch's JIT-extension lock, made safe against a probe that is killed while it holds it.

DeepSpeed loads every compiled op it uses (CPU Adam, FusedAdam, and on the CPU accelerator the shared-memory
allreduce that ``deepspeed.init_distributed`` loads) through ``torch.utils.cpp_extension.load``. Each load,
even of an op built long ago, takes a ``torch.utils.file_baton.FileBaton``: it creates ``<build
dir>/lock`` with ``O_EXCL``, runs ninja (a no-op once built) and removes the file; a process that finds the
file sleeps until it is gone. A probe killed at its timeout inside that window leaves the file behind, and
every later load on the machine (the next probe, the user's own training) waits on it forever. Found in the
suite: a timeout test's killed rank left ``deepspeed_shm_comm/lock``, and the next probe slept in
``FileBaton.wait`` until its own timeout.

- :func:`install` (called first in every probe child) makes each baton the process takes write
  ``<host> <pid>`` into its lock file, and makes ``wait`` remove a lock whose recorded holder is gone and
  return: torch then imports what the holder built (if the holder died inside a first build, that import
  fails once, as one clear error, and the next load builds again).
- :func:`release_stale_locks` (called by the parent once a child's process group is gone) removes every
  lock file under the torch extensions root whose recorded holder is gone.

A lock file without a holder recorded here (taken by a process that is not a probe, or on another host)
is never touched. Pure Python: the parent imports no torch here.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from store.processes import pid_alive

LOCK_NAME = "lock"  # torch.utils.cpp_extension._jit_compile: FileBaton(os.path.join(build_directory, "lock"))


def extensions_root(env: dict[str, str] | None = None) -> Path:
    """Where torch builds JIT extensions (``torch.utils.cpp_extension.get_default_build_root``):
    ``TORCH_EXTENSIONS_DIR``, else ``torch_extensions`` in the user's cache folder."""
    env = dict(os.environ if env is None else env)
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torch_extensions"


def holder_line() -> str:
    """What this process writes into a lock file it takes."""
    return f"{socket.gethostname()} {os.getpid()}"


def holder_is_gone(lock: Path) -> bool:
    """Whether ``lock`` records a holder on this host that is no longer running (False when unsure)."""
    try:
        fields = lock.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return False
    if len(fields) != 2 or fields[0] != socket.gethostname() or not fields[1].isdigit():
        return False
    return not pid_alive(int(fields[1]))


def release_stale_locks(root: Path | None = None) -> list[Path]:
    """Remove the JIT-extension lock files under ``root`` (default :func:`extensions_root`) whose recorded
    holder is gone; returns the files removed."""
    root = extensions_root() if root is None else root
    removed = []
    for pattern in (f"*/{LOCK_NAME}", f"*/*/{LOCK_NAME}"):  # <root>/<name>/lock, <root>/py311_cpu/<name>/lock
        for lock in root.glob(pattern):
            if holder_is_gone(lock):
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                    removed.append(lock)
    return removed


def waiting_step(lock: Path) -> str:
    """The step a child reports while it waits on ``lock`` (a timeout then names the file to look at)."""
    return (
        f"waiting on {lock} (another process's build of that op, or a lock a killed process left: remove it if "
        "no build is running)"
    )


def install(on_wait: Callable[[Path], None] | None = None) -> None:
    """Make this process's ``FileBaton``s record their holder and outwait only a live one; ``on_wait(lock)`` is
    called when a wait on a lock held by a live or unknown holder begins (idempotent: the first call's hook
    stays)."""
    import time

    from torch.utils import file_baton

    baton = file_baton.FileBaton
    if getattr(baton, "_memplan_holder", False):
        return
    acquire = baton.try_acquire

    def try_acquire(self: Any) -> bool | None:
        taken = acquire(self)
        if taken:  # torch opened the file read-only: write the holder through the path it owns now
            Path(self.lock_file_path).write_text(holder_line(), encoding="utf-8")
        return taken

    def wait(self: Any) -> None:
        lock = Path(self.lock_file_path)
        told = False
        while lock.exists():
            if holder_is_gone(lock):
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                return
            if on_wait is not None and not told:
                told = True
                on_wait(lock)
            time.sleep(self.wait_seconds)

    setattr(baton, "try_acquire", try_acquire)  # noqa: B010 - torch's class, patched in this process only
    setattr(baton, "wait", wait)  # noqa: B010
    setattr(baton, "_memplan_holder", True)  # noqa: B010

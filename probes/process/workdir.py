"""The probe's working folder: ``memplan-probe-<pid>-*`` in the temporary folder, named for its owner.

Each child the planner starts works in a folder of its own (its request, events, result, log and
allocation records), made by :func:`probe_folder` and removed when the child is done, also when the
planner stops on an error, Ctrl-C, SIGTERM or SIGHUP. A planner that is killed (SIGKILL) cannot remove it;
the folder names its owner (the pid in its name, and ``<host> <pid>`` in its ``owner`` file), and the next
:func:`probe_folder` of any planner removes the folders whose owner no longer runs
(:func:`remove_stale_folders`). Pure Python: no torch here.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from probes.process.jit_lock import holder_is_gone, holder_line
from store.processes import pid_alive

__all__ = ["OWNER_FILE", "PREFIX", "probe_folder", "remove_stale_folders"]

PREFIX = "memplan-probe-"
OWNER_FILE = "owner"
_NAMED = re.compile(rf"^{PREFIX}(\d+)-")


def _is_stale(folder: Path) -> bool:
    owner = folder / OWNER_FILE
    if owner.exists():
        return holder_is_gone(owner)
    named = _NAMED.match(folder.name)  # killed before it wrote its owner file: the pid in its name
    return named is not None and not pid_alive(int(named.group(1)))


def remove_stale_folders(root: Path | None = None) -> list[Path]:
    """Remove the probe folders under ``root`` (default: the temporary folder) of this user whose owner is
    gone; returns the folders removed (never raises)."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed: list[Path] = []
    try:
        found = list(root.glob(f"{PREFIX}*"))
    except OSError:
        return removed
    for folder in found:
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _is_stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
    return removed


@contextmanager
def probe_folder() -> Iterator[Path]:
    """A fresh working folder for one child, removed on the way out (stale folders of gone planners first)."""
    remove_stale_folders()
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-") as tmp:
        folder = Path(tmp)
        (folder / OWNER_FILE).write_text(holder_line(), encoding="utf-8")
        yield folder

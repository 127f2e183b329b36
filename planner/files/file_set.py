"""Several files written as one: every file or none, also when the planner is killed part way.

:func:`write_files` writes each new content beside its target under a name this module recognises,
``.<name>.memplan-<host>-<pid>-<random>.tmp`` (``<host>``: six hex digits of a hash of the host name), and
syncs it. Only when every one is written does it keep each existing target as a backup (``...bak``: a hard
link, a copy where the file system has none), write a journal of the set (``...journal`` beside the first
target), and rename the new files over their targets; then it removes the journal and the backups. A failure
at any point (a full disk, a target that cannot be replaced, an interrupt) puts back what it had replaced: a
backup is renamed back over its target, a target that did not exist before is removed. The user's files are
never deleted, and its own marked files are removed before the error is raised.

A process killed (SIGKILL) part way leaves its marked files behind. The next write into that folder removes
those of owners that are gone (this host, a pid that no longer runs) and, where a journal is left, first
rolls its set back: a target it had replaced, and that nobody changed since (same inode, size and time),
gets its backup back (or is removed, when the set had created it). So between runs, nothing but the user's
files stays beside the targets, and a set of files is the old set or the whole new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from store.errors import InputError
from store.processes import pid_alive

__all__ = ["MARK", "remove_stale", "write_files"]

HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]
MARK = ".memplan-"  # in the name of every file this module makes
_MARKED = re.compile(r"\.memplan-([0-9a-f]{6})-(\d+)-[A-Za-z0-9_]+\.(tmp|bak|journal)$")
_NAME_KEEP = 64  # characters of the target's name kept in a marked name (the rest may not fit)


@dataclass
class _Entry:
    """One target of a set: its staged new file, the backup of what it held, whether it is replaced."""

    target: Path
    temp: Path
    backup: Path | None = None
    stat: tuple[int, int, int, int] = (0, 0, 0, 0)  # the new file's (dev, inode, size, mtime_ns)

    def replaced(self) -> bool:
        """Whether the new file is in the target's place now (and nobody has changed it since)."""
        try:
            return not os.path.lexists(self.temp) and _stat_of(self.target) == self.stat
        except OSError:
            return False


def _prefix(target: Path) -> str:
    return f".{target.name[:_NAME_KEEP]}{MARK}{HOST}-{os.getpid()}-"


def _marked_name(target: Path, kind: str) -> Path:
    return target.with_name(f"{_prefix(target)}{secrets.token_hex(6)}.{kind}")


def _stale(path: Path) -> str | None:
    """The kind (tmp, bak, journal) of a marked file whose owner is gone, else None."""
    found = _MARKED.search(path.name)
    if found is None or found.group(1) != HOST or not path.name.startswith("."):
        return None
    pid = int(found.group(2))
    return None if pid == os.getpid() or pid_alive(pid) else found.group(3)


def _stat_of(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def remove_stale(folder: Path) -> list[Path]:
    """Finish the writes into ``folder`` of processes that are gone (see the module docstring); returns the
    marked files removed. Never raises: what cannot be read or removed is left."""
    removed: list[Path] = []
    try:
        names = sorted(folder.iterdir(), key=lambda p: not p.name.endswith(".journal"))  # journals first
    except OSError:
        return removed
    for path in names:
        kind = _stale(path)
        if kind is None:
            continue
        if kind == "journal":
            _roll_back_journal(path)
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def _roll_back_journal(journal: Path) -> None:
    try:
        entries = json.loads(journal.read_text(encoding="utf-8"))["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    for item in entries:
        with contextlib.suppress(OSError, KeyError, TypeError, ValueError):
            backup = Path(item["backup"]) if item["backup"] else None
            dev, ino, size, mtime = (int(v) for v in item["stat"])
            _undo(_Entry(Path(item["target"]), Path(item["temp"]), backup, (dev, ino, size, mtime)))


def _undo(entry: _Entry) -> None:
    """Put back what ``entry`` replaced and remove its own files (best effort, never raises)."""
    with contextlib.suppress(OSError):
        if entry.replaced():
            if entry.backup is not None:
                os.replace(entry.backup, entry.target)
            else:
                entry.target.unlink()
    for own in (entry.temp, entry.backup):
        if own is not None:
            with contextlib.suppress(OSError):
                own.unlink()


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _mode_for(target: Path) -> int:
    """The permissions the new file gets: the replaced file's, else what ``open`` would give a new one."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _stage(target: Path, data: bytes) -> _Entry:
    folder = target.parent
    try:
        fd, name = tempfile.mkstemp(prefix=_prefix(target), suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None
    entry = _Entry(target, Path(name))
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _mode_for(target))  # mkstemp made it 0600
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        entry.stat = _stat_of(entry.temp)
    except BaseException:
        _undo(entry)
        raise
    return entry


def _keep_backup(entry: _Entry) -> None:
    if not os.path.lexists(entry.target):
        return
    backup = _marked_name(entry.target, "bak")
    try:
        os.link(entry.target, backup, follow_symlinks=False)
    except OSError:  # no hard links here (or a symlink target): a copy of what the user had
        shutil.copy2(entry.target, backup, follow_symlinks=False)
    entry.backup = backup


def _write_journal(entries: list[_Entry]) -> Path:
    first = entries[0].target
    journal = _marked_name(first, "journal")
    staging = _marked_name(first, "tmp")
    data = [
        {"target": str(e.target.absolute()), "temp": str(e.temp.absolute()),
         "backup": str(e.backup.absolute()) if e.backup else None, "stat": list(e.stat)}
        for e in entries
    ]  # fmt: skip
    try:
        with staging.open("w", encoding="utf-8") as handle:
            json.dump({"entries": data}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, journal)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return journal


def _sync_folders(entries: list[_Entry]) -> None:
    for folder in {e.target.parent for e in entries}:
        with contextlib.suppress(OSError):
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def write_files(targets: dict[Path, bytes]) -> list[Path]:
    """Write every ``data`` to its ``target`` as one: all of them or, on any problem, none (the targets keep
    what they held). Raises InputError (one line) for a failed write. Checks nothing else: the caller has
    refused folders and existing files it may not replace."""
    for folder in dict.fromkeys(t.parent for t in targets):
        remove_stale(folder)
    entries: list[_Entry] = []
    journal: Path | None = None
    current = next(iter(targets), Path("."))
    try:
        for target, data in targets.items():
            current = target
            entries.append(_stage(target, data))
        if len(entries) > 1:  # one rename is atomic by itself; several need a way back
            for entry in entries:
                current = entry.target
                _keep_backup(entry)
            journal = _write_journal(entries)
        for entry in entries:
            current = entry.target
            os.replace(entry.temp, entry.target)
        _sync_folders(entries)
    except BaseException as exc:
        for entry in reversed(entries):
            _undo(entry)
        if journal is not None:
            journal.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise InputError(f"cannot write {current}: {exc.strerror or exc}") from None
        raise
    if journal is not None:
        journal.unlink(missing_ok=True)  # the set is written: nothing to roll back from here on
    for entry in entries:
        if entry.backup is not None:
            entry.backup.unlink(missing_ok=True)
    return list(targets)

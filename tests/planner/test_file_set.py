"""Several files written as one (``planner.files.atomic.write_texts``): a failure part way puts back what it had
replaced,
and a planner killed part way leaves nothing that the next write does not clean up and roll back.

The failures are real ones where a test can make them: ``os.replace`` refused for one target (as a target made
immutable, or on a file system that refuses it, would), and a real SIGKILL of a real process in the middle of
the renames (the process kills itself at the chosen rename, so the moment is exact, not a race).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from planner_helpers import REPO

from planner.files.atomic import write_bytes_atomic, write_texts
from planner.files.file_set import MARK, remove_stale
from store.errors import InputError

ROLES = ("actor", "critic", "reference", "reward")


def _targets(folder: Path) -> list[Path]:
    return [folder / f"ds.{role}.json" for role in ROLES]


def _old_files(folder: Path) -> dict[Path, str]:
    old = {path: f'{{"old": "{path.name}"}}\n' for path in _targets(folder)}
    for path, text in old.items():
        path.write_text(text)
    return old


def _new_texts(folder: Path) -> dict[Path, str]:
    return {path: f'{{"new": "{path.name}"}}\n' for path in _targets(folder)}


def _contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_a_failed_replace_puts_back_every_file_it_had_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _old_files(tmp_path)
    third = _targets(tmp_path)[2]
    real_replace = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        if Path(dst) == third:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(InputError, match=r"cannot write .*ds\.reference\.json: Operation not permitted"):
        write_texts(_new_texts(tmp_path), force=True)
    monkeypatch.undo()
    assert _contents(tmp_path) == {p.name: text for p, text in old.items()}  # the old four, nothing else


def test_a_failed_write_of_new_files_leaves_none_of_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.txt").write_text("the user's")
    third = _targets(tmp_path)[2]
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # the third file's data does not fit
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / f".{third.name}")):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(InputError, match="No space left on device"):
        write_texts(_new_texts(tmp_path))
    monkeypatch.undo()
    assert _contents(tmp_path) == {"mine.txt": "the user's"}


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from planner.files.atomic import write_texts

folder, kill_at = Path(sys.argv[1]), int(sys.argv[2])
roles = ("actor", "critic", "reference", "reward")
real_replace, seen = os.replace, []

def replace(src, dst):
    if Path(dst).name in {f"ds.{r}.json" for r in roles}:
        seen.append(dst)
        if len(seen) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)

os.replace = replace
write_texts({folder / f"ds.{r}.json": '{"new": "ds.%s.json"}\\n' % r for r in roles}, force=True)
"""


@pytest.mark.parametrize("kill_at", [1, 3, 4])
def test_a_write_killed_part_way_is_rolled_back_by_the_next_one(tmp_path: Path, kill_at: int) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    old = _old_files(folder)
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(KILLED_WRITER))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script), str(folder), str(kill_at)], env=env, timeout=120, check=False)
    assert done.returncode == -9
    assert any(MARK in p.name for p in folder.iterdir())  # what the killed writer left
    write_bytes_atomic(folder / "other.json", b"{}\n")  # the next write into that folder
    expected = {p.name: text for p, text in old.items()} | {"other.json": "{}\n"}
    assert _contents(folder) == expected


def test_marked_files_of_a_live_writer_are_left_alone(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import planner.files.file_set as file_set

        name = f".ds.json{MARK}{file_set.HOST}-{sleeper.pid}-abc123.tmp"
        (tmp_path / name).write_text("in progress")
        assert remove_stale(tmp_path) == []
        sleeper.kill()
        sleeper.wait()
        assert remove_stale(tmp_path) == [tmp_path / name]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_replaced_file_keeps_its_permissions_and_a_new_one_gets_the_umasks(tmp_path: Path) -> None:
    kept, new = tmp_path / "kept.json", tmp_path / "new.json"
    kept.write_text("{}")
    kept.chmod(0o640)
    old_umask = os.umask(0o027)
    try:
        write_texts({kept: "[]\n", new: "[]\n"}, force=True)
    finally:
        os.umask(old_umask)
    assert (kept.stat().st_mode & 0o777, new.stat().st_mode & 0o777) == (0o640, 0o640)

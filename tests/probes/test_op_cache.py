"""The probes build DeepSpeed's ops in a folder of memplan's own environment, not in torch's shared default
(``~/.cache/torch_extensions``, one folder for every virtualenv of the same Python), unless the user named one
with ``TORCH_EXTENSIONS_DIR``; the build note says where.

The last case starts the real build child on DeepSpeed's CPU accelerator for its shared-memory allreduce (the
suite loads it anyway, from the same folder: ``tests/conftest.py`` points the whole session at it), with
torch's default folder moved to an empty place that must stay empty.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from test_op_build import FakeBuild, sft

from probes.ops.prepare import build_in_child, forget_builds, prepare_ops
from probes.process.isolation import child_env
from probes.process.op_cache import VARIABLE, default_ops_folder

LEAF = f"py{sys.version_info.major}{sys.version_info.minor}"


def test_probe_children_build_ops_in_a_folder_of_this_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    cpu, cuda = (Path(child_env(device, "default")[VARIABLE]) for device in ("cpu", "cuda"))
    assert cpu == Path(sys.prefix) / "var" / "cache" / "memplan" / "torch_extensions" / f"{LEAF}_cpu"
    assert cuda == cpu.with_name(f"{LEAF}_cuda")  # DeepSpeed's CPU and CUDA builds of an op share its name
    assert cpu.is_dir()


def test_the_users_own_folder_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(VARIABLE, str(tmp_path / "mine"))
    assert child_env("cpu", "default")[VARIABLE] == str(tmp_path / "mine")
    monkeypatch.setenv(VARIABLE, "")  # empty is unset (torch would build in the working folder)
    assert child_env("cpu", "default")[VARIABLE] == str(default_ops_folder("cpu"))


def test_an_environment_that_cannot_be_written_gets_a_folder_of_its_own_in_the_user_cache(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    blocked = tmp_path / "system-python"
    blocked.write_text("a file: nothing can be made under it")  # as a prefix root cannot write to
    other = tmp_path / "other" / "system-python"
    other.parent.mkdir()
    other.write_text("")
    folder = default_ops_folder("cpu", env, prefix=str(blocked))
    digest = hashlib.sha1(str(blocked.resolve()).encode()).hexdigest()[:10]
    assert folder == tmp_path / "cache" / "memplan" / "torch_extensions" / f"system-python-{digest}" / f"{LEAF}_cpu"
    assert default_ops_folder("cpu", env, prefix=str(other)) != folder  # another environment, another folder


def test_the_build_note_says_where(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    forget_builds()
    notes: list[str] = []
    try:
        prepare_ops([sft(device="cpu")], on_note=notes.append, build=FakeBuild())
    finally:
        forget_builds()
    assert len(notes) == 1 and notes[0].endswith(f"; built in {default_ops_folder('cpu')}"), notes


@pytest.mark.slow
def test_deepspeed_builds_and_loads_its_op_there_and_not_in_torchs_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where torch's default folder would be
    env = child_env("cpu", "default")
    outcome = build_in_child("cpu", ("ShareMemCommBuilder",), env, 1800.0)
    assert outcome.ok, (outcome.message, outcome.log_tail[-2000:])
    if "ShareMemCommBuilder" in outcome.skipped:
        pytest.skip("DeepSpeed skips its shared-memory allreduce on this machine: no op to build")
    assert (default_ops_folder("cpu") / "deepspeed_shm_comm").is_dir()
    assert not any((tmp_path / "cache").rglob("*")), os.listdir(tmp_path / "cache")


def test_every_child_builds_with_this_environments_ninja_whatever_the_callers_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch runs ``ninja`` from ``PATH``; pip's ninja in the venv and the system's hash a command line differently
    in ``.ninja_log``, so a caller with the venv activated and one without rebuilt each other's ops (issue 44)."""
    import shutil

    from probes.process.op_cache import environment_ninja

    ninja = environment_ninja()
    if ninja is None:
        pytest.skip("this environment has no ninja of its own: the PATH's is the only one")
    for path in ("/usr/bin:/bin", f"{ninja.parent}{os.pathsep}/usr/bin:/bin"):
        monkeypatch.setenv("PATH", path)
        env = child_env("cpu", "default")
        found = shutil.which("ninja", path=env["PATH"])
        assert found is not None and Path(found).resolve() == ninja.resolve(), (path, env["PATH"])
        assert shutil.which("python3", path=env["PATH"]) == shutil.which("python3", path=path)  # nothing else moves

"""The suite's op builds (tests/op_builds.py): which ops it builds before the tests, and a test that builds one
itself fails naming the op, run on a small suite of its own with a folder of ops of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

BUILDING_TESTS = """
import os
from pathlib import Path


def test_loads_what_is_built():
    assert Path(os.environ["TORCH_EXTENSIONS_DIR"], "cpu_adam", "cpu_adam.so").exists()


def test_builds_an_op():
    folder = Path(os.environ["TORCH_EXTENSIONS_DIR"], "fresh_op")
    folder.mkdir()
    (folder / "fresh_op.so").write_bytes(b"")  # what torch's JIT build leaves


def test_rebuilds_a_stale_op():
    built = Path(os.environ["TORCH_EXTENSIONS_DIR"], "cpu_adam", "cpu_adam.so")
    later = built.stat().st_mtime + 60
    os.utime(built, (later, later))  # torch rebuilds an op whose sources or flags changed in place


def test_builds_elsewhere(tmp_path):
    (tmp_path / "other_op").mkdir()
    (tmp_path / "other_op" / "other_op.so").write_bytes(b"")
"""


def test_a_test_that_builds_an_op_fails_naming_it(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = pytester.path / "ops"
    (ops / "cpu_adam").mkdir(parents=True)
    (ops / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ops))
    monkeypatch.setenv("MEMPLAN_TEST_BUILD_OPS", "0")  # the build itself is the session's, checked below
    pytester.makeconftest('pytest_plugins = ["op_builds"]\n')
    pytester.makepyfile(test_building=BUILDING_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    text = result.stdout.str()
    assert f"test_builds_an_op (call) built DeepSpeed's op fresh_op in {ops}" in text
    assert "test_rebuilds_a_stale_op (call) built DeepSpeed's op cpu_adam" in text


def test_the_suite_builds_the_ops_of_adam_with_and_without_offload() -> None:
    from op_builds import suite_ops

    assert suite_ops() == ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder")


def test_the_ops_the_session_loads_are_built_before_any_test() -> None:
    """This session's own build: every op of the suite stands built (or skipped where DeepSpeed skips it)."""
    import os

    from op_builds import SKIP_VARIABLE, built_ops, session_ops_folder

    if os.environ.get(SKIP_VARIABLE, "").strip() == "0":
        pytest.skip(f"{SKIP_VARIABLE}=0: this session built no ops")
    built = built_ops(session_ops_folder())
    assert {"cpu_adam", "fused_adam"} <= built, built

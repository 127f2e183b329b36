"""The bad and odd inputs of the hardening review: each is one ``planner: error:`` line, exit 2, nothing
written, and an answer within seconds of CPU time (a hang is caught by a wall-clock alarm far above that).

The CPU-time guard measures this process's CPU seconds, not wall time, so a busy machine slows these tests
without failing them; the alarm only ends a test that would otherwise hang the suite.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CPU_MEM, CliResult, assert_one_error_line

Cli = Callable[..., CliResult]
GPU = ("--gpu-mem", "24G")
HUGE = "9" * 300
CPU_SECONDS = 5.0  # bad input answers within this much of this process's CPU time
HANG_ALARM_S = 300  # wall clock: far above any answer, even on a loaded machine


@pytest.fixture
def guarded(cli: Cli) -> Iterator[Cli]:
    """The in-process CLI under the CPU-time guard and the hang alarm."""

    def on_alarm(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"no answer within {HANG_ALARM_S} s: the command hangs")

    previous = signal.signal(signal.SIGALRM, on_alarm)

    def run(*args: Any) -> CliResult:
        signal.alarm(HANG_ALARM_S)
        start = time.process_time()
        try:
            result = cli(*args)
        finally:
            signal.alarm(0)
        spent = time.process_time() - start
        assert spent < CPU_SECONDS, f"{spent:.1f} CPU seconds for {args}"
        return result

    yield run
    signal.signal(signal.SIGALRM, previous)


def _files(tmp_path: Path) -> dict[str, Path]:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    huge_int = tmp_path / "huge_int.json"
    huge_int.write_text('{"zero_stage": ' + "9" * 5000 + "}")
    model_deep = tmp_path / "model_deep"
    model_deep.mkdir()
    (model_deep / "config.json").write_text("{" + '"a":{' * 5000 + "}" * 5001)
    model_huge = tmp_path / "model_huge"
    model_huge.mkdir()
    (model_huge / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 10**400,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 256,
            }  # fmt: skip
        )
    )
    ds_list = tmp_path / "ds_list.json"
    ds_list.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": [2]}))
    ds_ok = tmp_path / "ds_ok.json"
    ds_ok.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}))
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps(T5_CONFIG))
    not_executable = tmp_path / "train.sh"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    not_executable.chmod(0o644)
    return {
        "t5": t5,
        "not_executable": not_executable,
        "a_folder": tmp_path,
        "deep": deep,
        "huge_int": huge_int,
        "model_deep": model_deep,
        "model_huge": model_huge,
        "ds_list": ds_list,
        "ds_ok": ds_ok,
    }


# an encoder-decoder: transformers builds no causal LM of it (refused once with its 3 KB list of model classes)
T5_CONFIG = {
    "model_type": "t5", "d_model": 64, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
    "d_kv": 16, "vocab_size": 256, "is_encoder_decoder": True,
}  # fmt: skip
REC = ("recommend", "--model", "opt-125m", *GPU, *CPU_MEM)
CASES: list[tuple[str, list[str], str]] = [
    # tracebacks once
    ("gpu-mem-300-digits", ["recommend", "--model", "opt-125m", "--gpu-mem", HUGE, *CPU_MEM], "--gpu-mem"),
    ("cpu-mem-20-digits", ["recommend", "--model", "opt-125m", *GPU, "--cpu-mem", "9" * 20], "--cpu-mem"),
    ("seed-negative", [*REC, "--seed", "-1"], "--seed"),
    ("seed-huge", [*REC, "--seed", "99999999999999"], "--seed"),
    ("plans-n-huge", ["plans", "-n", str(10**23)], "-n"),
    ("model-600-chars", ["recommend", "--model", "m" * 600, *GPU, *CPU_MEM], "model"),
    ("model-6000-unicode", ["recommend", "--model", "é" * 6000, *GPU, *CPU_MEM], "model"),
    ("gpu-empty", ["recommend", "--model", "opt-125m", "--gpu", "", *CPU_MEM], "unknown GPU ''"),
    ("model-nosuchuser", ["recommend", "--model", "~nosuchuser/config.json", *GPU, *CPU_MEM], "nosuchuser"),
    ("export-o-empty", ["export", "-o", ""], "-o"),
    ("export-o-300-chars", ["export", "-o", "x" * 300 + ".json"], "x" * 20),
    # a traceback once (issue 43): a path without a file name; a trailing slash names a folder, not a file
    ("export-o-dot", ["export", "-o", "."], "is a folder"),
    ("export-o-root", ["export", "-o", "/"], "is a folder"),
    ("export-o-trailing-slash", ["export", "-o", "new/"], "names a folder"),
    ("export-o-trailing-slash-hf", ["export", "--format", "hf", "-o", "new/"], "names a folder"),
    # a traceback once (issue 43): a name the file system cannot look up; the line repeats only its start
    ("program-600-chars", [*REC, "--program", "x" * 600], "x" * 20 + "..."),
    # accepted once (issue 43): a whole number given as 2.0, an empty item of a list, a config of another task
    ("batch-2.0", [*REC, "--batch", "2.0"], "--batch must be a whole number"),
    ("gpus-equals-1.0", [*REC, "--gpus=1.0"], "--gpus must be a whole number"),
    ("top-1e3", [*REC, "--top", "1e3"], "--top must be a whole number"),
    (
        "rollout-empty-item",
        ["recommend", "--model", "opt-125m", *GPU, *CPU_MEM, "--workload", "ppo", "--rollout", "vllm,,sglang"],
        "empty item",
    ),  # fmt: skip
    # hangs once
    ("batch-10^12-sft", [*REC, "--batch", "1000000000000"], "--batch"),
    (
        "batch-10^12-ppo",
        ["recommend", "--model", "opt-125m", *GPU, "--workload", "ppo", "--batch", "1000000000000"],
        "--batch",
    ),  # fmt: skip
    # silently accepted once
    (
        "check-lora-rank-huge",
        ["check", "@ds_ok", "--model", "opt-125m", *GPU, "--lora-rank", str(10**23)],
        "lora_rank",
    ),
    ("check-zero-optimization-list", ["check", "@ds_list", "--model", "opt-125m", *GPU], "zero_optimization"),
    # documents of odd shape
    ("strategy-deeply-nested", ["predict", "--model", "opt-125m", *GPU, *CPU_MEM, "--strategy", "@deep"], "strategy"),
    ("strategy-huge-int", ["predict", "--model", "opt-125m", *GPU, *CPU_MEM, "--strategy", "@huge_int"], "digits"),
    ("check-deeply-nested", ["check", "@deep", "--model", "opt-125m", *GPU], "ds_config"),
    ("model-config-deeply-nested", ["recommend", "--model", "@model_deep", *GPU, *CPU_MEM], "config"),
    ("model-config-huge-int", ["recommend", "--model", "@model_huge", *GPU, *CPU_MEM], "digits"),
]
LISTINGS: list[tuple[str, list[str], str]] = [
    ("probes-n-huge", ["probes", "-n", str(10**23)], "-n"),
    ("explain-unknown-plan", ["explain", "zzzz"], "zzzz"),
    # listed nothing once (issue 43): a filter that can match nothing is a typo
    ("probes-device-tpu", ["probes", "--device", "tpu"], "--device must be cuda or cpu"),
    ("plans-workload-bogus", ["plans", "--workload", "bogus"], "--workload must be one of"),
    ("explain-db-nosuchuser", ["explain", "--db", "~nosuchuser/plans.db"], "nosuchuser"),
]
PROBE = ("probe", "--model", "opt-125m", *GPU, *CPU_MEM, "--device", "cpu")
TUNE = ("tune", "--model", "opt-125m", *GPU, *CPU_MEM, "--device", "cpu")
PROBE_CASES: list[tuple[str, list[str], str]] = [
    ("probe-memory-cap-300-digits", [*PROBE, "--memory-cap", HUGE], "--memory-cap"),
    ("probe-timeout-nan", [*PROBE, "--timeout", "nan"], "--timeout"),
    ("probe-timeout-inf", [*PROBE, "--timeout", "inf"], "--timeout"),
    ("probe-layers-10^23", [*PROBE, "--layers", str(10**23)], "--layers"),
    # a user program that cannot start was a stored probe once, and a bare -- ran memplan's own loop (issue 43)
    ("probe-bare-separator", [*PROBE, "--"], "after --"),
    ("probe-cmd-missing", [*PROBE, "--", "./no-such-program", "--steps", "3"], "does not exist"),
    ("probe-cmd-not-on-path", [*PROBE, "--", "no-such-program-memplan"], "not found on PATH"),
    ("probe-cmd-not-executable", [*PROBE, "--", "@not_executable"], "not executable"),
    ("probe-cmd-folder", [*PROBE, "--", "@a_folder"], "is a folder"),
    ("probe-cmd-empty", [*PROBE, "--", ""], "empty"),
    ("tune-bare-separator", [*TUNE, "--"], "after --"),
    ("tune-cmd-missing", [*TUNE, "--", "./no-such-program"], "does not exist"),
    ("tune-cmd-folder", [*TUNE, "--", "@a_folder", "train.py"], "is a folder"),
    ("tune-max-probes-2.0", [*TUNE, "--max-probes", "2.0"], "--max-probes must be a whole number"),
]


def _resolve(args: list[str], files: dict[str, Path]) -> list[str]:
    return [str(files[a[1:]]) if a.startswith("@") else a for a in args]


ALL_CASES = CASES + LISTINGS + PROBE_CASES


@pytest.mark.parametrize(("name", "args", "fragment"), ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_bad_input_is_one_line_and_exit_2(
    guarded: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, args: list[str], fragment: str
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "plans.db"
    files = _files(tmp_path)
    if name.startswith("export"):  # a plan to export, so that only the file name is wrong
        assert guarded(*REC, "--db", db).rc == 0
    before = set(tmp_path.iterdir())
    takes_db = args[0] in ("recommend", "plans", "export", "probe", "probes", "explain", "tune") and "--db" not in args
    with_db = ["--db", str(db)] if takes_db else []
    resolved = _resolve(args, files)
    if "--" in resolved:  # options before the user's command
        cut = resolved.index("--")
        resolved = [*resolved[:cut], *with_db, *resolved[cut:]]
        with_db = []
    result = guarded(*resolved, *with_db)
    assert_one_error_line(result, fragment)
    created = set(tmp_path.iterdir()) - before - {db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")}
    assert not created, created  # nothing half-written beside the database
    if "--" in args:  # a user program that cannot start: refused before the database is opened
        assert not db.exists()


@pytest.mark.parametrize(
    "db_arg",
    ["sqlite:///x.db?foo=bar", "sqlite:///x.db?mode=ro", "~nosuchuser/plans.db"],
    ids=["unknown-query", "mode-ro", "nosuchuser"],
)
def test_bad_database_urls(guarded: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_arg: str) -> None:
    monkeypatch.chdir(tmp_path)
    result = guarded("plans", "--db", db_arg)
    assert_one_error_line(result, "")
    assert not [p for p in tmp_path.iterdir() if "?" in p.name]


def test_planner_db_with_nosuchuser(guarded: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLANNER_DB", "~nosuchuser/plans.db")
    assert_one_error_line(guarded("plans"), "nosuchuser")


def test_a_config_of_another_task_is_one_short_line(cli: Cli, tmp_path: Path) -> None:
    """A T5 config (an encoder-decoder) was refused with transformers' 3 KB list of model classes, after a
    'reading ... first use only' line: one short line now (not under the CPU guard: it imports transformers)."""
    files = _files(tmp_path)
    line = assert_one_error_line(
        cli("recommend", "--model", files["t5"], *GPU, *CPU_MEM, "--db", tmp_path / "plans.db"), "'t5'"
    )
    assert len(line) < 300, len(line)


def _foreign_database(path: Path) -> bytes:
    """Another application's SQLite database (one table of its own); returns its bytes."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        conn.execute("INSERT INTO orders (item) VALUES ('tea')")
    return path.read_bytes()


@pytest.mark.parametrize(
    "args",
    [["export", "-o", "ds.json"], ["explain"], ["explain", "abc123"], ["plans"], ["probes"], ["calibrations"]],
    ids=["export", "explain", "explain-id", "plans", "probes", "calibrations"],
)
def test_read_commands_leave_another_applications_database_as_it_was(
    guarded: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """export and explain added memplan's tables to another application's database, then failed (issue 43):
    a read command never creates tables; it says nothing is saved there."""
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "shop.db"
    before = _foreign_database(db)
    result = guarded(*args, "--db", db)
    if args[0] in ("export", "explain"):
        assert_one_error_line(result, "no memplan tables" if args[0] == "export" else "")
    else:
        assert result.rc == 0 and "Traceback" not in result.err
    assert db.read_bytes() == before
    assert not (tmp_path / "ds.json").exists()


def test_a_cuda_probe_without_cuda_is_one_line_and_creates_no_database(cli: Cli, tmp_path: Path) -> None:
    """--device cuda where torch sees no CUDA device printed a note and the ops-build failure, and left a new
    database (issue 43): one line now, before the database is opened (not under the CPU guard: it imports torch)."""
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("this machine has a CUDA device")
    db = tmp_path / "plans.db"
    assert_one_error_line(cli(*PROBE[:-1], "cuda", "--db", db), "--device cuda", "no CUDA device")
    assert_one_error_line(cli("tune", *PROBE[1:-1], "cuda", "--db", db), "--device cuda", "no CUDA device")
    assert not db.exists()

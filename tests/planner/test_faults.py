"""The fault suite: what a scheduler, a user and a damaged disk do to the planner, with the promise as the oracle.

- ``probe``, ``tune`` and ``export`` are sent SIGTERM, SIGHUP or SIGKILL at seeded random moments. Nothing may be
  left running: every process a planner starts carries ``MEMPLAN_PLANNER_PID=<its pid>`` in its environment
  (the op-build child, the probe child, a rank launcher and its ranks, the compilers they start), so the oracle
  is a scan of ``/proc`` for that marker, not a list of the pids someone remembered. Nothing of the user's may
  be lost: the database passes SQLite's integrity check and keeps every probe it had; exported files are the old
  ones or the complete new ones, all of one set after SIGTERM, and after SIGKILL once the next export has run.
  A SIGTERM or SIGHUP leaves no ``memplan-probe-*`` folder; a SIGKILL's folder names a dead owner, and the next
  run removes it.
- A full disk, for an export and for the database: a small tmpfs where the test may mount one (root, and mount
  allowed), else ``ENOSPC`` injected into the export's writes (the database case then skips).
- A read-only database, file and folder: one clear line, exit 2, no traceback, no probe started.

Each stop comes in one of the states a run passes through (the planner starting, the op-build child compiling,
the probe child or a group of ranks running: ``planner.probing.session``; an op-build child that only loads built
ops lasts milliseconds, too short to be sure to stop), chosen so that every state
is hit once rather than by chance over many trials, at a seeded random moment after the event that opens it
(a slow machine shifts when they come, not what they hit). Every wait is generous; totals are printed at the end
of the module (``-s`` shows them).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fault_processes import Sampler, compiling, running_module, wait_for
from planner_helpers import REPO, CliResult, assert_one_error_line, run_main, subprocess_env

from planner.files.file_set import MARK
from probes.process.workdir import OWNER_FILE, PREFIX

pytestmark = pytest.mark.slow

SEED = 29
PATIENCE_S = 300.0  # the most a stage may take to come, or a command to end, on a busy 2-core machine
# The most a process the planner started may take to be gone after the planner has ended. The probes stopped
# run LONG_STEPS steps (minutes of work on any machine: a step of the tiny model with the CPU tracker takes
# tenths of a second), so a child that goes on by itself is still running when this has passed.
GONE_S = 30.0
LONG_STEPS = 1000
TINY = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip
STAGES = {"probe": "probes.step.child"}  # a stage: a process of this module is running (the op-build one: "compile")


@dataclass
class Totals:
    """What the suite did, for the closing note."""

    trials: int = 0
    processes_left: int = 0
    files_lost: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str) -> None:
        self.trials += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1


TOTALS = Totals()


@pytest.fixture(scope="module", autouse=True)
def report_totals() -> Iterator[None]:
    yield
    print(
        f"\nfault suite: {TOTALS.trials} trials {TOTALS.by_kind}, processes left {TOTALS.processes_left}, "
        f"files lost {TOTALS.files_lost}"
    )


# --- processes (fault_processes: the scan of /proc) ----------------------------------------------------


def _wait(condition: Callable[[], bool], timeout_s: float = PATIENCE_S) -> bool:
    return wait_for(condition, timeout_s)


class Planner:
    """One ``python -m planner ...`` process, its output in files (nothing blocks on a full pipe)."""

    def __init__(self, args: list[Any], folder: Path, temp: Path, env: dict[str, str] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.out, self.err_file = folder / "stdout", folder / "stderr"
        env = subprocess_env({"TMPDIR": str(temp), **(env or {})})
        self.folders_before = set(temp.glob(f"{PREFIX}*"))
        with self.out.open("wb") as out, self.err_file.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "planner", *map(str, args)], cwd=REPO, env=env, stdout=out, stderr=err
            )
        self.pid = self.proc.pid
        self.sampler = Sampler(self.pid)

    @property
    def err(self) -> str:
        return self.err_file.read_text(errors="replace")

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=PATIENCE_S)
        except subprocess.TimeoutExpired as exc:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"the planner did not end within {PATIENCE_S:g} s; stderr: {self.err[-2000:]}"
            ) from exc


def stop_at_random_moment(planner: Planner, stage: str, jitter_s: float, sig: signal.Signals) -> None:
    """Send ``sig`` ``jitter_s`` seconds after ``stage`` began (``start``: after the planner started)."""
    if stage == "compile":
        reached = _wait(lambda: planner.proc.poll() is not None or compiling(planner.sampler.latest))
        assert reached and planner.proc.poll() is None, f"never compiled; stderr: {planner.err[-2000:]}"
    elif stage != "start":
        module = STAGES[stage]
        reached = _wait(lambda: planner.proc.poll() is not None or running_module(planner.sampler.latest, module))
        assert reached and planner.proc.poll() is None, f"never reached {stage}; stderr: {planner.err[-2000:]}"
    time.sleep(jitter_s)
    planner.proc.send_signal(sig)


def check_stopped(planner: Planner, stage: str, sig: signal.Signals, temp: Path) -> int:
    """The promise after a stop: the exit, the one line, no process left, the working folders. Returns rc."""
    rc = planner.wait()
    left: list[int] = []
    if not _wait(lambda: not planner.sampler.running(), GONE_S):
        left = planner.sampler.running()
        TOTALS.processes_left += len(left)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of planner {planner.pid} left running: {left}"
    assert "Traceback" not in planner.err, planner.err[-3000:]
    folders = sorted(set(temp.glob(f"{PREFIX}*")) - planner.folders_before)
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        for folder in folders:  # it could not remove them: they name their dead owner for the next run
            assert folder.name.startswith(f"{PREFIX}{planner.pid}-"), folder
            assert not (folder / OWNER_FILE).exists() or (folder / OWNER_FILE).read_text().endswith(f" {planner.pid}")
    else:
        assert rc == 128 + sig or (stage == "start" and rc == -sig), (rc, planner.err[-2000:])
        if rc == 128 + sig:
            assert planner.err.strip().splitlines()[-1] == f"planner: stopped by {sig.name}; its probes were ended"
        assert folders == [], folders
    return rc


# --- the database ----------------------------------------------------------------------------------------


def check_database(db: Path, probes_before: int) -> int:
    """SQLite's integrity check passes and no probe was lost; returns the probes it holds now."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        probes = conn.execute("SELECT count(*) FROM probes").fetchone()[0] if "probes" in tables else 0
    if probes < probes_before:
        TOTALS.files_lost += probes_before - probes
    assert probes >= probes_before, (probes, probes_before)
    return int(probes)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


def _job(tiny: Path, steps: int, gpus: int = 1) -> list[Any]:
    return [
        "--model", tiny, "--device", "cpu", "--gpu-mem", "2G", "--cpu-mem", "64G", "--workload", "sft",
        "--batch", 2 * gpus, "--gpus", gpus, "--seq-len", "32", "--dtype", "fp32", "--steps", steps,
        "--timeout", "3600",
    ]  # fmt: skip


# --- probe and tune, stopped at random moments ------------------------------------------------------------


def test_probe_stopped_at_random_moments_leaves_nothing_running_and_loses_nothing(tiny: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    temp, db = tmp_path / "tmp", tmp_path / "plans.db"
    temp.mkdir()
    strategies = tmp_path / "strategies.json"
    strategies.write_text(json.dumps([{"zero_stage": 0, "micro_batch": 2, "grad_accum": 1}]))
    # (stage, signal, ranks): the SIGKILL one is a rank group (launcher, ranks watching the planner); the op-build
    # stage is the compile test's (SIGTERM and SIGKILL while the op-build child runs its compilers)
    trials = [("start", signal.SIGTERM, 1), ("probe", signal.SIGHUP, 1), ("probe", signal.SIGKILL, 2)]
    probes = 0
    for index, (stage, sig, gpus) in enumerate(trials):
        TOTALS.count(f"probe {sig.name}" + (f" ({gpus} ranks)" if gpus > 1 else ""))
        args = ["probe", *_job(tiny, LONG_STEPS, gpus), "--layers", "1", "--strategies", strategies, "--db", db]
        planner = Planner(args, tmp_path / f"trial{index}", temp)
        stop_at_random_moment(planner, stage, rng.uniform(0.0, 1.5), sig)
        check_stopped(planner, stage, sig, temp)
        probes = check_database(db, probes)
    # the next run measures as ever, and removes the folder the killed run left (it names a dead owner)
    args = ["probe", *_job(tiny, 2), "--layers", "2", "--strategies", strategies, "--db", db]
    final = Planner(args, tmp_path / "final", temp)
    assert final.wait() == 0, final.err[-3000:]
    assert list(temp.glob(f"{PREFIX}*")) == []
    assert _wait(lambda: not final.sampler.running()), final.sampler.running()
    assert check_database(db, probes) > probes


def test_tune_stopped_at_random_moments_leaves_nothing_running_and_loses_nothing(tiny: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    temp, db = tmp_path / "tmp", tmp_path / "plans.db"
    temp.mkdir()
    # both stops come while the probe child runs: with the ops built (as they are after the suite's first
    # probe), the op-build child loads them in milliseconds, a state no sampler can be sure to see (a CI run
    # whose tune ended before its op-build child was ever seen); the op-build stage is the compile tests'
    for index, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
        TOTALS.count(f"tune {sig.name}")
        args = ["tune", *_job(tiny, LONG_STEPS), "--max-probes", "1", "--db", db]
        planner = Planner(args, tmp_path / f"trial{index}", temp)
        stop_at_random_moment(planner, "probe", rng.uniform(0.0, 1.5), sig)
        check_stopped(planner, "probe", sig, temp)
        check_database(db, 0)
    shown = run_main(["plans", "--db", str(db)])  # the database still serves
    assert shown.rc == 0, shown.err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_probe_stopped_while_deepspeed_compiles_an_op_leaves_no_compiler_and_no_lock_that_blocks(
    tiny: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """The case of the issue: a killed planner's op build went on compiling for minutes, holding torch's lock.
    A folder of its own makes the op build from scratch; the planner is stopped once the compilers run (the
    op-build stage of a probe run: its database keeps its integrity too)."""
    TOTALS.count(f"probe {sig.name} while compiling")
    temp, ops, db = tmp_path / "tmp", tmp_path / "ops", tmp_path / "plans.db"
    temp.mkdir()
    args = ["probe", *_job(tiny, 2), "--layers", "1", "--db", db]
    planner = Planner(args, tmp_path / "run", temp, {"TORCH_EXTENSIONS_DIR": str(ops)})
    stop_at_random_moment(planner, "compile", random.Random(SEED + 3).uniform(0.0, 1.0), sig)
    check_stopped(planner, "compile", sig, temp)
    from probes.process.jit_lock import holder_is_gone

    for lock in ops.rglob("lock"):  # a killed build's lock names its dead holder: the next load takes it over
        assert holder_is_gone(lock), lock.read_text()
    check_database(db, 0)


# --- export, stopped at random moments --------------------------------------------------------------------

ROLES = ("actor", "critic", "reference", "reward")

EXPORT_WRAPPER = """
import os, signal, sys
kill_at, sig = int(sys.argv[1]), int(sys.argv[2])
calls = []
def stopping(real):
    def call(*args, **kwargs):
        calls.append(real.__name__)
        if len(calls) == kill_at:
            os.kill(os.getpid(), sig)
        return real(*args, **kwargs)
    return call
for name in ("replace", "fsync", "link", "unlink"):
    setattr(os, name, stopping(getattr(os, name)))
sys.argv = ["planner", *sys.argv[3:]]
from planner.cli import run
run()
"""


@dataclass(frozen=True)
class ExportSets:
    """Two saved PPO plans (four configs each) and what each one's files hold."""

    db: Path
    plans: tuple[str, str]
    texts: tuple[dict[str, str], dict[str, str]]


@pytest.fixture(scope="module")
def export_sets(tmp_path_factory: pytest.TempPathFactory) -> ExportSets:
    folder = tmp_path_factory.mktemp("export_sets")
    db = folder / "plans.db"
    plans, texts = [], []
    for batch in ("8", "16"):
        doc = run_main(["recommend", "--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G", "--workload",
                        "ppo", "--batch", batch, "--json", "--db", str(db)]).json()  # fmt: skip
        plans.append(doc["plan_id"])
        out = folder / batch / "ds.json"
        out.parent.mkdir()
        assert run_main(["export", doc["plan_id"], "-o", str(out), "--db", str(db)]).rc == 0
        texts.append({f"ds.{role}.json": (out.parent / f"ds.{role}.json").read_text() for role in ROLES})
    assert texts[0] != texts[1] and all(texts[0][name] != texts[1][name] for name in texts[0])
    return ExportSets(db, (plans[0], plans[1]), (texts[0], texts[1]))


def _exported(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir()) if p.is_file()}


def _check_files(folder: Path, sets: ExportSets, whole_set: bool) -> int:
    """Every file is one of the two versions, complete (and, with ``whole_set``, all of one plan and nothing
    else beside them). Returns which plan's set it is, or -1 for a mix."""
    files = {name: text for name, text in _exported(folder).items() if MARK not in name}
    lost = [name for name in sets.texts[0] if files.get(name) not in (sets.texts[0][name], sets.texts[1][name])]
    TOTALS.files_lost += len(lost)
    assert not lost, {name: files.get(name, "<missing>")[:80] for name in lost}
    which = next((i for i in (0, 1) if files == sets.texts[i]), -1)
    if whole_set:
        assert which >= 0, "a mix of the two plans' files"
        assert sorted(_exported(folder)) == sorted(sets.texts[0]), sorted(_exported(folder))
    return which


def test_export_stopped_at_random_moments_keeps_the_old_files_or_the_new_ones(
    export_sets: ExportSets, tmp_path: Path
) -> None:
    rng = random.Random(SEED + 2)
    out = tmp_path / "out"
    out.mkdir()
    for name, text in export_sets.texts[0].items():
        (out / name).write_text(text)
    wrapper = tmp_path / "export_wrapper.py"
    wrapper.write_text(EXPORT_WRAPPER)
    env = subprocess_env({"PYTHONPATH": str(REPO)})
    current = 0
    for index in range(8):  # 6 at the write's own steps, then one SIGTERM and one SIGKILL at a random time
        sig = (signal.SIGTERM, signal.SIGKILL)[index % 2]
        TOTALS.count(f"export {sig.name}")
        target = 1 - current
        args = ["export", export_sets.plans[target], "-o", out / "ds.json", "--force", "--db", export_sets.db]
        if index < 6:  # at one of the write's own steps: 4 staged files, 4 backups, a journal, 4 renames, ...
            argv = [sys.executable, str(wrapper), str(rng.randint(1, 16)), str(int(sig)), *map(str, args)]
            proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=PATIENCE_S)
            rc, err = proc.returncode, proc.stderr
        else:  # at a random time of the whole command (most of it is starting up)
            planner = Planner(args, tmp_path / f"trial{index}", tmp_path)
            time.sleep(rng.uniform(0.0, 3.0))
            planner.proc.send_signal(sig)
            rc, err = planner.wait(), planner.err
        assert "Traceback" not in err, err[-3000:]
        assert rc in (0, -sig, 128 + sig), (rc, err[-2000:])
        which = _check_files(out, export_sets, whole_set=sig != signal.SIGKILL)
        if sig == signal.SIGKILL:  # the next write into the folder rolls a killed one back or keeps it whole
            probe = tmp_path / "out" / "probe.txt"
            assert run_main(["export", export_sets.plans[0], "-o", str(tmp_path / "elsewhere.json"), "--force",
                             "--db", str(export_sets.db)]).rc == 0  # fmt: skip
            from planner.files.atomic import write_bytes_atomic

            write_bytes_atomic(probe, b"x")
            probe.unlink()
            which = _check_files(out, export_sets, whole_set=True)
        current = which
    final = run_main(
        ["export", export_sets.plans[0], "-o", str(out / "ds.json"), "--force", "--db", str(export_sets.db)]
    )
    assert final.rc == 0, final.err
    assert _check_files(out, export_sets, whole_set=True) == 0


# --- a full disk -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(where: Path, size: str = "512k") -> Iterator[Path | None]:
    """A tmpfs of ``size`` mounted at ``where`` (None where this test may not mount one)."""
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, check=False) if os.geteuid() == 0 else None  # fmt: skip
    if done is None or done.returncode != 0:
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def fill(disk: Path) -> None:
    """Write until the file system refuses (pages first, then what single bytes still fit)."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    with pytest.raises(OSError) as refused:
        (disk / "one-more").write_bytes(b"\0" * 4096)
    assert refused.value.errno == errno.ENOSPC


def test_export_onto_a_full_disk_keeps_the_old_files(
    export_sets: ExportSets, tmp_path: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    TOTALS.count("full disk: export")
    with small_disk(tmp_path / "disk") as disk:
        out = disk or tmp_path / "disk"
        for name, text in export_sets.texts[0].items():
            (out / name).write_text(text)
        if disk is not None:
            fill(disk)
        else:  # no mount here: the disk fills at the third file's data
            real_fsync, calls = os.fsync, []

            def fsync(fd: int) -> None:
                calls.append(fd)
                if len(calls) == 3:
                    raise OSError(errno.ENOSPC, "No space left on device")
                real_fsync(fd)

            monkeypatch.setattr(os, "fsync", fsync)
        result = cli("export", export_sets.plans[1], "-o", out / "ds.json", "--force", "--db", export_sets.db)
        monkeypatch.undo()
        assert_one_error_line(result, "No space left on device")
        files = {name: text for name, text in _exported(out).items() if name.startswith("ds.")}
        assert files == export_sets.texts[0]
        assert not [p for p in out.iterdir() if MARK in p.name]


def test_a_database_on_a_full_disk_is_one_line_and_stays_intact(tiny: Path, tmp_path: Path) -> None:
    TOTALS.count("full disk: database")
    with small_disk(tmp_path / "disk", "2m") as disk:
        if disk is None:
            pytest.skip("cannot mount a tmpfs here (not root, or mount not allowed)")
        db = disk / "plans.db"
        job = ["--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G", "--workload", "sft"]
        assert run_main(["recommend", *job, "--db", str(db)]).rc == 0
        fill(disk)
        # recommend in this process (planner.cli.main); the probe as a process: what it might start, it would start
        assert_one_error_line(
            run_main(["recommend", *job, "--batch", "16", "--db", str(db)]), "database or disk is full"
        )
        planner = Planner(["probe", *_job(tiny, 2), "--layers", "1", "--db", db], tmp_path / "probe", tmp_path)
        rc = planner.wait()
        assert_one_error_line(CliResult(rc, "", planner.err), "database or disk is full")
        assert not list(tmp_path.glob(f"{PREFIX}*"))  # no probe was started
        check_database(db, 0)
        assert run_main(["plans", "--db", str(db), "--json"]).rc == 0  # the plan saved before is still there


# --- a read-only database ----------------------------------------------------------------------------------


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[bool]:
    """Make ``folder`` (and what is in it) read-only for this process: a read-only tmpfs remount as root, else
    file modes. Yields False where neither works."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.iterdir()]}
        for path in modes:
            path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield True
        finally:
            for path, mode in modes.items():
                path.chmod(mode)
        return
    done = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True, check=False)
    try:
        yield done.returncode == 0
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(folder)], capture_output=True, check=False)


def test_a_read_only_database_is_one_line_exit_2_and_starts_no_probe(tiny: Path, tmp_path: Path) -> None:
    TOTALS.count("read-only database")
    with small_disk(tmp_path / "disk", "4m") as disk:
        where = disk or tmp_path / "disk"
        if disk is None and os.geteuid() == 0:
            pytest.skip("root ignores file modes and no tmpfs can be mounted here")
        db = where / "plans.db"
        job = ["--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G", "--workload", "sft"]
        assert run_main(["recommend", *job, "--db", str(db)]).rc == 0
        with read_only(where) as done:
            if not done:
                pytest.skip("cannot make the folder read-only here")
            # the recommends in this process (planner.cli.main); the probe as a process: what it might start, it would
            assert_one_error_line(run_main(["recommend", *job, "--batch", "16", "--db", str(db)]), "readonly")
            planner = Planner(["probe", *_job(tiny, 2), "--layers", "1", "--db", db], tmp_path / "ro-probe", tmp_path)
            rc = planner.wait()
            assert_one_error_line(CliResult(rc, "", planner.err), "readonly")
            assert not list(tmp_path.glob(f"{PREFIX}*"))
            assert_one_error_line(run_main(["recommend", *job, "--db", str(where / "new.db")]), "not writable")
            assert not list(tmp_path.glob(f"{PREFIX}*"))
            assert run_main(["plans", "--db", str(db)]).rc == 0  # reading still works
        check_database(db, 0)

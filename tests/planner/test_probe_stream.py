"""Real CPU probes record their allocation stream; it is stored with the probe, its phase windows give the
measured peaks exactly, and `planner probes --snapshot` writes it as a memory snapshot PyTorch opens.

Two probes of a tiny Llama on DeepSpeed's CPU accelerator, each in its own process as `planner probe` runs
them, once for the module: sft under ZeRO-2 (empty_cache after every phase) and PPO under ZeRO-2
(empty_cache after the inference phases).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CliResult, assert_one_error_line

from planner import probe, probe_snapshot, probe_stream
from store.alloc_stream import ALLOC, EMPTY_CACHE, KIND_INDEX, AllocStream, decode
from store.artifacts import ALLOC_STREAM
from store.cuda_snapshot import snapshot_to_stream
from store.db import SQLAlchemyStorage
from store.measurements import ProbeRequest, ProbeResult
from store.stream_phases import SETUP_MARK, phase_live_peaks

Cli = Callable[..., CliResult]
TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip
SFT = {"zero_stage": 2, "micro_batch": 2, "grad_accum": 1, "empty_cache": "after-phase"}
PPO = {
    "actor": {"zero_stage": 2}, "critic": {"zero_stage": 2}, "reference": {"zero_stage": 0, "offload": "none"},
    "reward": {"zero_stage": 0, "offload": "none"}, "hybrid_engine": False, "generation_batch": 2,
    "micro_batch": 2, "grad_accum": 1, "empty_cache": "after-inference",
}  # fmt: skip
# each probe child on one thread: the suite runs two workers on two cores, where a second OpenMP thread only spins
PROBE_ENV = {"OMP_NUM_THREADS": "1"}
JOBS = {
    "sft": ({"workload": "sft", "batch": 2, "seq_len": 32}, SFT, 2),
    "ppo": ({"workload": "ppo", "batch": 2, "prompt_len": 8, "gen_len": 4}, PPO, 2),
}


@dataclasses.dataclass(frozen=True)
class Probed:
    """One probe run for the module: its id and the result the runner handed to the store."""

    probe_id: str
    result: ProbeResult


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Probed]]:
    """The database and the two probes (sft, ppo) stored in it."""
    folder = tmp_path_factory.mktemp("stream-probes")
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    db = str(folder / "plans.db")
    found: dict[str, Probed] = {}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in PROBE_ENV.items():
            patch.setenv(key, value)
        for name, (job, strategy, steps) in JOBS.items():
            found[name] = _probe(folder, db, name, job, strategy, steps)
    return db, found


def _probe(folder: Path, db: str, name: str, job: dict[str, Any], strategy: dict[str, Any], steps: int) -> Probed:
    """One of JOBS probed through ``planner.probe`` and stored in ``db``."""
    from probes import run_probe

    seen: list[ProbeResult] = []

    def runner(request: ProbeRequest) -> ProbeResult:
        seen.append(run_probe(request))
        return seen[-1]

    strategies = folder / f"{name}.json"
    strategies.write_text(json.dumps([strategy]))
    common: dict[str, Any] = {"gpu_mem": "24G", "cpu_mem": "64G", "layers": None, "timeout_s": 900.0}
    report = probe(
        str(folder), device="cpu", strategies=str(strategies), steps=steps, db=db, runner=runner, **job, **common
    )
    (row,) = report.rows
    assert row.outcome == "ok", row.message
    return Probed(row.probe_id, seen[-1])


@pytest.mark.parametrize("name", sorted(JOBS))
def test_each_phase_peak_of_the_stream_is_the_stored_peak(probed: tuple[str, dict[str, Probed]], name: str) -> None:
    db, found = probed
    stream = probe_stream(found[name].probe_id, db=db)
    assert stream is not None and len(stream) > 100
    with SQLAlchemyStorage(db) as storage:
        record = storage.get_probe(found[name].probe_id)
    peaks = phase_live_peaks(stream)
    stored = {p.name: p.peak_allocated_bytes for p in record.result.phases}
    assert stored and {phase: peaks[phase] for phase in stored} == stored
    assert peaks[SETUP_MARK] == record.result.extra["setup_peak_bytes"]
    empties = sum(op == EMPTY_CACHE for op, *_ in stream)
    assert empties == record.result.extra["empty_cache_calls"] > 0  # skipped on the CPU, but in the stream
    kinds = {event[4] for event in stream if event[0] == ALLOC}
    assert {KIND_INDEX["parameters"], KIND_INDEX["optimizer_states"]} <= kinds
    assert record.result.extra["artifacts"][ALLOC_STREAM]["events"] == len(stream)


def test_the_stream_round_trips_through_the_database(probed: tuple[str, dict[str, Probed]]) -> None:
    db, found = probed
    for item in found.values():
        (sent,) = item.result.artifacts
        with SQLAlchemyStorage(db) as storage:
            kept = storage.load_probe_artifact(item.probe_id, ALLOC_STREAM)
            assert storage.list_probe_artifacts(item.probe_id) == {ALLOC_STREAM: len(sent.data)}
        assert kept == sent
        assert probe_stream(item.probe_id, db=db) == decode(sent.data)


def test_snapshot_command_writes_a_pickle_memory_viz_reads(
    cli: Cli, probed: tuple[str, dict[str, Probed]], tmp_path: Path
) -> None:
    db, found = probed
    probe_id = found["sft"].probe_id
    target = tmp_path / "sft.pickle"
    result = cli("probes", "--snapshot", probe_id[:8], "-o", target, "--db", db)
    assert result.rc == 0, result.err
    assert result.out.count("\n") == 1 and str(target) in result.out and probe_id in result.out
    assert "memory_viz" in result.out and not result.err
    with target.open("rb") as handle:
        snapshot = pickle.load(handle)
    assert snapshot == probe_snapshot(probe_id, db=db)
    assert snapshot_to_stream(snapshot) == probe_stream(probe_id, db=db)
    viz = pytest.importorskip("torch.cuda._memory_viz")
    assert "segments: 1" in viz.segsum(snapshot)
    assert viz.trace(snapshot).startswith("Device 0")

    again = cli("probes", "--snapshot", probe_id, "-o", target, "--db", db)
    assert_one_error_line(again, "exists", "--force")
    assert cli("probes", "--snapshot", probe_id, "-o", target, "--force", "--db", db).rc == 0


def test_snapshot_command_bad_input_is_one_line(
    cli: Cli, probed: tuple[str, dict[str, Probed]], tmp_path: Path
) -> None:
    db, found = probed
    out = tmp_path / "x.pickle"
    assert_one_error_line(cli("probes", "--snapshot", "ffffffffffff", "-o", out, "--db", db), "no saved probe")
    assert_one_error_line(cli("probes", "--snapshot", "ab", "-o", out, "--db", db), "too short")
    assert_one_error_line(cli("probes", "-o", out, "--db", db), "--snapshot")
    with SQLAlchemyStorage(db) as storage:  # a probe stored without records (as before memplan kept them)
        record = storage.get_probe(found["sft"].probe_id)
        bare = storage.save_probe(record.request, record.result, key="0" * 64)
    line = assert_one_error_line(cli("probes", "--snapshot", bare.probe_id, "-o", out, "--db", db), bare.probe_id)
    assert "no stored allocation records" in line
    assert probe_stream(bare.probe_id, db=db) is None
    assert not out.exists()


def test_snapshot_command_imports_no_torch(run_process: Callable[..., CliResult], probed: Any, tmp_path: Path) -> None:
    db, found = probed
    args = ["probes", "--snapshot", found["ppo"].probe_id, "-o", str(tmp_path / "ppo.pickle"), "--db", db]
    code = (
        "import io, sys, contextlib\n"
        "from planner.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main({args!r})\n"
        "heavy = sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules)\n"
        "print(rc, heavy)\n"
    )
    result = run_process([sys.executable, "-c", code])
    assert result.rc == 0, result.err
    assert result.out.strip() == "0 []"
    assert isinstance(snapshot_to_stream(pickle.loads((tmp_path / "ppo.pickle").read_bytes())), AllocStream)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_replaying_the_stream_reproduces_the_tracker_peaks(probed: tuple[str, dict[str, Probed]], name: str) -> None:
    """Through the allocator port, the recorded stream's requested bytes peak where the tracker's did, phase
    by phase over the measured steps, and the allocator reserves at least that much."""
    from search.allocator import replay
    from store.stream_phases import MARKS, WARMUP_MARK

    db, found = probed
    stream = probe_stream(found[name].probe_id, db=db)
    assert stream is not None
    with SQLAlchemyStorage(db) as storage:
        record = storage.get_probe(found[name].probe_id)
    peaks: dict[str, int] = {}
    warmup = False
    for window in replay(stream).phases:
        if window.name in MARKS:
            warmup = window.name == WARMUP_MARK
        elif not warmup and window.name != SETUP_MARK:
            peaks[window.name] = max(peaks.get(window.name, 0), window.peak_requested)
            assert window.peak_reserved >= window.peak_allocated >= window.peak_requested
    assert peaks == {p.name: p.peak_allocated_bytes for p in record.result.phases}

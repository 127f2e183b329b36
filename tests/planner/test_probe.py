"""`planner probe` on the CPU backend: real probes in their own processes, stored, compared, resumed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import CliResult, assert_one_error_line

Cli = Callable[..., CliResult]
TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip
SFT_STRATEGIES = [
    {"zero_stage": 0, "micro_batch": 2, "grad_accum": 1},
    {"zero_stage": 2, "gradient_checkpointing": True, "micro_batch": 2, "grad_accum": 1},
]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


def _job(tiny: Path, *extra: str) -> list[str]:
    return [
        "--model",
        str(tiny),
        "--device",
        "cpu",
        "--gpu-mem",
        "24G",
        "--cpu-mem",
        "64G",
        "--steps",
        "2",
        "--timeout",
        "3600",
        *extra,
    ]


def _shm_buffers() -> set[str]:
    return (
        {p.name for p in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*")} if Path("/dev/shm").is_dir() else set()
    )


def test_sft_probes_are_stored_compared_and_not_run_twice(
    cli: Cli, db: Path, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import probes.runner

    ports: list[str] = []  # the MASTER_PORT of each probe this test starts (other work may run beside it)

    def recording_env(*args: Any, **kwargs: Any) -> dict[str, str]:
        env = original_env(*args, **kwargs)
        ports.append(env["MASTER_PORT"])
        return env

    original_env = probes.runner.child_env
    monkeypatch.setattr(probes.runner, "child_env", recording_env)
    strategies = tmp_path / "strategies.json"
    strategies.write_text(json.dumps(SFT_STRATEGIES))
    args = _job(tiny, "--workload", "sft", "--batch", "2", "--seq-len", "32", "--strategies", strategies)
    first = cli("probe", *args, "--layers", "1", "--json", "--db", db)
    assert first.rc == 0, first.err
    report = first.json()
    # each strategy at 1 layer and (the tiny model fits) at its full 2 layers
    assert [(r["strategy"]["zero_stage"], r["layers"]) for r in report["rows"]] == [
        (0, 1),
        (0, None),
        (2, 1),
        (2, None),
    ]
    for row in report["rows"]:
        assert row["outcome"] == "ok" and not row["reused"]
        assert [p["name"] for p in row["measured"]["phases"]] == ["forward", "backward", "optimizer_step"]
        measured, predicted = row["measured"]["peak_allocated_bytes"], row["predicted"]["peak_allocated_bytes"]
        assert measured > 0 and row["errors"]["peak_allocated"] == pytest.approx(predicted / measured - 1)
    assert report["fingerprint"]["device"] == "cpu" and report["fingerprint"]["torch"]
    # DeepSpeed's CPU allreduce buffers (named after the port) do not pile up in /dev/shm
    assert len(ports) == 4
    assert not [name for name in _shm_buffers() if any(f"_{port}_" in name for port in ports)]

    listed = cli("probes", "--json", "--db", db).json()
    assert {p["probe_id"] for p in listed} == {r["probe_id"] for r in report["rows"]}

    again = cli("probe", *args, "--layers", "1", "--json", "--db", db).json()
    assert all(r["reused"] for r in again["rows"])
    assert [r["probe_id"] for r in again["rows"]] == [r["probe_id"] for r in report["rows"]]
    assert len(cli("probes", "--json", "--db", db).json()) == 4  # nothing ran again

    human = cli("probe", *args, "--layers", "1", "--db", db)
    assert human.rc == 0 and "stored" in human.out and "measured" in human.out.lower()


def test_ppo_probe_measures_every_phase(cli: Cli, db: Path, tiny: Path, tmp_path: Path) -> None:
    block = {"zero_stage": 2}
    strategy = {
        "actor": block, "critic": block, "reference": {"zero_stage": 0, "offload": "none"},
        "reward": {"zero_stage": 0, "offload": "none"}, "hybrid_engine": False, "generation_batch": 2,
        "micro_batch": 2, "grad_accum": 1, "empty_cache": "after-inference",
    }  # fmt: skip
    file = tmp_path / "ppo.json"
    file.write_text(json.dumps(strategy))
    args = _job(tiny, "--workload", "ppo", "--batch", "2", "--prompt-len", "8", "--gen-len", "4", "--strategies", file)
    result = cli("probe", *args, "--layers", "2", "--json", "--db", db)
    assert result.rc == 0, result.err
    (row,) = result.json()["rows"]
    assert row["outcome"] == "ok", row["message"]
    names = [p["name"] for p in row["measured"]["phases"]]
    assert names == ["generation", "scoring", "actor_training", "critic_training"]
    assert all(p["peak_allocated_bytes"] > 0 for p in row["measured"]["phases"])


def test_memory_cap_gives_an_oom_outcome_and_the_run_goes_on(cli: Cli, db: Path, tiny: Path, tmp_path: Path) -> None:
    file = tmp_path / "one.json"
    file.write_text(json.dumps(SFT_STRATEGIES))
    args = _job(tiny, "--workload", "sft", "--batch", "2", "--seq-len", "32", "--strategies", file, "--layers", "2")
    result = cli("probe", *args, "--memory-cap", "2M", "--json", "--db", db)
    assert result.rc == 0, result.err
    rows = result.json()["rows"]
    assert [r["outcome"] for r in rows] == ["oom", "oom"]  # both probes ran although the first failed
    assert all(r["failed_phase"] for r in rows)


def test_an_interrupted_run_resumes_where_it_stopped(db: Path, tiny: Path, tmp_path: Path) -> None:
    from planner import probe
    from probes import run_probe
    from store.db import open_storage

    file = tmp_path / "two.json"
    file.write_text(json.dumps(SFT_STRATEGIES))
    job: dict[str, Any] = dict(
        workload="sft", gpu_mem="24G", cpu_mem="64G", batch=2, seq_len=32, strategies=str(file), layers="2",
        device="cpu", steps=2, timeout_s=3600.0, db=str(db),
    )  # fmt: skip
    calls: list[str] = []

    def interrupted_after_one(request: Any) -> Any:
        if calls:
            raise KeyboardInterrupt  # the user pressed Ctrl-C while the second probe started
        calls.append("ran")
        return run_probe(request)

    with pytest.raises(KeyboardInterrupt):
        probe(str(tiny), runner=interrupted_after_one, **job)
    with open_storage(str(db)) as storage:
        (only,) = storage.list_probes()
    ran_again: list[str] = []

    def counting(request: Any) -> Any:
        ran_again.append(request.strategy["zero_stage"])
        return run_probe(request)

    report = probe(str(tiny), runner=counting, **job)
    assert ran_again == [2]  # the first strategy was not run again, the one the interrupt stopped was
    assert [r.reused for r in report.rows] == [True, False]
    assert report.rows[0].probe_id == only.probe_id


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--device", "tpu"], "--device"),
        (["--steps", "1"], "--steps"),
        (["--layers", "0"], "--layers"),
        (["--layers", "two"], "--layers"),
        (["--gpus", "5"], "--gpus 5: a probe runs one rank per GPU on this node, and the CPU backend runs at most 4"),
        (["--strategies", "missing.json"], "missing.json"),
        (["--memory-cap", "lots"], "--memory-cap"),
    ],
)
def test_bad_probe_input(cli: Cli, db: Path, tiny: Path, extra: list[str], fragment: str) -> None:
    args = [
        "--model",
        str(tiny),
        "--device",
        "cpu",
        "--gpu-mem",
        "24G",
        "--cpu-mem",
        "64G",
        "--workload",
        "sft",
        "--seq-len",
        "32",
    ]
    assert_one_error_line(cli("probe", *args, *extra, "--db", db), fragment)


def test_two_depths_extrapolate_to_the_full_model_with_its_error(cli: Cli, db: Path, tmp_path: Path) -> None:
    """--layers 1,2 on a 4-layer model: both extrapolations to 4 layers, the full model probed beside them
    (it fits), and their errors against it. The model-anchored one lands within 5% of the measurement."""
    folder = tmp_path / "llama-4l"
    folder.mkdir()
    config = dict(TINY_LLAMA, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, vocab_size=4096)
    (folder / "config.json").write_text(json.dumps(config))
    strategies = tmp_path / "strategies.json"
    strategies.write_text(json.dumps([{"zero_stage": 3, "micro_batch": 2}]))  # ZeRO-3: partitions and gathers
    args = _job(folder, "--workload", "sft", "--batch", "2", "--seq-len", "64", "--strategies", strategies)
    result = cli("probe", *args, "--layers", "1,2", "--json", "--db", db)
    assert result.rc == 0, result.err
    report = result.json()
    assert [(r["strategy"]["zero_stage"], r["layers"]) for r in report["rows"]] == [(3, 1), (3, 2), (3, None)]
    assert all(r["outcome"] == "ok" for r in report["rows"])
    assert len(report["extrapolations"]) == 1
    for x, stage in zip(report["extrapolations"], (3,), strict=True):
        mine = [r for r in report["rows"] if r["strategy"]["zero_stage"] == stage]
        rows = {r["layers"]: r["measured"] for r in mine}
        predicted = {r["layers"]: r["predicted"] for r in mine}
        assert x["depths"] == [1, 2] and x["full_layers"] == 4
        key = "peak_allocated_bytes"
        one, two, full = rows[1][key], rows[2][key], rows[None][key]
        assert x["extrapolated"][key] == pytest.approx(two + (two - one) * 2)  # the line through 1 and 2, at 4
        # anchored: the full-depth prediction plus the measured-minus-predicted line, read at 4
        residual_one, residual_two = one - predicted[1][key], two - predicted[2][key]
        anchored = predicted[None][key] + residual_two + (residual_two - residual_one) * 2
        assert x["anchored"][key] == pytest.approx(anchored)
        assert x["measured_full"][key] == full
        assert x["errors"][key] == pytest.approx(x["extrapolated"][key] / full - 1)
        assert x["anchored_errors"][key] == pytest.approx(x["anchored"][key] / full - 1)
        assert abs(x["anchored_errors"][key]) < 0.05, x
        assert x["anchored"]["step_time_s"] is None  # CPU times say nothing about the GPU time model
    human = cli("probe", *args, "--layers", "1,2", "--db", db)
    assert human.rc == 0 and "extrapolated to 4" in human.out and "model-anchored" in human.out


@pytest.mark.parametrize("supported", [False, True], ids=["cpu-without-fp16", "cpu-with-fp16"])
def test_fp16_probe_on_a_cpu_without_fp16_is_one_line(
    cli: Cli, db: Path, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, supported: bool
) -> None:
    """The processor's answer comes from DeepSpeed's CPU accelerator (patched here to each answer): without
    fp16 the whole run is refused in one line with exit 2 and nothing stored; with it the probes run."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    from store.db import open_storage

    monkeypatch.setattr(CPU_Accelerator, "is_fp16_supported", lambda self: supported)
    strategies = tmp_path / "one.json"
    strategies.write_text(json.dumps(SFT_STRATEGIES[:1]))
    args = _job(tiny, "--workload", "sft", "--batch", "2", "--seq-len", "32", "--strategies", strategies)
    ran: list[str] = []

    if supported:
        from planner import probe
        from store.measurements import ProbeResult

        def runner(request: Any) -> ProbeResult:
            ran.append(request.workload["dtype"])
            return ProbeResult(outcome="error", phases=(), failed_phase="init", message="not run in this test")

        probe(str(tiny), runner=runner, workload="sft", gpu_mem="24G", cpu_mem="64G", batch=2, seq_len=32,
              strategies=str(strategies), layers="2", device="cpu", steps=2, dtype="fp16", db=str(db))  # fmt: skip
        assert ran == ["fp16"]
        return
    result = cli("probe", *args, "--dtype", "fp16", "--db", db)
    assert_one_error_line(result, "fp16")
    assert "--dtype bf16" in result.err
    with open_storage(str(db)) as storage:
        assert storage.list_probes() == []


def test_the_report_predicts_with_the_coefficients_given_to_probe(db: Path, tmp_path: Path) -> None:
    """``probe(coefficients=...)``: the rows and the full-depth prediction of the extrapolation use them (the
    report once predicted the full depth with the defaults whatever was passed)."""
    from planner import probe
    from search import DEFAULT_COEFFICIENTS
    from store.measurements import PhaseMeasurement, ProbeResult

    folder = tmp_path / "llama-4l"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(TINY_LLAMA, num_hidden_layers=4, vocab_size=4096)))
    strategies = tmp_path / "one.json"
    strategies.write_text(json.dumps(SFT_STRATEGIES[:1]))

    def runner(request: Any) -> ProbeResult:  # a stand-in measurement: what is compared is the prediction
        bytes_ = 1_000_000 * (request.layers or 4)
        phase = PhaseMeasurement(name="backward", peak_allocated_bytes=bytes_, peak_reserved_bytes=bytes_, time_s=0.1)
        return ProbeResult(outcome="ok", phases=(phase,), layers=request.layers)

    job: dict[str, Any] = dict(
        workload="sft", gpu_mem="24G", cpu_mem="64G", batch=2, seq_len=32, strategies=str(strategies), layers="1,2",
        device="cpu", steps=2, runner=runner, force=True,
    )  # fmt: skip
    bigger_logits = DEFAULT_COEFFICIENTS.with_(logits_peak_bytes=4 * DEFAULT_COEFFICIENTS.logits_peak_bytes)
    default = probe(str(folder), db=str(tmp_path / "a.db"), **job)
    custom = probe(str(folder), db=str(tmp_path / "b.db"), coefficients=bigger_logits, **job)
    key = "peak_allocated_bytes"
    (row_default, *_), (row_custom, *_) = default.rows, custom.rows
    assert row_custom.predicted[key] > row_default.predicted[key]  # the rows used the given coefficients
    full_default = default.extrapolations[0].predicted_full[key]
    full_custom = custom.extrapolations[0].predicted_full[key]
    full_row = next(r for r in custom.rows if r.layers is None)
    assert full_custom == full_row.predicted[key] and full_custom > full_default

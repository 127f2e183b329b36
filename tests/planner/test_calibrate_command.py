"""`planner calibrate`: the cost model fitted to one device's measurements, stored, and then used (and named)
by recommend, predict, check and probe. The H100 records of tests/data/gpu are real GPU measurements; the
CPU case probes DeepSpeed's CPU accelerator for real and calibrates that device end to end."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO, CliResult, assert_one_error_line

Cli = Callable[..., CliResult]
H100_RECORDS = REPO / "tests" / "data" / "gpu" / "h100-2026-11-23.json"
H100_JOB = ("--model", "opt-1.3b", "--gpu", "H100", "--cpu-mem", "128G", "--workload", "sft")


@pytest.fixture(scope="module")
def h100_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A database holding one calibration of the H100, fitted to the records file (probes and loop rows)."""
    from planner import calibrate

    db = tmp_path_factory.mktemp("h100") / "plans.db"
    report = calibrate(records=[str(H100_RECORDS)], db=str(db))
    return db, report.model_dump()


def test_the_h100_measurements_calibrate_the_h100(h100_db: tuple[Path, dict[str, Any]]) -> None:
    _, report = h100_db
    assert report["target"] == "H100-80G" and report["device"] == "cuda" and report["calibration_id"]
    assert report["observations"] == 14 and not report["skipped"]  # 7 probes that finished, 7 loop rows
    errors = report["errors"]
    # peak reserved comes from the allocator replay: within 2% (median) before any fit, and no coefficient the
    # fit moves changes it (the fragment coefficients only screen the search)
    reserved = errors["before"]["peak_reserved"]["median_abs"]
    assert reserved < 0.02 and errors["held_out"]["peak_reserved"]["median_abs"] == reserved
    assert errors["after"]["time"]["median_abs"] < errors["before"]["time"]["median_abs"]
    determined = {p["name"] for p in report["parameters"] if p["determined"]}
    assert {"gpu.matmul_efficiency", "host_s_per_kernel", "host_memory_gbps"} <= determined
    assert "nvme_gbps" not in determined  # no NVMe run among the records
    # calibrated on this CPU machine from the H100's records: no host term is measured here; each is fitted or
    # assumed, and the assumed ones say why
    terms = report["host_terms"]
    assert terms["host_s_per_kernel"]["source"] == terms["host_memory_gbps"]["source"] == "fitted"
    for name in ("host_first_touch_gbps", "pageable_copy_gbps"):
        assert terms[name]["source"] == "assumed" and "another machine" in terms[name]["how"]


def test_held_out_error_falls_on_the_h100_probes() -> None:
    """Each of memplan's own H100 probes predicted by a fit to the other six: phase time and reserved."""
    from planner.calibration.gather import gather, records_file_entries
    from search.calibration import calibrate

    probes, _ = records_file_entries(str(H100_RECORDS))
    fit = calibrate(gather(probes, "H100").observations)
    assert fit.held_out["time"].median_abs < fit.before["time"].median_abs
    assert fit.held_out["peak_reserved"].median_abs == fit.before["peak_reserved"].median_abs  # the replay's


def test_predictions_use_and_name_the_calibration_of_their_gpu(cli: Cli, h100_db: tuple[Path, dict[str, Any]]) -> None:
    db, report = h100_db
    calibrated = cli("predict", *H100_JOB, "--zero", "2", "--db", db, "--json")
    assert calibrated.rc == 0, calibrated.err
    block = calibrated.json()["calibration"]
    assert block["id"] == report["calibration_id"] and block["target"] == "H100-80G" and block["probes"] == 14
    assert block["host_terms"] == report["host_terms"]  # the plan says per host term how it was had
    defaults = cli("predict", *H100_JOB, "--zero", "2", "--db", db, "--json", "--calibration", "none")
    assert defaults.json()["calibration"]["id"] is None
    assert calibrated.json()["predicted"]["step_time_s"] != defaults.json()["predicted"]["step_time_s"]
    by_id = cli(
        "predict", *H100_JOB, "--zero", "2", "--db", db, "--json", "--calibration", report["calibration_id"][:6]
    )
    assert by_id.json()["predicted"] == calibrated.json()["predicted"]
    # another GPU has no calibration: the defaults, and the report says so
    a100 = cli(
        "predict", "--model", "opt-1.3b", "--gpu", "A100", "--workload", "sft", "--zero", "2", "--db", db, "--json"
    )
    assert a100.json()["calibration"]["id"] is None and "none stored" in a100.json()["calibration"]["why"]
    assert {term["source"] for term in a100.json()["calibration"]["host_terms"].values()} == {"assumed"}
    text = cli("recommend", *H100_JOB, "--db", db)
    assert text.rc == 0 and f"calibration: {report['calibration_id']} for H100-80G from 14 probes" in text.out
    assert "pageable_copy_gbps 6.6 assumed" in " ".join(text.out.split())


def test_check_uses_the_calibration_too(cli: Cli, h100_db: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    db, report = h100_db
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}}))
    checked = cli("check", config, "--model", "opt-1.3b", "--gpu", "H100", "--db", db, "--json")
    assert checked.rc == 0, checked.err
    assert checked.json()["report"]["calibration"]["id"] == report["calibration_id"]


def test_calibrations_lists_what_was_stored(cli: Cli, h100_db: tuple[Path, dict[str, Any]]) -> None:
    db, report = h100_db
    listed = cli("calibrations", "--db", db, "--json")
    assert listed.rc == 0, listed.err
    assert [c["calibration_id"] for c in listed.json()] == [report["calibration_id"]]
    assert listed.json()[0]["probe_ids"] == report["probe_ids"]
    table = cli("calibrations", "--db", db)
    assert report["calibration_id"] in table.out and "H100-80G" in table.out


def test_a_dry_run_stores_nothing(cli: Cli, db: Path) -> None:
    result = cli("calibrate", "--records", H100_RECORDS, "--db", db, "--dry-run", "--no-held-out")
    assert result.rc == 0, result.err
    assert "not saved" in result.out and "peak reserved" in result.out
    assert cli("calibrations", "--db", db, "--json").json() == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "no finished probe to calibrate from"),
        (("--records", H100_RECORDS, "--device-fingerprint", "A100"), "matches no stored probe's device"),
    ],
)
def test_bad_calibrate_input_is_one_line(cli: Cli, db: Path, args: tuple[Any, ...], fragment: str) -> None:
    assert_one_error_line(cli("calibrate", *args, "--db", db), fragment)


def test_an_unknown_calibration_id_is_one_line(cli: Cli, h100_db: tuple[Path, dict[str, Any]]) -> None:
    db, _ = h100_db
    assert_one_error_line(
        cli("predict", *H100_JOB, "--zero", "2", "--db", db, "--calibration", "zzzzzz"), "no calibration has an id"
    )


CPU_MODEL = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip
CPU_STRATEGIES = [
    {"zero_stage": 0, "micro_batch": 1, "grad_accum": 4},
    {"zero_stage": 0, "micro_batch": 4, "grad_accum": 1},
    {"zero_stage": 2, "gradient_checkpointing": True, "micro_batch": 2, "grad_accum": 2},
]


@pytest.mark.slow
def test_the_cpu_backend_is_calibrated_end_to_end(cli: Cli, db: Path, tmp_path: Path) -> None:
    """Probe DeepSpeed's CPU accelerator, calibrate that device, and probe again: the report now names the
    calibration and compares step times. Nothing here depends on how fast this machine is: the fit lowers
    the squared log error it minimises (whatever the times were), and the rest is bookkeeping."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CPU_MODEL))
    strategies = tmp_path / "strategies.json"
    strategies.write_text(json.dumps(CPU_STRATEGIES))
    job = ("--model", folder, "--device", "cpu", "--gpu-mem", "24G", "--cpu-mem", "64G", "--workload", "sft")
    probe = (*job, "--batch", "4", "--seq-len", "64", "--steps", "2", "--timeout", "3600", "--strategies", strategies)
    first = cli("probe", *probe, "--layers", "2", "--json", "--db", db)
    assert first.rc == 0, first.err
    assert first.json()["calibration"]["id"] is None  # nothing fitted yet: times are not compared on the CPU
    assert all(row["errors"]["step_time"] is None for row in first.json()["rows"])

    fitted = cli("calibrate", "--db", db, "--json")
    assert fitted.rc == 0, fitted.err
    report = fitted.json()
    assert report["device"] == "cpu" and report["target"].startswith("cpu:") and report["observations"] == 3
    assert sorted(report["probe_ids"]) == sorted(row["probe_id"] for row in first.json()["rows"])
    errors = report["errors"]
    assert errors["after"]["time"]["rms_log"] <= errors["before"]["time"]["rms_log"]
    assert errors["held_out"]["time"]["count"] == errors["before"]["time"]["count"] == 9  # 3 phases x 3 probes
    determined = {p["name"]: p for p in report["parameters"] if p["determined"]}
    # the step times determine a time term; which one (the matmul rate, the HBM rate, the kernel issue time) is
    # this machine's: one OpenMP thread (the suite's setting) makes the element-wise terms the ones that move
    assert any(p["moves"] == "time" for p in determined.values()), sorted(determined)
    assert "cublas_workspace_bytes" not in determined  # the CPU backend has no cuBLAS workspace
    terms = report["host_terms"]  # this machine's device: its host benchmark ran (probes/measure/host_rates.py)
    assert terms["host_memory_gbps"]["source"] in ("measured", "fitted") and report["host_benchmark"]["measured"]
    assert terms["pageable_copy_gbps"]["source"] == "assumed" and "CUDA" in terms["pageable_copy_gbps"]["how"]

    again = cli("probe", *probe, "--layers", "2", "--json", "--db", db)  # reuses the stored probes
    assert again.rc == 0, again.err
    assert again.json()["calibration"]["id"] == report["calibration_id"]
    assert all(row["reused"] and row["errors"]["step_time"] is not None for row in again.json()["rows"])

"""What memplan measures of this host once and keeps (``planner.job.host_cache``): the probe estimate's CPU rates
(``planner.probing.cpu_rates``) and the calibration's host benchmark (``planner.calibration.fit``). The first call
measures and keeps them in the user's cache folder, a later one (a new process too) reads them without importing
torch or running the benchmark, and a new host key, a damaged file or a folder that cannot be written measure
again, never fail.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO, subprocess_env

from planner.job.host_cache import MAX_AGE, cache_path, host_key, keep, kept, update
from planner.probing import cpu_rates as rates_module
from planner.probing.cpu_rates import cpu_rates


@pytest.fixture(autouse=True)
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder of the test's own, and no rates remembered by this process from before."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rates_module._cached_rates.cache_clear()
    yield tmp_path / "cache"
    rates_module._cached_rates.cache_clear()


class Measured:
    """A stand-in for the measurement (the real one runs in the first test): counts the calls."""

    def __init__(self, flops: float = 3e10, copy: float = 7e9) -> None:
        self.calls: list[str] = []
        self.rates = (flops, copy)

    def __call__(self, dtype: str) -> tuple[float, float]:
        self.calls.append(dtype)
        return self.rates


def _just_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _refuse(dtype: str) -> tuple[float, float]:
    raise AssertionError(f"measured {dtype} again: the kept rates were not used")


def test_the_first_probe_measures_and_keeps_the_rates_a_later_one_reads_them(
    cache_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flops, copy = cpu_rates("fp32")  # measured now, with torch
    assert flops > 1e8 and copy > 1e8  # any CPU multiplies and copies faster than 100 M/s
    kept = json.loads(cache_path().read_text())
    assert cache_path() == cache_folder / "memplan" / "host_rates.json"
    mine = kept[host_key()]["cpu_rates"]
    assert mine["matmul_flops_per_s"] == {"fp32": flops} and mine["copy_bytes_per_s"] == copy and mine["measured_at"]
    rates_module._cached_rates.cache_clear()  # as a new process
    monkeypatch.setattr(rates_module, "measure", _refuse)
    assert cpu_rates("fp32") == (flops, copy)


def test_a_new_process_reads_the_kept_rates_without_importing_torch(cache_folder: Path) -> None:
    key = host_key()
    path = cache_path()
    path.parent.mkdir(parents=True)
    rates = {"matmul_flops_per_s": {"bf16": 2.5e10}, "copy_bytes_per_s": 6e9, "measured_at": _just_now()}
    path.write_text(json.dumps({key: {"cpu_rates": rates}}))
    code = (
        "import sys; from planner.probing.cpu_rates import cpu_rates; print(cpu_rates('bf16'), 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=subprocess_env({"XDG_CACHE_HOME": str(cache_folder)}),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["(25000000000.0,", "6000000000.0)", "False"], done.stdout + done.stderr


def test_another_host_key_or_dtype_measures_again_and_keeps_both(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = Measured()
    monkeypatch.setattr(rates_module, "measure", measured)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    one_thread = host_key()
    assert cpu_rates("fp32") == measured.rates
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torch's threads: another rate, another key
    assert host_key() != one_thread
    assert cpu_rates("fp32") == measured.rates and measured.calls == ["fp32", "fp32"]
    assert cpu_rates("bf16") == measured.rates and measured.calls == ["fp32", "fp32", "bf16"]
    kept = json.loads(cache_path().read_text())
    assert set(kept) == {one_thread, host_key()}
    assert set(kept[host_key()]["cpu_rates"]["matmul_flops_per_s"]) == {"fp32", "bf16"}  # added beside the first


def test_a_damaged_cache_is_measured_past_and_rewritten(monkeypatch: pytest.MonkeyPatch) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"half a file')
    measured = Measured()
    monkeypatch.setattr(rates_module, "measure", measured)
    assert cpu_rates("fp32") == measured.rates and measured.calls == ["fp32"]
    assert json.loads(path.read_text())[host_key()]["cpu_rates"]["copy_bytes_per_s"] == measured.rates[1]
    path.write_text(json.dumps({host_key(): {"cpu_rates": {"matmul_flops_per_s": [1e10], "copy_bytes_per_s": "x"}}}))
    rates_module._cached_rates.cache_clear()
    assert cpu_rates("fp32") == measured.rates and measured.calls == ["fp32", "fp32"]  # no rate: measured


def test_a_cache_folder_that_cannot_be_written_is_no_error(cache_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_folder.write_text("a file where the folder would be")
    measured = Measured()
    monkeypatch.setattr(rates_module, "measure", measured)
    assert cpu_rates("fp32") == measured.rates
    assert cpu_rates("fp32") == measured.rates and measured.calls == ["fp32"]  # kept by this process meanwhile
    assert cache_folder.read_text() == "a file where the folder would be"


def test_the_host_benchmark_runs_once_per_host_and_the_report_says_where_its_rates_come_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from planner.calibration.fit import _host_rates
    from planner.job.target import detected_target
    from probes.measure import host_rates
    from probes.measure.host_rates import HostRates

    ran: list[int] = []

    def benchmark() -> HostRates:  # a stand-in: the real benchmark is tests/probes/test_host_rates.py's
        ran.append(1)
        return HostRates(12.5, 3.0, None, threads=1, buffer_bytes=2**20, seconds=0.5, why_not={"x": "y"})

    monkeypatch.setattr(host_rates, "measure_host_rates", benchmark)
    here = detected_target()
    measured, report = _host_rates(here, run=True)
    assert measured == {"host_memory_gbps": 12.5, "host_first_touch_gbps": 3.0} and report["source"] == "measured now"
    again, kept_report = _host_rates(here, run=True)  # as a later tune or calibrate of this host
    assert ran == [1] and again == measured
    assert kept_report["source"].startswith(f"kept in {cache_path()} (measured 20")
    assert kept_report["measured"] == report["measured"] and kept_report["why_not"] == {"x": "y"}
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # another thread count: another host key, measured again
    assert _host_rates(here, run=True)[1]["source"] == "measured now" and ran == [1, 1]


MEASURED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # an injected clock: no test waits for an entry to age


def test_an_entry_is_used_until_max_age_then_measured_again() -> None:
    keep("cpu_rates", {"copy_bytes_per_s": 6e9}, now=MEASURED)
    assert kept("cpu_rates", now=MEASURED + MAX_AGE)["copy_bytes_per_s"] == 6e9
    assert kept("cpu_rates", now=MEASURED + MAX_AGE + timedelta(seconds=1)) == {}
    assert kept("cpu_rates", now=MEASURED - timedelta(seconds=1)) == {}  # a clock set back: its age is unknown
    assert kept("host_benchmark", now=MEASURED) == {}


def test_an_old_or_undated_entry_is_measured_again_by_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True)
    measured = Measured()
    monkeypatch.setattr(rates_module, "measure", measured)
    old = {"matmul_flops_per_s": {"fp32": 1e10}, "copy_bytes_per_s": 1e9, "measured_at": "2020-01-01T00:00:00+00:00"}
    undated = {"matmul_flops_per_s": {"fp32": 1e10}, "copy_bytes_per_s": 1e9}
    for entry in (old, undated):
        path.write_text(json.dumps({host_key(): {"cpu_rates": entry}}))
        rates_module._cached_rates.cache_clear()  # as a new process
        assert cpu_rates("fp32") == measured.rates
    assert measured.calls == ["fp32", "fp32"]
    assert kept("cpu_rates")["copy_bytes_per_s"] == measured.rates[1]  # kept anew, dated now: fresh


def test_a_dtype_another_process_kept_while_this_one_measured_stays_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    path = cache_path()
    theirs = {"matmul_flops_per_s": {"bf16": 5e10}, "copy_bytes_per_s": 8e9, "measured_at": _just_now()}

    def measured_beside_another(dtype: str) -> tuple[float, float]:  # another probe keeps bf16 meanwhile
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({host_key(): {"cpu_rates": theirs}}))
        return 3e10, 7e9

    monkeypatch.setattr(rates_module, "measure", measured_beside_another)
    assert cpu_rates("fp32") == (3e10, 7e9)
    assert json.loads(path.read_text())[host_key()]["cpu_rates"]["matmul_flops_per_s"] == {"bf16": 5e10, "fp32": 3e10}


def test_a_writer_reads_and_writes_under_the_lock_another_writer_waits_on() -> None:
    lock_path = cache_path().with_name(cache_path().name + ".lock")
    seen: list[dict[str, Any]] = []

    def change(held: dict[str, Any]) -> dict[str, Any]:
        with open(lock_path, "a") as other, pytest.raises(BlockingIOError):  # another writer's own open of it
            fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        seen.append(held)
        return {**held, "n": held.get("n", 0) + 1}

    update("counter", change, now=MEASURED)
    update("counter", change, now=MEASURED)
    assert seen == [{}, {"n": 1}]  # the second read what the first wrote, without its measured_at
    assert kept("counter", now=MEASURED) == {"n": 2, "measured_at": MEASURED.isoformat(timespec="seconds")}
    with open(lock_path, "a") as after:  # released
        fcntl.flock(after.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_calibration_report_says_whether_the_host_rates_were_measured_now_or_read_from_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The text and the JSON of ``planner calibrate`` say ``host rates: measured now`` or ``host rates: from the
    cache of DATE (expires DATE)``. Before, the text said neither, and the JSON not when a kept entry expires."""
    from planner.calibration.fit import _host_rates
    from planner.job.target import detected_target
    from planner.report.calibration_text import render_calibration
    from planner.report.results import CalibrationReport
    from planner.report.text import console
    from probes.measure import host_rates
    from probes.measure.host_rates import HostRates

    def benchmark() -> HostRates:  # a stand-in, as above
        return HostRates(12.5, 3.0, None, threads=1, buffer_bytes=2**20, seconds=0.5, why_not={})

    monkeypatch.setattr(host_rates, "measure_host_rates", benchmark)
    here = detected_target()
    _, measured = _host_rates(here, run=True, now=MEASURED)
    _, cached = _host_rates(here, run=True, now=MEASURED + timedelta(days=2))  # read back two days on
    week_on = "2026-03-08T12:00:00+00:00"  # MEASURED + MAX_AGE, a week
    assert measured["host_rates"] == f"measured now (kept in the cache until {week_on})"
    assert cached["host_rates"] == f"from the cache of 2026-03-01T12:00:00+00:00 (expires {week_on})"
    assert (cached["measured_at"], cached["expires_at"]) == ("2026-03-01T12:00:00+00:00", week_on)
    for benchmark_report, said in ((measured, "measured now"), (cached, "from the cache of 2026-03-01T12:00:00")):
        report = CalibrationReport(
            calibration_id=None, target=here, device="cpu", fingerprint={}, observations=1, probe_ids=["p"],
            parameters=[], errors={}, version=1, host_benchmark=benchmark_report,
        )  # fmt: skip
        assert json.loads(report.to_json())["host_benchmark"]["host_rates"] == benchmark_report["host_rates"]
        with console.capture() as captured:
            render_calibration(report)
        assert f"host rates: {said}" in " ".join(captured.get().split())

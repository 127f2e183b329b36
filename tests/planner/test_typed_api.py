"""A typed Python API: ``py.typed``, job keywords typed as ``JobSpec``'s fields, sizes that never mean a bare 24."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from planner_helpers import REPO, CliResult, assert_one_error_line

from planner.job.hardware import MIN_MEMORY
from planner.job.inputs import JobKeywords, JobSpec
from store.errors import InputError

Cli = Callable[..., CliResult]
PACKAGES = ("planner", "search", "store", "launch", "probes")


def test_every_package_ships_py_typed() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in PACKAGES:
        assert (REPO / package / "py.typed").is_file(), package
        assert "py.typed" in data[package], package
    assert "*.schema.json" in data["planner.schema"]


def test_job_keywords_are_the_jobspec_fields_with_their_types() -> None:
    spec = {f.name: f.type for f in dataclasses.fields(JobSpec)}
    spec.pop("model")
    keywords = JobKeywords.__annotations__
    assert set(keywords) == set(spec)
    for name, annotation in keywords.items():
        shown = annotation if isinstance(annotation, str) else getattr(annotation, "__forward_arg__", annotation)
        assert " ".join(str(shown).split()) == " ".join(str(spec[name]).split()), name
    assert not JobKeywords.__total__  # every keyword is optional: JobSpec's defaults fill the rest


@pytest.mark.parametrize("name", ["recommend", "predict", "check", "probe", "tune"])
def test_the_api_takes_typed_job_keywords(name: str) -> None:
    import planner.api as api

    function = getattr(api, name)
    parameters = inspect.signature(function).parameters
    rest = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert len(rest) == 1, name
    assert "Unpack[" in str(rest[0].annotation), (name, rest[0].annotation)  # not **job: Any
    assert parameters["model"].annotation == "str | JobSpec"


@pytest.mark.parametrize(
    ("options", "implementation"),
    [("ProbeOptions", "planner.probing.session:probe"), ("TuneOptions", "planner.tuning.run:tune")],
)
def test_probe_and_tune_options_follow_their_implementations(options: str, implementation: str) -> None:
    """The typed keywords of ``probe`` and ``tune`` are what the functions behind them take."""
    import importlib

    import planner.api as api

    module, name = implementation.split(":")
    own = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    expected = {p for p, param in own.items() if param.kind is inspect.Parameter.KEYWORD_ONLY}
    if options == "ProbeOptions":
        expected.discard("device")  # probe's own parameter in planner.api
    declared = set(getattr(api, options).__annotations__) - set(JobKeywords.__annotations__)
    assert declared == expected


def test_the_public_names_include_the_types() -> None:
    import planner.api as api

    for name in ("JobKeywords", "ProbeOptions", "TuneOptions", "ProbeReport", "SCHEMA_VERSION"):
        assert name in api.__all__ and hasattr(api, name), name


@pytest.mark.parametrize("value", [24, "24", " 24 ", 24.0, "512K", "1000B", 2**20 - 1])
def test_a_size_without_its_unit_is_refused(value: object) -> None:
    from planner import predict

    for keyword in ("gpu_mem", "cpu_mem"):
        job = {"gpu_mem": "24G", "cpu_mem": "64G", keyword: value}
        with pytest.raises(InputError, match=f"--{keyword.replace('_', '-')}") as raised:
            predict("opt-125m", {"zero_stage": 2}, workload="sft", **job)  # type: ignore[arg-type]
        message = str(raised.value)
        assert "\n" not in message and ("24G" in message or "G (" in message), message


def test_sizes_with_units_or_in_bytes_are_read() -> None:
    from planner import predict

    by_unit = predict("opt-125m", {"zero_stage": 2}, workload="sft", gpu_mem="24G", cpu_mem="64GiB")
    in_bytes = predict("opt-125m", {"zero_stage": 2}, workload="sft", gpu_mem=24 * 2**30, cpu_mem=64 * 2**30)
    assert by_unit.hardware["gpu_memory_bytes"] == in_bytes.hardware["gpu_memory_bytes"] == 24 * 2**30
    assert by_unit.predicted == in_bytes.predicted
    smallest = predict("opt-125m", {"zero_stage": 2}, workload="sft", gpu_mem=MIN_MEMORY, cpu_mem="64G")
    assert smallest.fits is False  # allowed, but nothing fits in 1 MiB


def test_the_cli_refuses_a_bare_gpu_mem(cli: Cli) -> None:
    result = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24", "--cpu-mem", "64G", "--workload", "sft")
    assert_one_error_line(result, "24G")
    assert_one_error_line(cli("predict", "--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64"), "--cpu-mem")


def test_py_typed_is_installed_beside_the_packages() -> None:
    import planner
    import store

    for module in (planner, store):
        assert (Path(module.__file__).parent / "py.typed").is_file()

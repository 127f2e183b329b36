"""Memory sizes as people type them, and the GPU catalog."""

from __future__ import annotations

import pytest

from store.errors import InputError
from store.gpus import generic_gpu, get_gpu, gpu_names
from store.sizes import format_bytes, parse_size

GiB = 2**30


@pytest.mark.parametrize(
    "text", ["24G", "24GB", "24GiB", "24g", "24 GiB", "24576MiB", "24576M", "25769803776", 25769803776]
)
def test_every_spelling_of_24_gib(text: str | int) -> None:
    assert parse_size(text) == 24 * GiB


def test_fractional_and_terabytes() -> None:
    assert parse_size("1.5T") == int(1.5 * 2**40)
    assert parse_size("512KiB") == 512 * 1024


@pytest.mark.parametrize("text", ["0", "0G", "-5G", "lots", "", "24X", "G", True])
def test_bad_sizes_are_input_errors(text: object) -> None:
    with pytest.raises(InputError):
        parse_size(text, "--gpu-mem")  # type: ignore[arg-type]


def test_format_bytes_picks_binary_units() -> None:
    assert format_bytes(24 * GiB) == "24.00 GiB"
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
    assert format_bytes(10) == "10 B"


def test_catalog_has_the_gpus_users_name() -> None:
    for name in (
        "A100-40G",
        "A100-80G",
        "H100-80G",
        "H200",
        "V100-16G",
        "V100-32G",
        "A10",
        "A6000",
        "L4",
        "L40S",
        "RTX-3090",
        "RTX-4090",
        "T4",
    ):
        gpu = get_gpu(name)
        assert gpu.memory_bytes > 10 * GiB and gpu.bf16_tflops > 0 and gpu.hbm_gbps > 0 and gpu.pcie_gbps > 0
    assert len(gpu_names()) >= 13


def test_gpu_lookup_is_forgiving_and_suggests() -> None:
    assert get_gpu("a100_80g") is get_gpu("A100-80G")
    assert get_gpu("rtx4090") is get_gpu("RTX-4090")
    with pytest.raises(InputError, match="H100-80G"):
        get_gpu("H100-80")


def test_generic_gpu_keeps_the_users_memory() -> None:
    assert generic_gpu(24 * GiB).memory_bytes == 24 * GiB


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("٢٤G", "cannot read"),  # Arabic-Indic digits: only ASCII ones are sizes
        ("２４G", "cannot read"),  # fullwidth digits
        ("24\nG", "cannot read '24\\nG'"),  # a line break inside (the message stays one line)
        ("24G\x00", "cannot read"),
        ("24iB", "cannot read"),  # "iB" needs K, M, G or T before it
        ("1.5B", "not a whole number of bytes"),
        ("1.5", "not a whole number of bytes"),
        (1.5, "not a whole number of bytes"),
        (float("nan"), "cannot read"),
        ("0.0000000001G", "less than one byte"),
        ("1e3G", "cannot read"),
    ],
)
def test_odd_sizes_are_one_line_input_errors(text: object, reason: str) -> None:
    with pytest.raises(InputError) as info:
        parse_size(text, "--gpu-mem")  # type: ignore[arg-type]
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_surrounding_whitespace_whole_floats_and_fractions_of_a_unit_are_read() -> None:
    assert parse_size(" 24G\n") == 24 * GiB
    assert parse_size(24.0 * GiB) == 24 * GiB
    assert parse_size("1.3G") == int(1.3 * GiB)  # rounded down to whole bytes
    assert parse_size("1.0") == 1

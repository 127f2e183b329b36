"""``TORCH_CUDA_ARCH_LIST`` as the probes hand it to DeepSpeed (fault 1 of the H100 run, issue 15).

DeepSpeed 0.19.8's JIT op builder cannot parse ``9.0a`` (``ValueError: invalid literal for int() with base
10: '0a'``), which the H100 image set, so every probe without CPU offload failed to build FusedAdam. These
tests pin the sanitizer's readings, feed its output to DeepSpeed's own arch parser (the CUDA FusedAdam
builder's ``compute_capability_args`` in JIT mode, which needs no GPU) and PyTorch's, and check that every
child (probe and op build) gets the sanitized variable.
"""

from __future__ import annotations

import os

import pytest

from probes.process.arch_list import ARCH_VARIABLE, arch_list_env, sanitize_arch_list
from probes.process.isolation import child_env


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("9.0a", "9.0"),
        ("9.0a;10.0a", "9.0;10.0"),
        ("8.0 8.6+PTX", "8.0;8.6+PTX"),
        ("9.0a+PTX", "9.0+PTX"),
        ("  7.5 ; 8.0,8.6 ", "7.5;8.0;8.6"),
        ("8.0;8.0+PTX;8.0", "8.0+PTX"),  # duplicates merge, +PTX kept
        ("12.0f", "12.0"),
        ("90a", "9.0"),
        ("sm_90", "9.0"),
        ("100a", "10.0"),
        ("8.6+ptx", "8.6+PTX"),
        ("Hopper", "9.0+PTX"),
        ("Ampere;Hopper", "8.0;8.6+PTX;9.0+PTX"),
        ("garbage;9.0a", "9.0"),
    ],
)
def test_sanitizer_keeps_what_deepspeed_can_parse(raw: str, clean: str) -> None:
    assert sanitize_arch_list(raw) == clean


@pytest.mark.parametrize("raw", ["", "   ", "garbage", "native", "9.x", "a.b;c", "9", "+PTX", None])
def test_nothing_readable_is_none(raw: str | None) -> None:
    assert sanitize_arch_list(raw) is None


def test_env_rewrites_only_what_needs_it_and_says_so() -> None:
    env, note = arch_list_env({"A": "1", ARCH_VARIABLE: "9.0a"})
    assert env == {"A": "1", ARCH_VARIABLE: "9.0"}
    assert note is not None and "'9.0a'" in note and "'9.0'" in note and "\n" not in note
    for clean in ("9.0", "8.0 8.6+PTX", "8.0;8.6+PTX"):
        assert arch_list_env({ARCH_VARIABLE: clean}) == ({ARCH_VARIABLE: clean}, None)  # left exactly as given
    assert arch_list_env({"A": "1"}) == ({"A": "1"}, None)  # unset stays unset
    env, note = arch_list_env({ARCH_VARIABLE: "garbage"})
    assert ARCH_VARIABLE not in env and note is not None and "compute capability" in note


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_child_gets_the_sanitized_list(device: str) -> None:
    env = child_env(device, "default", base={"PATH": os.environ.get("PATH", ""), ARCH_VARIABLE: "9.0a;10.0a"})
    assert env[ARCH_VARIABLE] == "9.0;10.0"
    env = child_env(device, "default", base={ARCH_VARIABLE: "nonsense"})
    assert ARCH_VARIABLE not in env
    env = child_env(device, "default", base={})
    assert ARCH_VARIABLE not in env


@pytest.mark.parametrize("raw", ["9.0a", "9.0a;10.0a", "8.0 8.6+PTX", "Hopper", "12.0a+PTX"])
def test_deepspeeds_own_parser_reads_the_sanitized_list(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA FusedAdam builder parses the arch list as ``jit_load`` hands it over; no GPU is asked."""
    pytest.importorskip("deepspeed")
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    monkeypatch.delenv(ARCH_VARIABLE, raising=False)  # compute_capability_args writes it: undone after
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    builder._jit_arch_list = sanitize_arch_list(raw)
    assert builder.compute_capability_args() == []  # JIT mode: PyTorch makes the -gencode flags from the env
    handed_to_torch = os.environ[ARCH_VARIABLE]
    assert handed_to_torch.endswith("+PTX")
    from torch.utils import cpp_extension

    if hasattr(cpp_extension, "_get_cuda_arch_flags"):  # PyTorch accepts what DeepSpeed passes on
        flags = cpp_extension._get_cuda_arch_flags()
        assert flags and all(flag.startswith("-gencode=arch=compute_") for flag in flags)


def test_the_raw_suffix_is_what_deepspeed_cannot_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the sanitizer exists; when a DeepSpeed release parses '9.0a' this test says the workaround can go."""
    pytest.importorskip("deepspeed")
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    monkeypatch.delenv(ARCH_VARIABLE, raising=False)
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    builder._jit_arch_list = "9.0a"
    with pytest.raises(ValueError, match="0a"):
        builder.compute_capability_args()

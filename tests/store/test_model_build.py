"""The program's model build under ZeRO-3 (store.model_build): which programs build under deepspeed.zero.Init."""

from __future__ import annotations

import pytest

from store.frameworks import FRAMEWORKS
from store.model_build import BUILDS_UNDER_ZERO_INIT, build_note, builds_partitioned


@pytest.mark.parametrize("framework", ["hf", "trl", "accelerate", "openrlhf", "deepspeed-chat", "verl"])
def test_trainer_based_programs_build_under_zero_init_whatever_the_size(framework: str) -> None:
    assert builds_partitioned(framework, model_bytes=1, device_bytes=10**12)
    assert "partitioned as it is made" in build_note(framework, True)


def test_memplans_own_loop_builds_whole_unless_the_model_is_larger_than_the_gpu() -> None:
    assert not builds_partitioned("deepspeed", model_bytes=10, device_bytes=11)
    assert builds_partitioned("deepspeed", model_bytes=12, device_bytes=11)
    assert "whole on every GPU" in build_note("deepspeed", False)
    assert "larger than the GPU" in build_note("deepspeed", True)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_quantized_model_is_loaded_whole_by_every_program(framework: str) -> None:
    assert not builds_partitioned(framework, quantized=True, model_bytes=10**12, device_bytes=1)


def test_every_program_is_named_by_the_rule() -> None:
    assert BUILDS_UNDER_ZERO_INIT | {"deepspeed"} == set(FRAMEWORKS)

"""An RLHF plan says how its program builds each model it trains under ZeRO-3 (issue 42): under
``deepspeed.zero.Init`` for the frameworks that build so (store.model_build), whole first for memplan's own loop;
nothing for a trained model at another stage."""

from __future__ import annotations

from dataclasses import replace

import pytest

from search import DEFAULT_COEFFICIENTS as C
from search import screen_rlhf
from store.gpus import get_gpu
from store.models import get_model
from store.records import FrozenModelStrategy, Hardware, RLHFStrategy, TrainedModelStrategy, Workload

GiB = 2**30


def _ppo(framework: str) -> tuple[Workload, Hardware]:
    spec = get_gpu("L4")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=2, cpu_memory_bytes=256 * GiB)
    workload = Workload(
        kind="ppo", model=get_model("opt-125m"), seq_len=512, global_batch=8, prompt_len=256, gen_len=256,
        critic_model=get_model("opt-125m"), reward_model=get_model("opt-125m"), framework=framework,
    )  # fmt: skip
    return workload, hardware


@pytest.mark.parametrize(("framework", "how"), [("deepspeed", "whole on every GPU"), ("deepspeed-chat", "zero.Init")])
def test_a_zero3_actor_and_critic_each_say_how_their_program_builds_them(framework: str, how: str) -> None:
    workload, hardware = _ppo(framework)
    z3, z1 = TrainedModelStrategy(zero_stage=3), TrainedModelStrategy(zero_stage=1)
    strategy = RLHFStrategy(actor=z3, critic=z3, hybrid_engine=False, empty_cache="never")
    notes = screen_rlhf(workload, strategy, hardware, C).notes
    built = [n for n in notes if "model build:" in n and n.startswith(("actor ", "critic "))]
    assert [n.split(" ", 1)[0] for n in built] == ["actor", "critic"]
    assert all(how in n and f"--framework {framework}" in n for n in built)
    only_actor = screen_rlhf(workload, replace(strategy, critic=z1), hardware, C).notes
    assert [n.split(" ", 1)[0] for n in only_actor if "model build:" in n and n.startswith(("actor ", "critic "))] == [
        "actor"
    ]


def test_a_given_frozen_block_is_predicted_as_the_framework_builds_it() -> None:
    """OpenRLHF 0.11.2 builds its frozen models at ZeRO-0 beside a ZeRO-2 actor (get_ds_eval_config): a
    ZeRO-3 reward model given with --framework openrlhf is predicted whole on every GPU, and says so."""
    workload, hardware = _ppo("openrlhf")
    z2 = TrainedModelStrategy(zero_stage=2)
    given = RLHFStrategy(
        actor=z2, critic=z2, reward=FrozenModelStrategy(3, "none"), hybrid_engine=False, empty_cache="never"
    )
    as_run = replace(given, reward=FrozenModelStrategy(0, "none"))
    predicted, expected = screen_rlhf(workload, given, hardware, C), screen_rlhf(workload, as_run, hardware, C)
    assert predicted.peak_reserved_bytes == expected.peak_reserved_bytes
    assert any(n.startswith("reward: --framework openrlhf builds it at ZeRO-0") for n in predicted.notes)
    own = screen_rlhf(replace(workload, framework="deepspeed"), given, hardware, C)
    assert own.peak_reserved_bytes < predicted.peak_reserved_bytes  # memplan's own loop shards it as given
    assert not any("builds it at ZeRO" in n for n in own.notes)

"""A probed program's own model build decides over ``--framework``'s rule (issue 42): ``Workload.model_build``
("zero-init" or "whole", as ``planner probe ... -- CMD``'s hook saw it) sets how a ZeRO-3 model's engine init,
host loading and note are predicted; frozen ZeRO-3 models say their build too (search.rlhf.build_notes)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from search import DEFAULT_COEFFICIENTS as C
from search import predict, screen_rlhf
from search.model.placement import trained_placement
from search.streams.init import engine_init
from store.gpus import get_gpu
from store.models import get_model
from store.records import (
    FrozenModelStrategy,
    Hardware,
    RLHFStrategy,
    Strategy,
    TrainedModelStrategy,
    Workload,
)

GiB = 2**30
MODEL = get_model("opt-125m")


def _hardware(gpus: int = 2) -> Hardware:
    spec = get_gpu("L4")
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=gpus, cpu_memory_bytes=256 * GiB)


@pytest.mark.parametrize(
    ("framework", "model_build", "partitioned"),
    [
        ("deepspeed", "framework", False),
        ("deepspeed", "zero-init", True),
        ("hf", "framework", True),
        ("hf", "whole", False),
    ],
)
def test_the_seen_build_decides_the_zero3_init_over_the_framework(
    framework: str, model_build: str, partitioned: bool
) -> None:
    layout = TrainedModelStrategy(zero_stage=3)
    placed = trained_placement(MODEL, True, layout, "bf16", 4, 1, C)
    init = engine_init(placed, "bf16", 100 * 2 * MODEL.total_params, framework, model_build)
    assert init.zero3 is not None and init.zero3.partitioned_at_build == partitioned


def test_a_program_seen_building_whole_is_predicted_so_and_says_it() -> None:
    """An HF program that builds its model whole before deepspeed.initialize (seen by the hook): every local rank
    loads the whole 16-bit model into host memory first, which --framework hf alone (zero.Init: each rank its
    partition) would not predict; one seen under zero.Init loads partitions where memplan's own loop would not."""
    big = get_model("qwen2.5-7b")
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=8, cpu_memory_bytes=2048 * GiB)
    hf = Workload(kind="sft", model=big, seq_len=128, global_batch=8, framework="hf")
    strategy = Strategy(zero_stage=3, micro_batch=1, grad_accum=1, gradient_checkpointing=True)
    every_rank_whole = hardware.gpus * 2 * big.total_params

    def loading(w: Workload) -> int:
        return predict(w, strategy, hardware, C).host_phases.get("loading", 0)

    seen_whole = predict(replace(hf, model_build="whole"), strategy, hardware, C)
    assert seen_whole.host_phases["loading"] >= every_rank_whole > 2 * loading(hf)
    assert any("as planner probe's hook saw" in n and "whole on every GPU" in n for n in seen_whole.notes)
    assert not any("hook saw" in n for n in predict(hf, strategy, hardware, C).notes)
    own = replace(hf, framework="deepspeed")
    seen_zero_init = predict(replace(own, model_build="zero-init"), strategy, hardware, C)
    assert loading(own) >= every_rank_whole > 2 * seen_zero_init.host_phases["loading"]
    assert any("your program builds it under deepspeed.zero.Init" in n for n in seen_zero_init.notes)


def _ppo(framework: str) -> Workload:
    return Workload(
        kind="ppo", model=MODEL, seq_len=512, global_batch=8, prompt_len=256, gen_len=256,
        critic_model=MODEL, reward_model=MODEL, framework=framework,
    )  # fmt: skip


def _frozen_notes(workload: Workload, strategy: RLHFStrategy) -> dict[str, str]:
    notes = screen_rlhf(workload, strategy, _hardware(), C).notes
    return {n.split(" ", 1)[0]: n for n in notes if n.split(" ", 1)[0] in ("reference", "reward")}


def test_frozen_zero3_models_say_how_their_program_builds_them() -> None:
    """DeepSpeed-Chat builds its ZeRO-3 reference and reward under zero.Init (create_hf_model's
    HfDeepSpeedConfig); memplan's own loop builds them whole on the GPU first, or on the host when offloaded;
    a ZeRO-0 frozen model says nothing (whole on every GPU by its block)."""
    z3 = TrainedModelStrategy(zero_stage=3)
    sharded, offloaded = FrozenModelStrategy(3, "none"), FrozenModelStrategy(3, "cpu")
    strategy = RLHFStrategy(
        actor=z3, critic=z3, reference=sharded, reward=sharded, hybrid_engine=False, empty_cache="never"
    )
    dschat = _frozen_notes(_ppo("deepspeed-chat"), strategy)
    assert set(dschat) == {"reference", "reward"}
    assert all(n.startswith(f"{role} model build: partitioned as it is made") for role, n in dschat.items())
    assert all("--framework deepspeed-chat builds it under deepspeed.zero.Init" in n for n in dschat.values())
    own = _frozen_notes(_ppo("deepspeed"), replace(strategy, reward=offloaded))
    assert "whole on every GPU" in own["reference"]
    assert "whole on the host" in own["reward"] and "never sits whole on a GPU" in own["reward"]
    whole = FrozenModelStrategy(0, "none")
    assert _frozen_notes(_ppo("deepspeed"), replace(strategy, reference=whole, reward=whole)) == {}
    seen = _frozen_notes(replace(_ppo("deepspeed"), model_build="zero-init"), strategy)
    assert all("as planner probe's hook saw" in n for n in seen.values())


def test_a_frozen_model_built_whole_is_loaded_whole_on_the_host() -> None:
    """Host loading follows the same build: memplan's own loop loads each rank's whole copy of a ZeRO-3 reference
    before deepspeed.initialize partitions it; under zero.Init (the probed program seen so) a rank loads its
    partition. The 7B reference is the largest model of the step, so it sets the loading figure."""
    big = get_model("qwen2.5-7b")
    workload = replace(_ppo("deepspeed"), ref_model=big, critic_model=MODEL, reward_model=MODEL)
    z1 = TrainedModelStrategy(zero_stage=1)
    strategy = RLHFStrategy(
        actor=z1, critic=z1, reference=FrozenModelStrategy(3, "none"), reward=FrozenModelStrategy(0, "none"),
        hybrid_engine=False, empty_cache="never", generation_batch=2, micro_batch=2,
    )  # fmt: skip
    hardware = _hardware(gpus=4)

    def loading(w: Workload) -> int:
        return screen_rlhf(w, strategy, hardware, C).host_breakdown.get("model_loading", 0)

    whole, partitioned = loading(workload), loading(replace(workload, model_build="zero-init"))
    assert whole >= hardware.gpus * 2 * big.total_params > partitioned

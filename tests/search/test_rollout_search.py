"""The RLHF search weighing vLLM and SGLang rollout engines beside DeepSpeed's own generation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from search import DEFAULT_COEFFICIENTS, Candidate, exhaustive_rlhf, screen_rlhf, search_rlhf
from search.choose.engine_inner import best_inner_engine, step_bounds
from search.choose.rlhf_space import batch_choices, cache_choices, rlhf_outer_points, rlhf_strategy_at
from search.choose.rollout_space import knob_variants, rollout_options, searched_generations
from search.rlhf.engine_step import engine_step, trainer_hardware
from search.rlhf.job import rlhf_context
from store.errors import InputError
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Workload

C = DEFAULT_COEFFICIENTS
GiB = 2**30
ENGINES = ("vllm", "sglang")


def _job(gpus: int = 2, gpu: str = "L4", batch: int = 8) -> tuple[Workload, Hardware]:
    spec = get_gpu(gpu)
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=gpus, cpu_memory_bytes=256 * GiB)
    workload = Workload(
        kind="grpo",
        model=get_model("opt-125m"),
        seq_len=512,
        global_batch=batch,
        prompt_len=256,
        gen_len=256,
        samples_per_prompt=4,
    )
    return workload, hardware


def _engine_points(workload: Workload, hardware: Hardware) -> list:  # type: ignore[type-arg]
    generations = searched_generations(workload, hardware, ENGINES)
    return list(rlhf_outer_points(workload, hardware, (0,), generations))


def test_the_options_are_each_engine_colocated_at_each_tp_size_and_on_its_own_gpus() -> None:
    workload, hardware = _job(gpus=4, batch=12)
    options = rollout_options(workload, hardware)
    colocated = {(r.engine, r.tensor_parallel) for r in options if r.colocated}
    assert colocated == {(e, tp) for e in ENGINES for tp in (1, 2, 4)}
    separate = [r for r in options if not r.colocated]
    assert {(r.engine, r.engine_gpus) for r in separate} == {(e, 1) for e in ENGINES}  # a quarter of 4 GPUs
    # each colocated placement is resolved over sleep levels 0 and 2, enforce_eager, and (level 2) offload_training
    variants = knob_variants(options[0])
    assert len(variants) == 6
    assert not any(v.sleep_level == 0 and v.offload_training for v in variants)
    with pytest.raises(InputError):
        searched_generations(workload, hardware, ("tgi",))


def test_the_inner_resolution_equals_trying_every_variant_split_and_cache_choice() -> None:
    workload, hardware = _job()
    points = _engine_points(workload, hardware)
    for point in points[:: max(1, len(points) // 4)]:
        trainer = trainer_hardware(hardware, point.rollout)
        brute = min(
            (
                Candidate(s, screen_rlhf(workload, s, hardware, C))
                for variant in knob_variants(point.rollout)
                for batches in batch_choices(workload, trainer)
                for cache in cache_choices(variant)
                for s in [rlhf_strategy_at(replace(point, rollout=variant), batches, cache)]
            ),
            key=lambda c: c.score,
        )
        found = best_inner_engine(point, workload, hardware, C)
        assert found.score == brute.score
        assert found.strategy.rollout is not None and found.strategy.rollout.gpu_memory_utilization is not None
        # the candidate's strategy, utilization filled in, predicts what it was ranked by
        assert screen_rlhf(workload, found.strategy, hardware, C).step_time_s == found.prediction.step_time_s


def test_the_pair_bounds_never_exceed_the_step() -> None:
    workload, hardware = _job()
    for point in _engine_points(workload, hardware)[:6]:
        ctx = rlhf_context(workload, trainer_hardware(hardware, point.rollout), C)
        for variant in knob_variants(point.rollout):
            for batches in batch_choices(workload, ctx.hardware):
                strategy = rlhf_strategy_at(replace(point, rollout=variant), batches)
                seconds, reserved, host = step_bounds(ctx, strategy)
                step = engine_step(workload, strategy, hardware, C)
                assert seconds <= step.base_time_s
                assert host <= step.host_bytes
                least = min(
                    screen_rlhf(workload, strategy.with_(empty_cache=p, allocator=a), hardware, C).peak_reserved_bytes
                    for p, a in cache_choices()
                )
                assert reserved <= least


def test_the_bound_walk_finds_the_exhaustive_optimum_with_engines() -> None:
    workload, hardware = _job()
    expected = exhaustive_rlhf(workload, hardware, C, rollouts=("hybrid-engine", *ENGINES))
    found = search_rlhf(workload, hardware, C, rollouts=("hybrid-engine", *ENGINES)).best
    assert expected is not None and found is not None
    assert found.prediction.step_time_s == expected.prediction.step_time_s
    assert found.strategy == expected.strategy


def test_a_big_grpo_job_on_eight_h100s_picks_a_colocated_engine_and_says_its_utilization() -> None:
    """The issue's case: Qwen2.5-7B GRPO on 8 x H100-80G. DeepSpeed's own generation decodes token by token
    from eager PyTorch; a colocated engine decodes with CUDA graphs over a paged KV cache."""
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=8, cpu_memory_bytes=1024 * GiB)
    workload = Workload(
        kind="grpo", model=get_model("qwen2.5-7b"), seq_len=512, global_batch=64, prompt_len=256, gen_len=256,
        samples_per_prompt=4,
    )  # fmt: skip
    result = search_rlhf(workload, hardware, C)
    best = result.best
    assert best is not None and best.strategy.rollout is not None and best.strategy.rollout.colocated
    engine = best.prediction.rollout
    low, high = engine["fitting_utilization"]
    assert low <= engine["gpu_memory_utilization"] <= high
    assert best.strategy.rollout.gpu_memory_utilization == engine["gpu_memory_utilization"]
    deepspeed = search_rlhf(workload, hardware, C, rollouts=("hybrid-engine",)).best
    assert deepspeed is not None and best.prediction.step_time_s < deepspeed.prediction.step_time_s

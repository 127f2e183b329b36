"""Issue 31, 4: beside a sleeping colocated vLLM engine the search keeps the default allocator.

vLLM's sleep mode allocates through its ``CuMemAllocator``, whose constructor asserts that
``PYTORCH_CUDA_ALLOC_CONF`` holds no ``expandable_segments:True``; colocated, the engine shares the trainer's
environment (TRL's colocate mode and veRL's hybrid worker run it in the trainer's process, OpenRLHF in the same
Ray job), so such a plan cannot run with expandable segments at all.
"""

from __future__ import annotations

from dataclasses import replace

from search import DEFAULT_COEFFICIENTS
from search.choose.engine_inner import best_inner_engine
from search.choose.optimize import rlhf_variants
from search.choose.rlhf_space import cache_choices, rlhf_outer_points
from search.choose.rollout_space import searched_generations
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Workload
from store.rollout import RolloutStrategy, refuses_expandable_segments

SLEEPING = RolloutStrategy(engine="vllm", sleep_level=1)


def _allocators(rollout: RolloutStrategy | None) -> set[str]:
    return {allocator for _, allocator in cache_choices(rollout)}


def test_which_rollouts_refuse_expandable_segments() -> None:
    assert refuses_expandable_segments(SLEEPING) and refuses_expandable_segments(replace(SLEEPING, sleep_level=2))
    assert not refuses_expandable_segments(None)
    assert not refuses_expandable_segments(replace(SLEEPING, sleep_level=0, offload_training=False))
    assert not refuses_expandable_segments(replace(SLEEPING, engine="sglang"))
    separate = RolloutStrategy(placement="separate", engine_gpus=1, sleep_level=0, offload_training=False)
    assert not refuses_expandable_segments(separate)


def test_cache_choices_drop_expandable_segments_beside_a_sleeping_vllm() -> None:
    assert _allocators(SLEEPING) == {"default"}
    assert _allocators(None) == _allocators(replace(SLEEPING, engine="sglang")) == {"default", "expandable-segments"}
    policies = [policy for policy, _ in cache_choices(SLEEPING)]
    assert sorted(set(policies)) == sorted({policy for policy, _ in cache_choices()}) and len(policies) == 5


def test_the_search_never_chooses_expandable_segments_for_a_sleeping_vllm_point() -> None:
    gpu = get_gpu("L4")
    # a tight 4 GiB: every colocated point sleeps its engine, where expandable segments would screen best
    hardware = Hardware(gpu=gpu, gpu_memory_bytes=4 * 2**30, gpus=1, cpu_memory_bytes=256 * 2**30)
    workload = Workload(
        kind="grpo",
        model=get_model("opt-125m"),
        seq_len=512,
        global_batch=4,
        prompt_len=256,
        gen_len=256,
        samples_per_prompt=4,
    )
    generations = searched_generations(workload, hardware, ("vllm",))
    points = [p for p in rlhf_outer_points(workload, hardware, (0,), generations) if p.rollout and p.rollout.colocated]
    sleeping = [p for p in points if refuses_expandable_segments(p.rollout)]
    assert sleeping
    chosen_sleeping = 0
    for point in sleeping[:3]:
        found = best_inner_engine(point, workload, hardware, DEFAULT_COEFFICIENTS).strategy
        if refuses_expandable_segments(found.rollout):  # the knob variants may wake the engine (sleep level 0)
            chosen_sleeping += 1
            assert found.allocator == "default"
            # the confirmation's variants: those beside a sleeping engine keep the default allocator (the point's
            # other knobs, an engine awake throughout, may take expandable segments: issue 42)
            variants = rlhf_variants(workload, hardware, found)
            assert {s.allocator for s in variants if refuses_expandable_segments(s.rollout)} == {"default"}
    assert chosen_sleeping

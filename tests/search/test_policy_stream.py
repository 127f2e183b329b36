"""One build of a step's stream for all its ``empty_cache`` policies (search.step.replayed.marked_stream): each
policy's stream derived from it is the one step_stream builds under that policy, event for event (issue 42:
a step's variants built the same stream once per policy, 107 builds for 68 steps in the demo's recommend)."""

from __future__ import annotations

from small_jobs import grpo_opt125m

from search import DEFAULT_COEFFICIENTS as C
from search import search_rlhf
from search.rlhf.predict import rlhf_step
from search.single.predict import single_step
from search.step.assemble import Step
from search.step.replayed import STEPS, marked_stream, policy_stream, stream_of
from search.streams.build import step_stream
from store.alloc_stream import EMPTY_CACHE
from store.gpus import get_gpu
from store.models import get_model
from store.phases import EMPTY_CACHE_AFTER
from store.records import Hardware, RLHFStrategy, Strategy, Workload


def _steps() -> list[Step]:
    """An SFT step under ZeRO-0 and under ZeRO-3 with offload and checkpointing, and a GRPO step with a colocated
    rollout engine (its trainer's cache is emptied before the engine wakes whatever the policy)."""
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=2, cpu_memory_bytes=512 * 2**30)
    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=256, global_batch=8)
    singles = [
        Strategy(
            zero_stage=stage,
            micro_batch=2,
            grad_accum=2,
            offload_optimizer="cpu" if stage > 1 else "none",
            gradient_checkpointing=stage == 3,
        )
        for stage in (0, 3)
    ]
    steps = [single_step(workload, strategy, hardware, C) for strategy in singles]
    grpo, l4s = grpo_opt125m()
    engine = search_rlhf(grpo, l4s, C).ranked[0].strategy  # the search's first: a rollout engine's point
    assert isinstance(engine, RLHFStrategy) and engine.rollout is not None
    return [*steps, rlhf_step(grpo, engine, l4s, C)]


def test_each_policys_stream_is_the_one_built_under_it() -> None:
    for step in _steps():
        marked = marked_stream(step)
        policies = {}
        for policy in EMPTY_CACHE_AFTER:
            built = step_stream(
                step.resident, dict(step.resident_sizes), step.engines, step.phases, step.repeats, policy, STEPS
            )
            assert policy_stream(marked, step, policy) == built, policy
            assert stream_of(step, policy) == built, policy
            policies[policy] = sum(1 for event in built.events if event[0] == EMPTY_CACHE)
        assert policies["after-phase"] > policies["never"]  # the policies' calls differ, and each is kept
        assert policies["every-step"] == policies["never"] + STEPS

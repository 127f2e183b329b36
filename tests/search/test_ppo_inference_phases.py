"""What a DeepSpeed PPO step holds on the GPU around its inference phases, as DeepSpeed 0.19.8 and transformers 5
allocate it (issue 46: the opt-1.3b PPO probes' generation, scoring and critic training were 3.5-5.6% under in
peak reserved; tests/planner/test_gpu_records.py holds them within 3% now).

- Each ZeRO-1/2 engine reduces on a CUDA stream of its own (stage_1_and_2.py l. 599), so the critic's gradient
  partition cannot take the blocks the actor's left cached in its stream's pool.
- DeepSpeedZeroOptimizer.__init__ empties the cache before it flattens each parameter group (l. 449).
- The hybrid engine makes no inference containers for OPT (transformers 5's Cache-based decoder) nor for models
  without a policy: generate is transformers' own, its KV cache in torch's allocator, no workspace outside it.
"""

from __future__ import annotations

import pytest

from search.coefficients import Coefficients
from search.rlhf.memory import hybrid_engine_injects
from search.rlhf.predict import rlhf_step
from search.step.assemble import Step
from search.step.replayed import stream_of
from search.streams.build import STEP_MARK
from search.streams.phases import LIVE_PARTS
from store.alloc_stream import ALLOC, EMPTY_CACHE, PHASE
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, RLHFStrategy, TrainedModelStrategy, Workload

COEF = Coefficients()
WORKSPACE = LIVE_PARTS.index("hybrid_engine")
KV = LIVE_PARTS.index("kv_cache")


def _step(model: str, zero_stage: int = 2, hybrid_engine: bool = True) -> Step:
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)
    workload = Workload(
        kind="ppo", model=get_model(model), seq_len=192, global_batch=2, prompt_len=64, gen_len=128, dtype="bf16"
    )
    layout = TrainedModelStrategy(zero_stage=zero_stage)
    strategy = RLHFStrategy(
        actor=layout, critic=layout, hybrid_engine=hybrid_engine, generation_batch=2, micro_batch=2, grad_accum=1
    )
    return rlhf_step(workload, strategy, hardware, COEF)


def _side_streams(step: Step, phase: str) -> set[int]:
    (found,) = [p for p in step.phases if p.name == phase]
    return {t.stream for named in found.moment_named for t in named if t.stream}


def test_actor_and_critic_reduce_on_streams_of_their_own() -> None:
    """ZeRO-2 with overlap_comm: both engines' gradient partitions are made on a side stream, not the same one."""
    step = _step("opt-125m")
    actor, critic = _side_streams(step, "actor_training"), _side_streams(step, "critic_training")
    assert actor and critic
    assert not actor & critic


def _setup_events(step: Step) -> list[tuple[int, int, int, int, int]]:
    stream = stream_of(step, "never")
    first = next(i for i, e in enumerate(stream) if e[0] == PHASE and stream.phases[e[1]].startswith(STEP_MARK))
    return list(stream.events[:first])


@pytest.mark.parametrize(("zero_stage", "calls"), [(0, 0), (1, 2), (2, 2)])
def test_zero12_engine_init_empties_the_cache_before_its_flat_buffer(zero_stage: int, calls: int) -> None:
    """One empty_cache per ZeRO-1/2 engine at init (none for ZeRO-0's FP16_Optimizer), each after that engine's
    weights are loaded tensor by tensor and before its flat 16-bit buffer, a request larger than any of them."""
    events = _setup_events(_step("opt-125m", zero_stage))
    at = [i for i, e in enumerate(events) if e[0] == EMPTY_CACHE]
    assert len(at) == calls
    for i in at:
        start = max(j for j in range(i) if events[j][0] != ALLOC) + 1 if any(e[0] != ALLOC for e in events[:i]) else 0
        loaded = [e[2] for e in events[start:i]]  # the requests right before: the weights as loaded
        assert len(loaded) > 1
        assert next(e for e in events[i + 1 :] if e[0] == ALLOC)[2] > max(loaded)


def test_hybrid_engine_generates_through_transformers_for_opt() -> None:
    """OPT: the same generation moments as without the hybrid engine (no workspace, the KV cache in torch)."""
    assert not hybrid_engine_injects(get_model("opt-125m"))
    (with_engine,) = [p for p in _step("opt-125m").phases if p.name == "generation"]
    (without,) = [p for p in _step("opt-125m", hybrid_engine=False).phases if p.name == "generation"]
    assert with_engine.moments == without.moments
    assert all(m.parts[WORKSPACE] == 0 and m.transient >= m.parts[KV] > 0 for m in with_engine.moments)
    assert any("no inference container for opt layers" in note for note in _step("opt-125m").notes)


def test_hybrid_engine_keeps_its_workspace_and_cache_for_a_model_it_injects() -> None:
    """Llama (LLAMALayerPolicy): the containers' workspace and KV cache are outside torch's allocator."""
    assert hybrid_engine_injects(get_model("smollm2-135m"))
    assert not hybrid_engine_injects(get_model("qwen2.5-0.5b"))  # no DeepSpeed policy for Qwen2's layer
    step = _step("smollm2-135m")
    assert any("outside torch's allocator" in note for note in step.notes)
    (generation,) = [p for p in step.phases if p.name == "generation"]
    for m in generation.moments:
        assert m.parts[WORKSPACE] > 0
        assert m.transient < m.total - m.parts[WORKSPACE]  # the KV cache is not among torch's bytes

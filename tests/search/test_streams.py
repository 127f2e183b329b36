"""The allocation stream a step's cost terms build (search.streams): its bytes are the cost model's bytes."""

from __future__ import annotations

import pytest

from search.coefficients import Coefficients
from search.model.activations import layer_activation_bytes, layer_saved_tensors
from search.rlhf.predict import rlhf_step
from search.single.predict import single_step
from search.step.assemble import Step
from search.step.replayed import stream_of
from search.streams.build import STEP_MARK
from search.streams.sizes import weight_tensors
from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, KIND_INDEX, PHASE, AllocStream
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, RLHFStrategy, Strategy, TrainedModelStrategy, Workload

COEF = Coefficients()


def _stream(step: Step, policy: str = "never") -> AllocStream:
    return stream_of(step, policy)


def _phase_peaks(stream: AllocStream) -> dict[str, int]:
    """Live requested bytes at their most, per phase name (over every run of it)."""
    live: dict[int, int] = {}
    current, name, peaks = 0, "", {}
    for op, key, size, _, _ in stream:
        if op == PHASE:
            name = stream.phases[key]
            peaks[name] = max(peaks.get(name, 0), current)
        elif op == ALLOC:
            live[key] = size
            current += size
            peaks[name] = max(peaks[name], current)
        elif op == FREE:
            current -= live.pop(key)
    return peaks


def _hardware() -> Hardware:
    spec = get_gpu("H100-80G")
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)


def _rlhf(model: str, critic: str, prompt: int, gen: int) -> Workload:
    return Workload(
        kind="ppo",
        model=get_model(model),
        seq_len=prompt + gen,
        global_batch=8,
        prompt_len=prompt,
        gen_len=gen,
        critic_model=get_model(critic),
    )


def _rlhf_strategy(batch: int, zero_stage: int = 2) -> RLHFStrategy:
    layout = TrainedModelStrategy(zero_stage=zero_stage)
    return RLHFStrategy(
        actor=layout,
        critic=layout,
        hybrid_engine=False,
        generation_batch=batch,
        micro_batch=batch,
        grad_accum=8 // batch,
    )


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_single_model_stream_peaks_at_the_predicted_allocated_bytes(
    zero_stage: int, checkpointing: bool, grad_accum: int
) -> None:
    """The stream makes every moment of the cost model happen: its live peak is the predicted peak allocated,
    and each phase's peak is that phase's resident plus live bytes."""
    workload = Workload(kind="sft", model=get_model("opt-1.3b"), seq_len=512, global_batch=4 * grad_accum)
    strategy = Strategy(
        zero_stage=zero_stage, micro_batch=4, grad_accum=grad_accum, gradient_checkpointing=checkpointing
    )
    step = single_step(workload, strategy, _hardware(), COEF)
    stream = _stream(step)
    assert stream.live_peak() == step.peak_allocated_bytes
    peaks = _phase_peaks(stream)
    for phase in step.phases:
        assert peaks[phase.name] == step.resident_bytes + phase.live, phase.name


def test_rlhf_stream_peaks_at_the_predicted_allocated_bytes() -> None:
    """Generation, scoring and both trainings: the stream's live peak per phase is the cost model's, less the
    bytes the hybrid engine keeps outside torch's allocator."""
    workload = _rlhf("opt-1.3b", "opt-350m", 256, 256)
    strategy = _rlhf_strategy(4)
    step = rlhf_step(workload, strategy, _hardware(), COEF)
    stream = _stream(step)
    peaks = _phase_peaks(stream)
    for phase in step.phases:
        if phase.name != "generation":
            assert peaks[phase.name] == step.resident_bytes + phase.live, phase.name
    # growing the cache, torch.cat holds one layer's old K (or V) beside the new one: one tensor more
    kv_tensor = max(size for op, _, size, _, kind in stream if op == ALLOC and kind == KIND_INDEX["kv_cache"])
    generation = step.resident_bytes + step.phases[0].live
    assert generation <= peaks["generation"] <= generation + kv_tensor


def test_kv_cache_grows_token_by_token_through_the_allocator() -> None:
    """HF's dynamic cache: each growth requests every layer's longer K and V, then frees the shorter ones."""
    workload = _rlhf("opt-125m", "opt-125m", 64, 128)
    strategy = _rlhf_strategy(2)
    step = rlhf_step(workload, strategy, _hardware(), COEF)
    stream = _stream(step)
    kv = [size for op, _, size, _, kind in stream if op == ALLOC and kind == KIND_INDEX["kv_cache"]]
    layers = get_model("opt-125m").num_layers
    assert len(kv) > 2 * layers * 8  # many growth steps, each every layer's K and V
    assert max(kv) > min(kv)


def _step_events(stream: AllocStream) -> list[tuple[int, int, int, int, int]]:
    """The events after the engines' setup (from the first step's marker on)."""
    first = next(i for i, e in enumerate(stream) if e[0] == PHASE and stream.phases[e[1]].startswith(STEP_MARK))
    return list(stream.events[first:])


def test_empty_cache_events_follow_the_policy_table() -> None:
    """after-phase: one call after each phase run; never: none; the measured step is marked. (The engine's
    own call at init, ZeRO-1/2's before its flat buffer, is DeepSpeed's, whatever the policy.)"""
    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=128, global_batch=4)
    step = single_step(workload, Strategy(zero_stage=2, micro_batch=2, grad_accum=2), _hardware(), COEF)
    never, each = _stream(step, "never"), _stream(step, "after-phase")
    assert sum(1 for e in _step_events(never) if e[0] == EMPTY_CACHE) == 0
    runs = sum(1 for e in each if e[0] == PHASE and not each.phases[e[1]].startswith(STEP_MARK)) - 1  # not setup
    assert sum(1 for e in _step_events(each) if e[0] == EMPTY_CACHE) == runs
    assert f"{STEP_MARK}2" in each.phases


def test_layer_saved_tensors_sum_to_the_layer_bytes() -> None:
    """One truth: the tensor list is what the layer's activation bytes add up."""
    for name in ("opt-1.3b", "llama-3-8b", "gpt2"):
        model = get_model(name)
        for attn in ("eager", "sdpa"):
            tensors = layer_saved_tensors(model, 2, 256, "bf16", attn, COEF)
            assert sum(tensors) == layer_activation_bytes(model, 2, 256, "bf16", attn, COEF)
            assert all(t > 0 for t in tensors)


def test_weight_tensors_cover_the_linear_weights() -> None:
    """Load order: the embedding first; every block's linears are there (LoRA adds A and B per linear)."""
    model = get_model("llama-3-8b")
    weights = weight_tensors(model, "bf16")
    assert weights[0] == 2 * model.vocab_size * model.hidden_size
    assert sum(weights) <= 2 * model.total_params
    assert sum(weights) > 0.99 * 2 * model.total_params
    assert len(weight_tensors(model, "bf16", 8)) == len(weights) + 2 * 7 * model.num_layers


def test_a_checkpointed_forward_requests_one_checkpoint_per_layer() -> None:
    """Non-reentrant checkpointing saves each layer's input hidden states (sequences x seq_len x hidden in the
    compute dtype): the forward's activation requests are that size, layer after layer; without checkpointing
    they are a layer's own saved tensors."""
    model = get_model("opt-1.3b")
    workload = Workload(kind="sft", model=model, seq_len=512, global_batch=4)
    hidden_states = 2 * 4 * 512 * model.hidden_size  # bf16
    requested = {}
    for checkpointing in (True, False):
        strategy = Strategy(zero_stage=2, micro_batch=4, gradient_checkpointing=checkpointing)
        stream = _stream(single_step(workload, strategy, _hardware(), COEF))
        name, made = "", {}
        for op, key, size, _, kind in stream:
            if op == PHASE:
                name = stream.phases[key]
            elif op == ALLOC and kind == KIND_INDEX["activations"] and name == "forward":
                made[key] = size
            elif op == FREE and name == "forward":  # the layer's temporaries (test_layer_forward_stream.py)
                made.pop(key, None)
        requested[checkpointing] = list(made.values())
    assert requested[True][: model.num_layers] == [hidden_states] * model.num_layers
    layer = layer_saved_tensors(model, 4, 512, "bf16", "sdpa", COEF)
    assert tuple(requested[False][: len(layer)]) == layer

"""The gradient and loss tensors of a step's allocation stream, as DeepSpeed's and transformers' code makes
them (search.model.deepspeed_tensors' named tensors, search.streams.build).

ZeRO-3 (``stage3.py``) likewise for its step and its offloaded norms.
ZeRO-2 (``stage_1_and_2.py``): ``grads_in_partition`` is one tensor made when the first full reduce bucket is
flushed (``reduce_independent_p_g_buckets_and_remove_grads`` -> ``copy_grads_in_partition``), on the reduction
stream under ``overlap_comm``, kept to ``step()``; ``step()`` upcasts each gradient to fp64 for its norm, then
flattens the partition (a 16-bit copy), upcasts that to fp32 and frees both 16-bit tensors before Adam.
No ZeRO (``fused_optimizer.py`` FP16_Optimizer, bf16 too): the 16-bit ``param.grad`` stay from the backward to
``step()``, which upcasts each to fp32 and flattens those into one fp32 gradient.
transformers' ``ForCausalLMLoss``: ``logits.float()`` then ``F.cross_entropy`` (log-softmax, NLL); the upcast (and
logits an SFT loop drops) are freed in the forward; the backward makes the NLL's and the log-softmax's fp32
gradients beside the saved log-softmax.
"""

from __future__ import annotations

import pytest

from search.coefficients import Coefficients
from search.model.deepspeed_tensors import first_flush_layers, offload_norm_upcasts, zero3_offload_upcasts
from search.model.moment_parts import REDUCTION_STREAM, Named
from search.model.zero3_step import zero3_sub_groups
from search.single.predict import single_step
from search.step.replayed import stream_of
from search.streams.phases import StepPhase, live
from search.streams.sizes import weight_tensors
from store.alloc_stream import ALLOC, FREE, KIND_INDEX, PHASE, AllocStream
from store.ds_buckets import ZeroBuckets
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

COEF = Coefficients()
OPT = get_model("opt-1.3b")


def _hardware() -> Hardware:
    spec = get_gpu("H100-80G")
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)


def _stream(zero_stage: int, overlap: bool = True, grad_accum: int = 1) -> AllocStream:
    """The step's stream: ``opt-1.3b``, 4 x 512 tokens, bf16, with DeepSpeed's default 5e8-element buckets."""
    buckets = ZeroBuckets(overlap_comm=overlap) if zero_stage else None
    strategy = Strategy(zero_stage=zero_stage, micro_batch=4, grad_accum=grad_accum, ds_buckets=buckets)
    workload = Workload(kind="sft", model=OPT, seq_len=512, global_batch=4 * grad_accum)
    return stream_of(single_step(workload, strategy, _hardware(), COEF), "never")


def _events(zero_stage: int, overlap: bool = True, grad_accum: int = 1) -> list[tuple[str, int, int, int, int]]:
    """(phase, op, key, size, stream) of the second step's events of :func:`_stream`."""
    stream = _stream(zero_stage, overlap, grad_accum)
    out, phase, step = [], "", 0
    for op, key, size, on_stream, _ in stream:
        if op == PHASE:
            phase = stream.phases[key]
            step += phase.startswith("step:")
        elif step == 2:
            out.append((phase, op, key, size, on_stream))
    return out


def _requests(events: list, phase: str) -> list[int]:
    return [size for name, op, _, size, _ in events if name == phase and op == ALLOC]


def test_first_flush_follows_the_bucket() -> None:
    """The bucket fills after whole layers: (bucket - the final norm's gradient) // one layer's parameters
    (opt-1.3b ties its head, so the final norm is the only gradient before the top layer's)."""
    layer = 12 * 2048**2 + 13 * 2048  # opt-1.3b: q, k, v, out, fc1, fc2 with biases, two LayerNorms
    assert OPT.layer_params == layer
    assert first_flush_layers(OPT, True, 0, 500_000_000) == (500_000_000 - 2048) // layer == 9
    assert first_flush_layers(OPT, True, 0, 200_000_000) == 3
    assert first_flush_layers(OPT, True, 0, 2 * OPT.total_params) is None  # one bucket holds every gradient
    assert first_flush_layers(OPT, True, 8, 500_000_000) is None  # LoRA's few gradients: at the backward's end


@pytest.mark.parametrize("overlap", [False, True])
def test_zero2_partition_is_one_tensor_from_the_first_flush_to_the_step(overlap: bool) -> None:
    """Made once in the backward, after the top 9 layers' activations were released and before the rest
    were (DeepSpeed's default 5e8-element bucket), freed only in the optimizer step."""
    events = _events(2, overlap)
    partition = 2 * OPT.total_params  # bf16, one rank
    made = [(phase, key, on) for phase, op, key, size, on in events if op == ALLOC and size == partition]
    assert [phase for phase, _, _ in made] == ["backward", "optimizer_step"]  # the step's is the flat copy
    _, key, on_stream = made[0]
    assert on_stream == (REDUCTION_STREAM if overlap else 0)
    activations = {k for op, k, _, _, kind in _stream(2, overlap) if op == ALLOC and kind == KIND_INDEX["activations"]}
    order = [(phase, op, k) for phase, op, k, _, _ in events]
    at = order.index(("backward", ALLOC, key))
    freed = [op == FREE and k in activations and phase == "backward" for phase, op, k in order]
    assert any(freed[:at]) and any(freed[at + 1 :])  # the top layers' activations before, the rest after
    frees = [phase for phase, op, k in order if op == FREE and k == key]
    assert frees == ["optimizer_step"]


def test_zero2_step_requests_norm_flat_and_fp32_copies_in_order() -> None:
    """fp64 of the largest gradient (the tied embedding), the 16-bit flat partition, its fp32 upcast; the two
    16-bit tensors are freed before the fp32 one."""
    events = _events(2)
    n = OPT.total_params
    embedding = OPT.vocab_size * OPT.hidden_size
    step = _requests(events, "optimizer_step")
    assert step == [8 * embedding, 2 * n, 4 * n]
    sizes = {key: size for _, op, key, size, _ in events if op == ALLOC}
    frees = [sizes.get(key) for phase, op, key, _, _ in events if phase == "optimizer_step" and op == FREE]
    assert frees[-1] == 4 * n and sorted(frees[-3:-1]) == [2 * n, 2 * n]


def test_zero0_step_upcasts_each_gradient_then_flattens() -> None:
    """The 16-bit grads are not requested again in the step; the upcasts are the weights in fp32, in
    parameter order (the pattern lists weights and norms; OPT's biases come as what is left), then one flat
    fp32 gradient."""
    events = _events(0)
    upcasts = [2 * size for size in weight_tensors(OPT, "bf16")]
    step = _requests(events, "optimizer_step")
    n = 4 * OPT.total_params
    assert step[: len(upcasts)] == upcasts
    assert step[-1] == n and sum(step[:-1]) == n and len(step) <= len(upcasts) + 2


def test_named_tensors_cannot_hold_more_than_their_part() -> None:
    moment = live(gradients=100, transient=100)
    with pytest.raises(ValueError, match="named gradients"):
        StepPhase("optimizer_step", "optimizer", (moment,), 1.0, 1.0, 0.0, 1,
                  moment_named=((Named("gradients", "x", 101),),))  # fmt: skip
    with pytest.raises(ValueError, match="named tensors for 2 of 1"):
        StepPhase("optimizer_step", "optimizer", (moment,), 1.0, 1.0, 0.0, 1, moment_named=((), ()))


def test_one_stream_replay_is_the_same_events_on_the_default_stream() -> None:
    """A device without side streams (DeepSpeed's CPU accelerator) replays every request on stream 0."""
    strategy = Strategy(zero_stage=2, micro_batch=4, ds_buckets=ZeroBuckets(overlap_comm=True))
    workload = Workload(kind="sft", model=OPT, seq_len=512, global_batch=4)
    stream = stream_of(single_step(workload, strategy, _hardware(), COEF), "never")
    assert any(on for _, _, _, on, _ in stream)
    merged = stream.on_one_stream()
    assert [e[:3] + e[4:] for e in merged] == [e[:3] + e[4:] for e in stream]
    assert not any(on for _, _, _, on, _ in merged)


def test_loss_frees_the_upcast_in_the_forward_and_the_log_softmax_once_its_gradient_exists() -> None:
    """SFT (the loop drops the output): the forward makes the 16-bit logits, their fp32 upcast and the fp32
    log-softmax and frees the upcast and the logits once the loss returns; the backward makes the NLL's and the
    log-softmax's fp32 gradients beside the saved log-softmax, then frees those (tests/search/test_loss_stream.py
    follows each tensor, the 16-bit gradient of the logits too)."""
    events = _events(2)
    e = 4 * 512 * OPT.vocab_size
    sizes = {key: size for _, op, key, size, _ in events if op == ALLOC}
    loss = (2 * e, 4 * e)  # 2e: the 16-bit logits (the tied weight's gradients too, in the backward)
    forward = [(op, sizes[key]) for phase, op, key, _, _ in events if phase == "forward" and sizes.get(key) in loss]
    assert forward == [(ALLOC, 2 * e), (ALLOC, 4 * e), (ALLOC, 4 * e), (FREE, 2 * e), (FREE, 4 * e)]
    backward = [(op, sizes[key]) for phase, op, key, _, _ in events if phase == "backward" and sizes[key] == 4 * e]
    assert backward == [(ALLOC, 4 * e), (ALLOC, 4 * e), (FREE, 4 * e), (FREE, 4 * e), (FREE, 4 * e)]


def test_offload_norm_upcasts_need_a_block_each_time_one_is_larger() -> None:
    """ZeRO-2 with CPU offload: each gradient's fp64 upcast, in the backward's order; opt-1.3b's layers first
    (fc1/fc2: 2048 x 8192), then the tied embedding; an untied head comes first and is the largest."""
    t = OPT.total_params
    assert offload_norm_upcasts(OPT, True, 0, t, 1) == (8 * 2048 * 8192, 8 * OPT.vocab_size * 2048)
    llama = get_model("llama-3-8b")  # untied head, 128256 x 4096, reduced before everything else
    assert offload_norm_upcasts(llama, True, 0, llama.total_params, 1) == (8 * llama.lm_head_params,)
    assert offload_norm_upcasts(OPT, True, 0, t, 16) == (8 * 2048 * 8192, 8 * -(-t // 16))  # a rank piece


@pytest.mark.parametrize("overlap", [False, True])
def test_offload_norm_upcasts_run_on_the_reduction_stream_under_overlap(overlap: bool) -> None:
    strategy = Strategy(
        zero_stage=2, offload_optimizer="cpu", micro_batch=4, ds_buckets=ZeroBuckets(overlap_comm=overlap)
    )
    workload = Workload(kind="sft", model=OPT, seq_len=512, global_batch=4)
    stream = stream_of(single_step(workload, strategy, _hardware(), COEF), "never")
    upcasts = set(offload_norm_upcasts(OPT, True, 0, OPT.total_params, 1))
    streams = {on for op, _, size, on, _ in stream if op == ALLOC and size in upcasts}
    assert streams == {REDUCTION_STREAM if overlap else 0}


def test_zero3_step_requests_norm_flat_and_fp32_copies_in_order() -> None:
    """stage3.py step(): ``get_grad_norm_direct`` upcasts each gradient partition to fp64 (the tied embedding
    is the largest), then per sub-group ``_prepare_fp32_grad_for_sub_group`` flattens its 16-bit gradients and
    upcasts the flat copy to fp32; the flat copy is freed before the fp32 gradient, which Adam steps on and
    ``_release_sub_group`` drops before the next sub-group. DeepSpeed's default sub_group_size (1e9
    elements) cuts opt-1.3b's partition in two (search.model.zero3_step.zero3_sub_groups)."""
    events = _events(3)
    first, second = zero3_sub_groups(OPT, True, 0, 1, ZeroBuckets().sub_group_size)
    assert first >= ZeroBuckets().sub_group_size and first + second == OPT.total_params
    embedding = OPT.vocab_size * OPT.hidden_size
    in_order = [8 * embedding, 2 * first, 4 * first, 2 * second, 4 * second]
    assert _requests(events, "optimizer_step") == in_order
    sizes = {key: size for _, op, key, size, _ in events if op == ALLOC}
    frees = [sizes.get(key) for phase, op, key, _, _ in events if phase == "optimizer_step" and op == FREE]
    assert frees == in_order


def test_zero3_offload_upcasts_each_partition_in_chunks_on_the_reduction_stream() -> None:
    """ZeRO-3 with CPU offload: ``_constant_buffered_norm2`` upcasts each gradient partition to fp64 in chunks
    of at most 250M elements, as the backward reduces them (layers top down, the embedding last)."""
    assert zero3_offload_upcasts(OPT, True, 0, 1, 250_000_000) == (8 * 2048 * 8192, 8 * OPT.vocab_size * 2048)
    assert zero3_offload_upcasts(OPT, True, 0, 4, 250_000_000) == (8 * 2048 * 8192 // 4, 8 * OPT.vocab_size * 512)
    assert zero3_offload_upcasts(OPT, True, 0, 1, 10_000_000) == (8 * 10_000_000,)  # every piece one chunk
    strategy = Strategy(zero_stage=3, offload_optimizer="cpu", micro_batch=4)
    workload = Workload(kind="sft", model=OPT, seq_len=512, global_batch=4)
    stream = stream_of(single_step(workload, strategy, _hardware(), COEF), "never")
    upcasts = set(zero3_offload_upcasts(OPT, True, 0, 1, 250_000_000))
    assert {on for op, _, size, on, _ in stream if op == ALLOC and size in upcasts} == {REDUCTION_STREAM}

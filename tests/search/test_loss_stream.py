"""The loss of a large vocabulary in a step's allocation stream, tensor by tensor as the real program frees them
(search.model.deepspeed_tensors.loss_tensors, issue 34).

transformers' ``ForCausalLMLoss`` (``loss/loss_utils.py``): the LM head's 16-bit logits, ``logits.float()``, then
``F.cross_entropy``'s log-softmax, whose autograd node saves its output; the upcast goes when the loss returns,
the 16-bit logits when the loop drops the model output: both within the forward. PyTorch's backward, node by
node: ``NllLossBackward`` makes a zero fp32 gradient, ``LogSoftmaxBackward`` the fp32 gradient of the logits
and then releases its input gradient and its saved output; ``ToCopyBackward`` casts it to the 16-bit dtype, then
the fp32 one goes; the head's backward makes the weight's gradient beside the 16-bit one, which goes next. A
tied weight's share waits for the embedding's backward, whose sum ZeRO-2 copies into its gradient partition
before freeing it. A CPU probe of gemma-3-1b (2 layers, ZeRO-2, 2 x 1024) records this order
(``benchmarks/results/large_vocab_stream.md``)."""

from __future__ import annotations

from functools import cache

from search.coefficients import Coefficients
from search.single.predict import single_step
from search.step.replayed import stream_of
from store.alloc_stream import ALLOC, FREE, PHASE
from store.ds_buckets import ZeroBuckets
from store.gpus import get_gpu
from store.models import get_model, with_layers
from store.records import Hardware, Strategy, Workload

GEMMA = with_layers(get_model("gemma-3-1b"), 2)  # vocabulary 262144, tied embedding; 2 layers, as probed
SEQUENCES, SEQ_LEN = 2, 1024
E = SEQUENCES * SEQ_LEN * GEMMA.vocab_size  # logits
Event = tuple[str, int, int, int]  # (phase, op, key, size)


@cache
def _events(zero_stage: int = 2, dtype: str = "bf16") -> tuple[Event, ...]:
    """(phase, op, key, size) of the second step of the cut gemma-3-1b's SFT stream on one H100."""
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)
    # a 2e8-element bucket (the probe's): every gradient of the cut model but the tied embedding's fits in one
    buckets = ZeroBuckets(reduce_bucket_size=200_000_000) if zero_stage else None
    strategy = Strategy(zero_stage=zero_stage, micro_batch=SEQUENCES, ds_buckets=buckets)
    workload = Workload(kind="sft", model=GEMMA, seq_len=SEQ_LEN, global_batch=SEQUENCES, dtype=dtype)
    stream = stream_of(single_step(workload, strategy, hardware, Coefficients()), "never")
    out, phase, step = [], "", 0
    for op, key, size, _, _ in stream:
        if op == PHASE:
            phase = stream.phases[key]
            step += phase.startswith("step:")
        elif step == 2 and op in (ALLOC, FREE):
            out.append((phase, op, key, size))
    sizes = {key: size for _, op, key, size in out if op == ALLOC}
    return tuple((phase, op, key, sizes.get(key, size)) for phase, op, key, size in out)


def _loss(events: tuple[Event, ...], phase: str, sizes: set[int]) -> list[tuple[str, int, int]]:
    """('+' or '-', size, key) of the events of ``phase`` whose tensors have one of ``sizes``."""
    return [("+" if op == ALLOC else "-", size, key) for p, op, key, size in events if p == phase and size in sizes]


def test_the_forward_frees_the_upcast_and_the_16_bit_logits_and_keeps_the_log_softmax() -> None:
    forward = _loss(_events(), "forward", {2 * E, 4 * E})
    assert [(s, n) for s, n, _ in forward] == [("+", 2 * E), ("+", 4 * E), ("+", 4 * E), ("-", 2 * E), ("-", 4 * E)]
    logits, upcast, log_softmax = (key for _, _, key in forward[:3])
    assert {key for s, _, key in forward if s == "-"} == {logits, upcast}  # the log-softmax output stays


def test_the_backward_keeps_the_log_softmax_until_its_gradient_exists_then_makes_the_16_bit_gradient() -> None:
    events = _events()
    log_softmax = [key for _, _, key in _loss(events, "forward", {4 * E})][1]
    head = 2 * GEMMA.vocab_size * GEMMA.hidden_size  # the tied weight's gradient from the LM head
    backward = _loss(events, "backward", {2 * E, 4 * E, head})
    made = [(s, n) for s, n, _ in backward]
    assert made[:8] == [
        ("+", 4 * E),  # NllLossBackward's zero gradient
        ("+", 4 * E),  # LogSoftmaxBackward's gradient of the logits
        ("-", 4 * E),
        ("-", 4 * E),  # its input gradient and the saved log-softmax, once used
        ("+", 2 * E),  # ToCopyBackward: the 16-bit gradient of the logits
        ("-", 4 * E),  # the fp32 one
        ("+", head),  # the LM head's weight gradient, beside the 16-bit one
        ("-", 2 * E),
    ]
    assert log_softmax in {key for s, _, key in backward[2:4]}  # the forward's tensor, not a copy made again


def test_a_tied_sum_is_alive_when_zero2_makes_its_gradient_partition() -> None:
    """The embedding's backward: its own gradient and the sum beside the head's share, then the head's share
    and its own go; the sum goes only after ``copy_grads_in_partition`` made the partition."""
    head = 2 * GEMMA.vocab_size * GEMMA.hidden_size
    backward = [(s, n) for s, n, _ in _loss(_events(), "backward", {head})]
    assert backward == [("+", head), ("+", head), ("+", head), ("-", head), ("-", head), ("-", head)]
    events = [e for e in _events() if e[0] == "backward"]
    sum_freed = max(i for i, (_, op, _, size) in enumerate(events) if op == FREE and size == head)
    made_after = [size for _, op, _, size in events[:sum_freed] if op == ALLOC]
    assert made_after[-1] == 2 * GEMMA.total_params  # grads_in_partition: every gradient, on one rank


def test_without_zero_the_same_order_and_in_fp32_no_upcast_and_no_cast_down() -> None:
    zero0 = _loss(_events(0), "forward", {2 * E, 4 * E})
    assert [(s, n) for s, n, _ in zero0] == [("+", 2 * E), ("+", 4 * E), ("+", 4 * E), ("-", 2 * E), ("-", 4 * E)]
    fp32 = _events(2, "fp32")
    assert [(s, n) for s, n, _ in _loss(fp32, "forward", {4 * E})] == [("+", 4 * E), ("+", 4 * E), ("-", 4 * E)]
    backward = [(s, n) for s, n, _ in _loss(fp32, "backward", {4 * E})]
    assert backward[:5] == [("+", 4 * E), ("+", 4 * E), ("-", 4 * E), ("-", 4 * E), ("-", 4 * E)]

"""A ZeRO-3 optimizer step in the allocation stream, pinned to DeepSpeed 0.19's ``runtime/zero/stage3.py``.

``step()`` (l. 2910-2927) runs the sub-groups one at a time: ``_prepare_fp32_grad_for_sub_group`` (l. 2686)
flattens the sub-group's 16-bit gradient partitions (``self.flatten``: a copy) and upcasts the copy to fp32
(``.to(fp32)``), the flat copy a temporary; ``_optimizer_step`` runs Adam, whose ``exp_avg`` and ``exp_avg_sq``
(``torch.zeros_like`` of the fp32 partition) its first step makes and keeps; ``_release_sub_group`` drops the
fp32 gradient (``.grad = None``) before the next sub-group. The sub-groups are ``_create_fp16_sub_groups``'
(l. 1210): parameters in order until ``sub_group_size`` elements. ``_setup_for_real_optimizer`` makes
``grad_partitions_flat_buffer`` once, at init: the backward reduces into it, every step, for the whole run.
"""

from __future__ import annotations

from search.coefficients import Coefficients
from search.model.moment_parts import GRAD_NORM, REDUCTION_STREAM
from search.model.zero3_step import (
    DEVICE_PARTITION,
    PARTITION_FP32,
    SUB_GROUP_FLAT,
    SUB_GROUP_FP32,
    adam_steps,
    module_parameters,
    sub_groups,
    zero3_offload_grads,
    zero3_step,
    zero3_sub_groups,
)
from search.single.predict import single_step
from search.step.replayed import stream_of
from store.alloc_stream import ALLOC, FREE, KIND_INDEX, PHASE, AllocStream
from store.ds_buckets import ZeroBuckets
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

MODEL = get_model("opt-125m")
SUB_GROUP = 30_000_000  # elements: opt-125m's 125M parameters make several sub-groups
OPTIMIZER_STATES, GRADIENTS = KIND_INDEX["optimizer_states"], KIND_INDEX["gradients"]


def _stream(sub_group_size: int = SUB_GROUP, dtype: str = "bf16", offload: str = "none") -> AllocStream:
    """The stream of init and two steps: opt-125m, ZeRO-3 (without offload), one rank, 2 x 256 tokens."""
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)
    buckets = ZeroBuckets(sub_group_size=sub_group_size, overlap_comm=True)  # stage 3's default
    strategy = Strategy(zero_stage=3, micro_batch=2, ds_buckets=buckets, offload_optimizer=offload)
    workload = Workload(kind="sft", model=MODEL, seq_len=256, global_batch=2, dtype=dtype)
    return stream_of(single_step(workload, strategy, hardware, Coefficients()), "never")


def _by_step(stream: AllocStream) -> dict[tuple[int, str], list[tuple[int, int, int, int]]]:
    """(step, phase) -> that phase run's (op, key, size, kind), step 0 being the engine's init."""
    out: dict[tuple[int, str], list[tuple[int, int, int, int]]] = {}
    step, phase = 0, "setup"
    for op, key, size, _, kind in stream:
        if op == PHASE:
            phase = stream.phases[key]
            if phase.startswith("step:"):
                step = int(phase.removeprefix("step:"))
            continue
        out.setdefault((step, phase), []).append((op, key, size, kind))
    return out


def _groups() -> list[int]:
    return zero3_sub_groups(MODEL, True, 0, 1, SUB_GROUP)


def test_sub_groups_are_deepspeeds_cut_of_the_partitions_in_parameter_order() -> None:
    groups = _groups()
    assert groups == sub_groups([n for n, train in module_parameters(MODEL) if train], SUB_GROUP)
    assert len(groups) > 2 and all(g >= SUB_GROUP for g in groups[:-1]) and sum(groups) == MODEL.total_params
    assert zero3_sub_groups(MODEL, True, 0, 1, MODEL.total_params) == [MODEL.total_params]  # one sub-group
    # on 4 ranks each parameter's partition is ceil(numel / 4)
    assert sum(zero3_sub_groups(MODEL, True, 0, 4, MODEL.total_params)) == sum(
        -(-n // 4) for n, _ in module_parameters(MODEL)
    )


def test_moments_name_one_flat_and_fp32_pair_per_sub_group_in_order() -> None:
    kept, norm, groups = 1000, 64, [30, 20]
    moments, named = zero3_step(kept, norm, 2, groups)
    assert [[t.name for t in tensors] for tensors in named] == [
        [],
        [GRAD_NORM],
        [f"{SUB_GROUP_FLAT}0"],
        [f"{SUB_GROUP_FLAT}0", f"{SUB_GROUP_FP32}0"],
        [f"{SUB_GROUP_FP32}0"],
        [f"{SUB_GROUP_FLAT}1"],
        [f"{SUB_GROUP_FLAT}1", f"{SUB_GROUP_FP32}1"],
        [f"{SUB_GROUP_FP32}1"],
    ]
    assert [m["gradients"] - kept for m in moments] == [0, norm, 60, 180, 120, 40, 120, 80]
    # Adam steps where a sub-group's fp32 gradient is held alone
    assert [adam_steps(tensors) for tensors in named] == [(), (), (), (), (120,), (), (), (80,)]
    # an fp32 model's flat copy is its fp32 gradient (.to(fp32) returns it): one tensor per sub-group
    _, fp32_named = zero3_step(kept, norm, 4, groups)
    assert [[t.name for t in tensors] for tensors in fp32_named[2:]] == [[f"{SUB_GROUP_FP32}0"], [f"{SUB_GROUP_FP32}1"]]


def test_each_sub_group_gets_its_copies_and_at_the_first_step_adams_states() -> None:
    groups = _groups()
    runs = _by_step(_stream())
    for step in (1, 2):
        events = runs[(step, "optimizer_step")]
        sizes = {key: size for op, key, size, _ in events if op == ALLOC}
        got = [(op, size if op == ALLOC else sizes.get(key), kind) for op, key, size, kind in events]
        got = got[2:]  # the fp64 norm upcast, requested then freed
        for g in groups:
            expected = [(ALLOC, 2 * g, GRADIENTS), (ALLOC, 4 * g, GRADIENTS), (FREE, 2 * g, 0)]
            if step == 1:  # exp_avg and exp_avg_sq, made by the sub-group's first Adam step and kept
                expected += [(ALLOC, 4 * g, OPTIMIZER_STATES)] * 2
            expected.append((FREE, 4 * g, 0))
            assert [(op, size, kind if op == ALLOC else 0) for op, size, kind in got[: len(expected)]] == expected
            got = got[len(expected) :]
        assert got == []


def test_the_gradient_buffer_made_at_init_lives_across_steps() -> None:
    stream = _stream()
    runs = _by_step(stream)
    buffer = 2 * MODEL.total_params  # grad_partitions_flat_buffer: bf16, every trainable partition
    made = [key for op, key, size, kind in runs[(0, "setup")] if op == ALLOC and size == buffer and kind == GRADIENTS]
    assert len(made) == 1
    assert all(key != made[0] for op, key, *_ in stream if op == FREE)  # never freed
    for step in (1, 2):  # the forward finds it made: the step requests no gradient before its backward
        assert not [e for e in runs[(step, "forward")] if e[0] == ALLOC and e[3] == GRADIENTS]
        assert not [e for e in runs[(step, "backward")] if e[0] == ALLOC and e[2] >= buffer]


def test_adams_states_come_to_what_the_step_counts_resident() -> None:
    """The lazy states made per sub-group at the first step are the 8 bytes per element the cost model keeps."""
    runs = _by_step(_stream())
    made = sum(size for op, _, size, kind in runs[(1, "optimizer_step")] if op == ALLOC and kind == OPTIMIZER_STATES)
    assert made == 8 * MODEL.total_params
    assert not [e for e in runs[(2, "optimizer_step")] if e[0] == ALLOC and e[3] == OPTIMIZER_STATES]


def test_offload_copies_each_gradient_partition_to_the_device_then_to_fp32() -> None:
    """partition_grads with the optimizer offloaded: per parameter in the backward's order, ``grad_buffer.to(device)``
    (16-bit), its fp64 norm chunks beside it, then its fp32 copy for the host; only the parameters larger than
    every one before are made (the others reuse their blocks)."""
    growing: list[int] = []
    for numel, _ in reversed(module_parameters(MODEL)):
        if not growing or numel > growing[-1]:
            growing.append(numel)
    assert growing[-1] == MODEL.vocab_size * MODEL.hidden_size  # the (tied) token embedding comes last
    chunk = 10_000_000
    got = zero3_offload_grads(MODEL, True, 0, 1, 2, chunk, REDUCTION_STREAM)
    expected = []
    for i, p in enumerate(growing):
        device = (f"{DEVICE_PARTITION}{i}", 2 * p)
        expected += [
            [device],
            [device, (f"{GRAD_NORM}_{i}", 8 * min(p, chunk))],
            [device, (f"{PARTITION_FP32}{i}", 4 * p)],
        ]
    assert [[(t.name, t.size) for t in tensors] for tensors in got] == expected
    assert {t.stream for tensors in got for t in tensors} == {REDUCTION_STREAM}
    # in the stream: the embedding's device copy and fp32 copy on the reduction stream, freed in the backward
    stream = _stream(offload="cpu")
    embedding = growing[-1]
    step, phase, made, seen = 0, "", {}, set()
    for op, key, size, on, _ in stream:
        if op == PHASE:
            phase = stream.phases[key]
            step += phase.startswith("step:")
        elif step == 2 and phase == "backward" and op == ALLOC and on and size in (2 * embedding, 4 * embedding):
            made[key] = size
            seen.add((size, on))
        elif step == 2 and op == FREE and key in made:
            assert phase == "backward"
            made.pop(key)
    assert made == {} and seen == {(2 * embedding, REDUCTION_STREAM), (4 * embedding, REDUCTION_STREAM)}

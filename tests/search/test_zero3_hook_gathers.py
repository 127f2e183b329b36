"""A ZeRO-3 engine's init ends with its gradient hooks' gathers (DeepSpeed 0.19.8, issue 46).

``stage3.py`` ``create_reduce_and_remove_grad_hooks`` (after ``_setup_for_real_optimizer``): for each trainable
parameter in ``module.parameters()`` order, ``param.all_gather()`` then ``param.partition()``. One parameter takes
``partition_parameters.py`` ``_allgather_params_sequential``: ``torch.empty(partition x world size)`` on the device,
freed by ``free_param``; under parameter offload ``param.ds_tensor.to(device)`` (the host partition's device copy)
is the all-gather's input beside it. With the optimizer offloaded nothing larger is cached by then, so the first
and largest gather (the token embedding) keeps a segment of its own: what the H200 reserved after
``deepspeed.initialize`` (tests/planner/test_gpu_records.py holds the record to the byte).
"""

from __future__ import annotations

from search.allocator import AllocatorConfig, replay
from search.coefficients import Coefficients
from search.model.placement import TrainedPlacement, trained_placement
from search.model.zero3_step import module_parameters
from search.streams.build import _engines_init
from search.streams.init import engine_init
from search.streams.parts import Parts
from store.alloc_stream import ALLOC, FREE, AllocStream, StreamBuilder
from store.ds_buckets import ZeroBuckets
from store.models import get_model
from store.records import TrainedModelStrategy

MODEL = get_model("opt-125m")
BF16 = 2
MIB = 2**20


def _placed(
    world: int = 1, lora: int = 0, offload_optimizer: str = "cpu", offload_param: str = "none"
) -> TrainedPlacement:
    layout = TrainedModelStrategy(
        zero_stage=3, offload_optimizer=offload_optimizer, offload_param=offload_param, lora_rank=lora
    )
    return trained_placement(MODEL, True, layout, "bf16", world, 1, Coefficients(), ZeroBuckets(overlap_comm=True))


def _init_events(placed: TrainedPlacement) -> list[tuple[int, int, int]]:
    init = engine_init(placed, "bf16")
    out = StreamBuilder()
    _engines_init(
        Parts(out), (("optimizer_step", placed.states.parameters, placed.states.optimizer_states, init, ()),), {}, {}
    )
    return [(op, key, size) for op, key, size, _, _ in out.build().events]


def test_each_trainable_parameter_is_gathered_whole_and_freed_in_order() -> None:
    world = 3
    events = _init_events(_placed(world=world))
    trainable = [numel for numel, train in module_parameters(MODEL) if train]
    tail = events[-2 * len(trainable) :]
    for i, numel in enumerate(trainable):
        (op, key, size), (free, freed, _) = tail[2 * i], tail[2 * i + 1]
        # the aligned whole: each rank's share rounded up, times the ranks
        assert (op, size, free, freed) == (ALLOC, BF16 * -(-numel // world) * world, FREE, key)


def test_only_lora_adapters_are_gathered() -> None:
    placed = _placed(lora=8)
    init = engine_init(placed, "bf16")
    assert init.zero3 is not None
    adapters = [numel for numel, train in module_parameters(MODEL, 8) if train]
    assert [whole for whole, _ in init.zero3.hook_gathers] == [BF16 * n for n in adapters]


def test_parameter_offload_copies_each_host_partition_beside_its_gather() -> None:
    placed = _placed(world=2, offload_param="cpu")
    init = engine_init(placed, "bf16")
    assert init.zero3 is not None
    trainable = [numel for numel, train in module_parameters(MODEL) if train]
    assert init.zero3.hook_gathers == tuple((BF16 * -(-n // 2) * 2, BF16 * -(-n // 2)) for n in trainable)
    events = _init_events(placed)
    gathered, copy, copy_freed, gathered_freed = events[-4 * len(trainable) :][:4]
    assert (gathered[0], copy[0], copy_freed[:2], gathered_freed[:2]) == (
        ALLOC,
        ALLOC,
        (FREE, copy[1]),
        (FREE, gathered[1]),
    )


def test_offloaded_init_keeps_the_token_embeddings_gather_cached() -> None:
    """With the optimizer on the host no larger block is free when the gathers come: the token embedding's
    (the first and largest) needs a segment of its own, left cached once it is freed."""
    placed = _placed()
    init = engine_init(placed, "bf16")
    out = StreamBuilder()
    _engines_init(
        Parts(out), (("optimizer_step", placed.states.parameters, placed.states.optimizer_states, init, ()),), {}, {}
    )
    stream = out.build()
    gathers = 2 * sum(1 for _, train in module_parameters(MODEL) if train)
    before = AllocStream(stream.events[:-gathers], stream.phases)
    after_init = replay(stream, AllocatorConfig()).phases[-1].end_reserved
    before_gathers = replay(before, AllocatorConfig()).phases[-1].end_reserved
    segment = -(-BF16 * MODEL.vocab_size * MODEL.hidden_size // (2 * MIB)) * 2 * MIB  # the embedding, rounded up
    # that segment, and at most one small-pool segment (2 MiB) for the biases
    assert segment <= after_init - before_gathers <= segment + 2 * MIB

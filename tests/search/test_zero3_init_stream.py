"""A ZeRO-3 engine's init in the allocation stream, pinned to DeepSpeed 0.19's code (search.streams.init.Zero3Init).

``partition_parameters.py`` ``_partition_param``: each partition is made (``torch.empty``) and filled before its
original is freed (``free_param``). ``stage3.py`` ``_create_fp16_partitions_with_defragmentation`` and
``runtime/zero/utils.py`` ``defragment``: the trainable partitions are freed, then ``empty_cache()``, then one flat
buffer. ``_create_fp32_partitions``: per sub-group ``converted = flat.to(fp32)`` and ``converted.clone()`` kept,
the previous ``converted`` freed when the next one is bound. ``initialize_optimizer_states``: a zero fp32
gradient of the largest sub-group, dropped without offload. ``_setup_for_real_optimizer``: the reduce bucket and
``grad_partitions_flat_buffer`` (on the host with the optimizer offloaded). The hooks' gathers that follow
(``create_reduce_and_remove_grad_hooks``) are tests/search/test_zero3_hook_gathers.py's.
"""

from __future__ import annotations

from search.allocator import AllocatorConfig, replay
from search.coefficients import Coefficients
from search.model.placement import TrainedPlacement, trained_placement
from search.model.zero3_step import module_parameters, sub_groups
from search.streams.build import _engines_init
from search.streams.init import FP32, EngineInit, engine_init, zero3_sub_group_size
from search.streams.parts import Parts
from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, AllocStream, StreamBuilder
from store.ds_buckets import ZeroBuckets
from store.models import get_model
from store.records import TrainedModelStrategy

MODEL = get_model("opt-125m")
SUB_GROUP = 30_000_000  # elements: opt-125m's 125M parameters make several sub-groups


def _placed(
    world: int = 1,
    lora: int = 0,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    param_persistence_threshold: int = 100_000,
) -> TrainedPlacement:
    layout = TrainedModelStrategy(
        zero_stage=3, offload_optimizer=offload_optimizer, offload_param=offload_param, lora_rank=lora
    )
    ds = ZeroBuckets(sub_group_size=SUB_GROUP, param_persistence_threshold=param_persistence_threshold)
    return trained_placement(MODEL, True, layout, "bf16", world, 1, Coefficients(), ds)


def _init_stream(placed: TrainedPlacement, resident: dict[str, int] | None = None) -> tuple[AllocStream, EngineInit]:
    """The init events of one engine, as step_stream emits them before its first step."""
    init = engine_init(placed, "bf16")
    out = StreamBuilder()
    engine = ("optimizer_step", placed.states.parameters, placed.states.optimizer_states, init, ())
    _engines_init(Parts(out), (engine,), {}, resident or {})
    return out.build(), init


def _ops(stream: AllocStream) -> list[tuple[int, int, int]]:
    return [(op, key, size) for op, key, size, _, _ in stream.events]


def _before_hook_gathers(events: list[tuple[int, int, int]], init: EngineInit) -> list[tuple[int, int, int]]:
    """The events before create_reduce_and_remove_grad_hooks' gathers (an ALLOC and its FREE per trainable
    parameter, two more per parameter with its host partition's device copy), which end the init."""
    assert init.zero3 is not None
    gathers = sum(4 if copy else 2 for _, copy in init.zero3.hook_gathers)
    return events[: len(events) - gathers]


def test_module_parameters_sum_to_the_model_in_load_order() -> None:
    params = module_parameters(MODEL)
    assert sum(n for n, _ in params) == MODEL.total_params
    assert params[0][0] == MODEL.vocab_size * MODEL.hidden_size  # the token embedding comes first
    lora = module_parameters(MODEL, 8)
    assert sum(n for n, train in lora if not train) == MODEL.total_params
    assert sum(n for n, train in lora if train) == _placed(lora=8).trainable


def test_each_partition_is_made_before_its_original_is_freed() -> None:
    stream, init = _init_stream(_placed())
    z = init.zero3
    assert z is not None and not z.staged
    events = _ops(stream)
    count = len(z.originals)
    originals = [key for op, key, _ in events[:count]]
    assert [size for _, _, size in events[:count]] == list(z.originals)  # the built model, whole, first
    assert all(op == ALLOC for op, _, _ in events[:count])
    for i, original in enumerate(originals):  # then per parameter: its partition, then its original freed
        op, _, size = events[count + 2 * i]
        assert (op, size) == (ALLOC, z.partitions[i])
        assert events[count + 2 * i + 1][:2] == (FREE, original)


def test_defragment_frees_the_partitions_empties_the_cache_then_makes_one_flat_buffer() -> None:
    stream, init = _init_stream(_placed())
    z = init.zero3
    assert z is not None
    events = _ops(stream)
    empty = events.index((EMPTY_CACHE, 0, 0))
    partitions = {key for op, key, size in events[: len(z.originals) * 3] if op == ALLOC} - {
        key for _, key, _ in events[: len(z.originals)]
    }
    freed_before = {key for op, key, _ in events[:empty] if op == FREE}
    assert partitions <= freed_before  # every trainable partition went to the host and was freed
    assert events[empty + 1] == (ALLOC, events[empty + 1][1], sum(z.partitions))  # lp_param_buffer
    assert [op for op, _, _ in events].count(EMPTY_CACHE) == 1
    # the allocator then holds nothing: every segment of the originals and partitions is released
    timeline = replay(stream, AllocatorConfig(), timeline=True).timeline
    assert timeline[empty][3] == 0


def test_frozen_partitions_stay_and_keep_their_segments() -> None:
    """LoRA: only the adapters are defragmented; the base model's partitions stay where they were made."""
    stream, init = _init_stream(_placed(lora=8))
    z = init.zero3
    assert z is not None
    empty = _ops(stream).index((EMPTY_CACHE, 0, 0))
    frozen = sum(size for size, train in zip(z.partitions, z.trainable, strict=True) if not train)
    sample = replay(stream, AllocatorConfig(), timeline=True).timeline[empty]
    assert sample[1] == frozen  # what is requested and alive after empty_cache: the frozen partitions
    assert sample[3] > sample[2] >= frozen  # and the segments they were carved from stay reserved


def test_one_fp32_transient_per_sub_group_freed_after_the_next_is_made() -> None:
    placed = _placed()
    assert zero3_sub_group_size(placed, "bf16") == SUB_GROUP
    stream, init = _init_stream(placed)
    z = init.zero3
    assert z is not None
    elements = sub_groups([n for n, _ in module_parameters(MODEL)], SUB_GROUP)
    assert len(elements) > 2 and all(e >= SUB_GROUP for e in elements[:-1])
    assert z.fp32_sub_groups == tuple(FP32 * e for e in elements)
    events = _before_hook_gathers(_ops(stream), init)
    start = events.index((EMPTY_CACHE, 0, 0)) + 2  # after the flat 16-bit buffer
    converted = []
    for i, size in enumerate(z.fp32_sub_groups):
        op, key, got = events[start]
        assert (op, got) == (ALLOC, size)
        converted.append(key)
        step = 1
        if i:  # the previous sub-group's copy is freed once this one is bound
            assert events[start + 1][:2] == (FREE, converted[i - 1])
            step = 2
        assert events[start + step][0::2] == (ALLOC, size)  # the kept clone (the master)
        start += step + 1
    assert events[start][:2] == (FREE, converted[-1])  # the last copy at _create_fp32_partitions' return
    # initialize_optimizer_states' zero gradient of the largest sub-group, dropped at its end
    assert events[start + 1][0::2] == (ALLOC, FP32 * max(elements))
    assert events[start + 2][:2] == (FREE, events[start + 1][1])
    # then the reduce bucket and grad_partitions_flat_buffer, kept
    assert events[start + 3][0::2] == (ALLOC, placed.buffers)
    assert events[start + 4][0::2] == (ALLOC, 2 * MODEL.total_params)
    assert len(events) == start + 5


def test_partitions_are_a_rank_share_rounded_up() -> None:
    placed = _placed(world=3)
    init = engine_init(placed, "bf16")
    assert init.zero3 is not None
    numels = [n for n, _ in module_parameters(MODEL)]
    assert init.zero3.partitions == tuple(2 * -(-n // 3) for n in numels)
    assert init.zero3.grad_partitions == sum(init.zero3.partitions)


def test_optimizer_offload_keeps_the_fp32_copies_and_gradients_on_the_host() -> None:
    placed = _placed(offload_optimizer="cpu")
    stream, init = _init_stream(placed)
    z = init.zero3
    assert z is not None and z.fp32_sub_groups == () and z.gradient_buffer == 0 and z.grad_partitions == 0
    events = _before_hook_gathers(_ops(stream), init)
    empty = events.index((EMPTY_CACHE, 0, 0))
    # after the cache is emptied: the flat 16-bit buffer and the reduce bucket, nothing else
    assert [(op, size) for op, _, size in events[empty + 1 :]] == [
        (ALLOC, sum(z.partitions)),
        (ALLOC, placed.buffers),
    ]


def test_parameter_offload_moves_each_weight_through_the_device_alone() -> None:
    """Built on the host, each parameter is copied to the device, partitioned to the host and freed."""
    stream, init = _init_stream(_placed(offload_optimizer="cpu", offload_param="cpu"))
    z = init.zero3
    assert z is not None and z.staged and z.partitions == ()
    events = _ops(stream)
    count = len(z.originals)
    for i in range(count):
        (op, key, size), (free, freed, _) = events[2 * i], events[2 * i + 1]
        assert (op, size, free, freed) == (ALLOC, z.originals[i], FREE, key)
    assert (EMPTY_CACHE, 0, 0) not in events  # the offload branch does not defragment


def test_gradient_partitions_go_where_the_step_counts_them() -> None:
    """Resident when the step keeps them resident (RLHF), else the live gradients its first moment holds."""
    placed = _placed()
    for resident, part in (({"gradients": 1}, "resident:gradients"), ({}, "gradients")):
        out = StreamBuilder()
        parts = Parts(out)
        engine = ("s", placed.states.parameters, placed.states.optimizer_states, engine_init(placed, "bf16"), ())
        _engines_init(parts, (engine,), {}, resident)
        assert parts.bytes(part) == 2 * MODEL.total_params
        assert parts.bytes("resident:parameters") == placed.states.parameters
        assert parts.bytes("resident:optimizer_states") == FP32 * MODEL.total_params


def test_the_persistence_threshold_does_not_change_init() -> None:
    """No parameter persists while the engine converts a built model (Init.apply_param_persistence is off)."""
    low = _init_stream(_placed(param_persistence_threshold=10))[0]
    high = _init_stream(_placed(param_persistence_threshold=10_000_000))[0]
    assert low == high


def test_other_stages_keep_their_init() -> None:
    for stage in (0, 1, 2):
        layout = TrainedModelStrategy(zero_stage=stage)
        placed = trained_placement(MODEL, True, layout, "bf16", 1, 1, Coefficients(), None)
        assert engine_init(placed, "bf16").zero3 is None


def test_a_model_larger_than_the_gpu_is_partitioned_as_it_is_built() -> None:
    """A model whose 16-bit weights exceed the GPU cannot be built whole there: under zero.Init each parameter's
    partition is made as its module is, and no original ever reaches the device; one that fits is built whole."""
    placed = _placed(world=4)
    weights = 2 * MODEL.total_params
    whole = engine_init(placed, "bf16", device_bytes=weights + 1).zero3
    at_build = engine_init(placed, "bf16", device_bytes=weights - 1).zero3
    assert whole is not None and not whole.partitioned_at_build
    assert at_build is not None and at_build.partitioned_at_build
    out = StreamBuilder()
    init = engine_init(placed, "bf16", device_bytes=weights - 1)
    engine = ("optimizer_step", placed.states.parameters, placed.states.optimizer_states, init, ())
    _engines_init(Parts(out), (engine,), {}, {})
    made = [size for op, _, size in _ops(out.build())[: len(at_build.partitions)]]
    assert made == list(at_build.partitions)  # the partitions first, a quarter of each parameter
    made_sizes = {size for op, _, size in _before_hook_gathers(_ops(out.build()), init) if op == ALLOC}
    assert max(at_build.originals) not in made_sizes  # the token embedding never whole on the device while built


def test_a_program_under_zero_init_never_holds_the_whole_model() -> None:
    """The HF Trainer (and Accelerate, TRL, OpenRLHF, DeepSpeed-Chat) build a ZeRO-3 model under zero.Init
    (store.model_build): no original reaches the device even where the whole model would fit; memplan's own
    loop builds it whole first (issue 42). LoRA keeps the fp32 masters small and the buckets are small, so the
    build sets the init's peak."""
    layout = TrainedModelStrategy(zero_stage=3, lora_rank=8)
    ds = ZeroBuckets(sub_group_size=SUB_GROUP, reduce_bucket_size=1000, prefetch_bucket_size=1000)
    placed = trained_placement(MODEL, True, layout, "bf16", 4, 1, Coefficients(), ds)
    roomy = 100 * 2 * MODEL.total_params
    peaks = {}
    for name in ("deepspeed", "hf"):
        init = engine_init(placed, "bf16", device_bytes=roomy, framework=name)
        assert init.zero3 is not None and init.zero3.partitioned_at_build == (name == "hf")
        out = StreamBuilder()
        engine = ("optimizer_step", placed.states.parameters, placed.states.optimizer_states, init, ())
        _engines_init(Parts(out), (engine,), {}, {})
        sizes = {size for op, _, size in _ops(out.build()) if op == ALLOC}
        assert (max(init.zero3.originals) in sizes) == (name == "deepspeed")
        peaks[name] = replay(out.build(), AllocatorConfig()).peak_allocated
    weights = 2 * MODEL.total_params
    assert peaks["deepspeed"] >= weights > 2 * peaks["hf"]  # the whole model never sits on the GPU under zero.Init

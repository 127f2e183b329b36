"""What a trained model's DeepSpeed engine asks torch's allocator for while it starts, and at its first step.

The resident bytes of a model (:mod:`search.model.states`) are not made in one go: the allocator sees the
copies DeepSpeed makes and drops on the way, and those leave blocks cached. From DeepSpeed's code
(``runtime/zero/stage_1_and_2.py``, ``runtime/fp16/fused_optimizer.py``, ``runtime/zero/stage3.py``):

- The engine moves the built model to the device tensor by tensor (``originals``).
- ZeRO-1/2: ``flatten_dense_tensors_aligned`` makes one flat 16-bit buffer, and ``_update_model_bit16_weights``
  points every ``p.data`` into it, freeing the originals. The fp32 master partition is
  ``partition.detach().clone().to(fp32)``: a 16-bit clone (``before_master``) exists while the fp32 copy is
  made. ``initialize_optimizer_states`` then sets a zero fp32 gradient of the partition and drops it
  (``after_master``).
- ZeRO-0 with a 16-bit dtype: FP16_Optimizer (the engine's wrapper for bf16 too, unless the gradient
  accumulation dtype differs) flattens clones of every weight (freed with the originals), makes the fp32
  master as ``flat.clone().float()`` (a 16-bit clone again), and its ``initialize_optimizer_states`` sets a
  zero fp32 gradient and steps the optimizer once: Adam's states are made at init (``at_init``).
- ZeRO-3 (:class:`Zero3Init`, ``runtime/zero/partition_parameters.py``, ``parameter_offload.py``,
  ``stage3.py``, ``runtime/zero/utils.py``): every parameter is partitioned in turn (its partition made while
  its original exists, then the original freed); ``defragment`` moves the trainable partitions to the host,
  frees them, empties the cache and makes one flat 16-bit buffer; each sub-group's fp32 master is a clone of
  a transient fp32 copy; ``initialize_optimizer_states`` sets and drops a zero fp32 gradient of the largest
  sub-group; then the reduce bucket and the gradient partitions' flat buffer.
- Adam's ``exp_avg`` and ``exp_avg_sq`` (8 bytes per trainable parameter of the partition) are made by the
  first ``optimizer.step()`` (``lazy``), not at init, except under FP16_Optimizer: on the device after that
  step's gradients.

With the optimizer offloaded, the fp32 master, its gradient and Adam's states live on the host; ZeRO-1/2 still
make the 16-bit clone of the partition on the device before the fp32 copy goes to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from search.model.placement import TrainedPlacement
from search.model.quantized import quantized_weight_elements
from search.model.states import init_cached_bytes
from search.model.zero3_step import module_parameters, sub_groups
from store.frameworks import DEFAULT_FRAMEWORK
from store.model_build import BY_FRAMEWORK, builds_partitioned
from store.records import DTYPE_BYTES

FP32 = 4  # bytes of DeepSpeed's master_weights_and_grads_dtype (fp32 unless a config says otherwise)


@dataclass(frozen=True)
class Zero3Init:
    """What a ZeRO-3 engine's init asks the device's allocator for, in DeepSpeed 0.19's order (bytes).

    1. ``originals``: the built model's parameters, in ``module.parameters()`` order. Without parameter
       offload they are all on the device when ``deepspeed.initialize`` starts. With it (``staged``) the
       model was built on the host: ``Init._convert_to_zero_parameters`` moves each parameter to the device
       (``param.data.to(self.local_device)``) and partitions it to the host before the next one comes.
    2. ``partitions``: ``_partition_param`` makes each parameter's partition (``torch.empty(partition_size)``,
       ``ceil(numel / world size)`` elements; on the host under parameter offload: then empty here), copies
       into it and only then frees the original (``free_param``). At this point no parameter is persistent
       (``Init.apply_param_persistence`` is off when the engine converts a built model;
       ``mark_persistent_parameters`` flags the small ones afterwards, and they are gathered whole at the
       first forward, which with one rank is no copy at all), so the persistence threshold does not change
       what init allocates.
    3. ``_create_fp16_partitions_with_defragmentation`` (device partitions only): ``defragment`` copies the
       ``trainable`` partitions to a CPU buffer, frees each one, runs ``gc.collect(); empty_cache()`` and
       copies them back as one flat buffer (``lp_param_buffer``). Frozen partitions (LoRA's base) stay.
    4. ``_create_fp32_partitions``, per sub-group (``fp32_sub_groups``): ``converted = flat.to(device, fp32)``
       then ``converted.clone()`` is kept as the master. ``converted`` is a local that the next sub-group's
       assignment rebinds: the previous one is freed after the next one is made, the last one at return.
       With the optimizer offloaded both are on the host (empty here).
    5. ``initialize_optimizer_states``: ``gradient_buffer = torch.zeros(largest sub-group, fp32,
       device=self.device)`` is each sub-group's ``.grad``; without offload ``group.grad = None`` at the end
       drops it (``gradient_buffer``); with offload ``self.device`` is the host and nothing is on the device.
    6. ``_setup_for_real_optimizer``: the IPG bucket (``bucket``: ``torch.empty(reduce_bucket_size)`` on the
       device, kept) and ``grad_partitions_flat_buffer`` (``grad_partitions``: zeros of every trainable
       partition in the gradient accumulation dtype, on ``self.device``: the host with optimizer offload).
    7. ``create_reduce_and_remove_grad_hooks`` (stage3.py l. 1498-1531, after 6): for each trainable parameter in
       turn, ``param.all_gather()`` then ``param.partition()``. ``Init._all_gather`` takes one parameter down
       ``_allgather_params_sequential`` (partition_parameters.py l. 2132-2158): ``flat_tensor = torch.empty(
       partition x world size)`` on the device (``hook_gathers``: ``d x ceil(numel / n) x n`` bytes each), and
       with parameter offload the host partition's device copy beside it (``param.ds_tensor.to(device)``, the
       input of ``all_gather_into_tensor``); ``_partition_param`` then frees it (``free_param``). The largest
       of them (the token embedding) leaves its block cached where 1-6 left no larger free block (optimizer
       offload: no fp32 copy or gradient buffer was made and dropped on the device).
    """

    originals: tuple[int, ...]
    staged: bool  # built on the host: each original reaches the device alone and is freed before the next
    partitions: tuple[int, ...]  # device bytes of each parameter's partition (empty when on the host)
    trainable: tuple[bool, ...]  # which parameters the optimizer holds (defragmented into the flat buffer)
    fp32_sub_groups: tuple[int, ...]  # device bytes of each sub-group's fp32 master (empty when offloaded)
    gradient_buffer: int  # the zero fp32 gradient of the largest sub-group, made and dropped at init
    bucket: int  # the reduce bucket (and what the cost model keeps beside it), made at init and kept
    grad_partitions: int  # grad_partitions_flat_buffer on the device (0 when on the host)
    # built under ``deepspeed.zero.Init`` (what transformers does under a ZeRO-3 config, and the only way a model
    # larger than the GPU is built): each parameter is partitioned as its module is made, no original is whole
    partitioned_at_build: bool = False
    # 7.: per trainable parameter in order, the bytes gathered whole and those of its host partition's device copy
    hook_gathers: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class EngineInit:
    """One trained engine's allocations at init and at its first step, beyond its resident bytes."""

    originals: int  # the weights as loaded, freed once DeepSpeed holds its own copies
    before_master: int  # the 16-bit clone alive while the fp32 master copy is made
    after_master: tuple[int, ...]  # made and dropped once the master exists (the zero fp32 gradient)
    lazy: int  # Adam's states, made at the first optimizer step (part of the resident optimizer states)
    at_init: int = 0  # Adam's states made at init instead, while the zero fp32 gradient exists
    zero3: Zero3Init | None = None  # ZeRO-3's own sequence (then ``originals`` and ``before_master`` are unused)
    # ZeRO-1/2: DeepSpeedZeroOptimizer.__init__ runs empty_cache() before it flattens each parameter group
    # (stage_1_and_2.py l. 449, DeepSpeed 0.19.8): what earlier engines left cached is released first
    empties_cache: bool = False


def zero3_sub_group_size(placed: TrainedPlacement, dtype: str) -> int:
    """The sub-group size the placement was laid out with, read back from its states: without offload a
    sub-group's step copies are ``(d + 4) x min(partition, sub_group_size)`` bytes
    (:func:`search.model.states.model_states`); a partition no larger than that is one sub-group."""
    partition = placed.trainable // placed.world_size
    step_elements = placed.states.step_transient // (DTYPE_BYTES[dtype] + FP32)
    return step_elements if 0 < step_elements < partition else partition


def zero3_init(
    placed: TrainedPlacement,
    dtype: str,
    sub_group_size: int | None = None,
    device_bytes: int | None = None,
    framework: str = DEFAULT_FRAMEWORK,
    model_build: str = BY_FRAMEWORK,
) -> Zero3Init:
    """The ZeRO-3 init of ``placed`` (:class:`Zero3Init`), with ``sub_group_size`` (default: the one it was laid
    out with, :func:`zero3_sub_group_size`). The cost model keeps no optimizer state on the device under
    parameter offload (:func:`search.model.states.model_states`), so there the fp32 copies are on the host. A
    model whose 16-bit weights exceed ``device_bytes`` (the GPU's memory) cannot be built whole on it: it is
    built under ``zero.Init``, partitioned parameter by parameter (``partitioned_at_build``), unless quantized:
    transformers loads a QLoRA model whole, on the GPU (or, with parameter offload, on the host: ``staged``), and
    its packed codes are ``d``-byte elements (:func:`search.model.quantized.quantized_weight_elements`). The
    program ``framework`` decides the rest (:func:`store.model_build.builds_partitioned`): the HF Trainer,
    Accelerate, TRL, OpenRLHF and DeepSpeed-Chat build under ``zero.Init`` whatever the model's size; a probed
    program's own build (``model_build``) decides over it."""
    s = placed.layout
    d, n = DTYPE_BYTES[dtype], placed.world_size
    quantized = s.quantization != "none"
    stored = partial(quantized_weight_elements, s.quantization, dtype) if quantized else None
    params = module_parameters(placed.model, s.lora_rank, placed.lm_head, stored)
    staged = s.offload_param != "none"
    on_host = staged or s.offload_optimizer != "none"
    partition = [-(-numel // n) for numel, _ in params]
    trainable = [p for p, (_, train) in zip(partition, params, strict=True) if train]
    groups = [] if on_host else sub_groups(trainable, sub_group_size or zero3_sub_group_size(placed, dtype))
    # an fp32 model's partitions are already the masters (stage3.py: same dtype and device, no copy)
    masters = groups if dtype != "fp32" else []
    return Zero3Init(
        originals=tuple(d * numel for numel, _ in params),
        staged=staged,
        partitions=() if staged else tuple(d * p for p in partition),
        trainable=tuple(train for _, train in params),
        fp32_sub_groups=tuple(FP32 * m for m in masters),
        gradient_buffer=FP32 * max(groups, default=0),
        bucket=placed.buffers,
        grad_partitions=0 if on_host else d * sum(trainable),
        hook_gathers=tuple(
            (d * p * n, d * p if staged else 0) for p, (_, train) in zip(partition, params, strict=True) if train
        ),
        # transformers builds a quantized model without zero.Init (store.quantization.qlora_loading): whole first
        partitioned_at_build=not staged
        and builds_partitioned(
            framework,
            quantized=quantized,
            model_bytes=d * sum(n for n, _ in params),
            device_bytes=device_bytes or 0,
            model_build=model_build,
        ),
    )


def engine_init(
    placed: TrainedPlacement,
    dtype: str,
    device_bytes: int | None = None,
    framework: str = DEFAULT_FRAMEWORK,
    model_build: str = BY_FRAMEWORK,
) -> EngineInit:
    """The init and first-step allocations of ``placed`` (see the module docstring) on a GPU of
    ``device_bytes``, built as ``framework`` builds it, or as the probed program was seen to (``model_build``,
    :func:`zero3_init`)."""
    s = placed.layout
    t, n = placed.trainable, placed.world_size
    originals = init_cached_bytes(
        trainable=t, resident=placed.resident, dtype=dtype, zero_stage=s.zero_stage, offload_param=s.offload_param
    )
    partition = t if s.zero_stage == 0 else t // n
    zero3 = (
        zero3_init(placed, dtype, device_bytes=device_bytes, framework=framework, model_build=model_build)
        if s.zero_stage == 3
        else None
    )
    init = _engine_init(placed, dtype, originals, partition, zero3)
    return replace(init, empties_cache=True) if s.zero_stage in (1, 2) else init


def _engine_init(
    placed: TrainedPlacement, dtype: str, originals: int, partition: int, zero3: Zero3Init | None
) -> EngineInit:
    """The allocations of :func:`engine_init` by stage, optimizer placement and precision."""
    s, d, mixed = placed.layout, DTYPE_BYTES[dtype], dtype != "fp32"
    if s.offload_optimizer != "none" or placed.states.optimizer_states == 0:
        # ZeRO-1/2 clone the 16-bit partition on the device before moving the fp32 copy to the host
        clone = d * partition if s.zero_stage in (1, 2) and s.offload_optimizer != "none" else 0
        return EngineInit(originals, clone, (), 0, zero3=zero3)
    lazy = 8 * partition
    if s.zero_stage == 0 and mixed:
        # FP16_Optimizer (bf16 too): its initialize_optimizer_states sets a zero fp32 gradient and runs the
        # optimizer once, so Adam's states exist from init
        return EngineInit(originals, d * partition, (4 * partition,), 0, lazy)
    if s.zero_stage == 0:
        return EngineInit(originals, 0, (), lazy)
    if s.zero_stage in (1, 2):
        return EngineInit(originals, d * partition, (4 * partition,), lazy)
    return EngineInit(originals, 0, (), lazy, zero3=zero3)

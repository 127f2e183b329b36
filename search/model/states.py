"""Bytes per GPU of one trained model's states as DeepSpeed lays them out, and DeepSpeed's working buffers.

Pure functions. ``T`` is trainable parameters, ``F`` frozen ones (LoRA's base model), ``N`` the
data-parallel world size, ``d`` the bytes of the compute dtype. The ZeRO layouts follow
``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py`` and agree with DeepSpeed's own estimators
(``estimate_zero2_model_states_mem_needs``, ``estimate_zero3_model_states_mem_needs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from search.coefficients import Coefficients
from search.model.shapes import largest_module_params, largest_trainable_tensor
from store.ds_buckets import ZeroBuckets
from store.ds_defaults import ZERO3_SUB_GROUP_SIZE
from store.records import DTYPE_BYTES, ModelSpec


@dataclass(frozen=True)
class ModelStates:
    """Where one trainable model's states live, in bytes per GPU (host bytes per GPU too)."""

    parameters: int  # 16-bit (fp32 when training in fp32) weights resident on the GPU
    gradients: int  # 16-bit gradients plus DeepSpeed's fp32 gradient partition
    optimizer_states: int  # fp32 master weights, Adam m and v
    zero3_gathered: int  # ZeRO-3: gathered parameters and their full gradients of the live module
    step_transient: int  # extra bytes only during the optimizer step
    host: int  # states offloaded to the host, per GPU, before pinned-buffer slack
    host_parameters: int = 0  # of ``host``: the 16-bit parameter partition offloaded to CPU memory
    host_nvme: int = 0  # of ``host``: ZeRO-Infinity's swap buffers of the states offloaded to NVMe

    @property
    def gpu_total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.zero3_gathered


def model_states(
    *,
    model: ModelSpec,
    trainable: int,
    frozen: int,
    dtype: str,
    zero_stage: int,
    offload_optimizer: str,
    offload_param: str,
    world_size: int,
    grad_accum: int,
    sub_group_size: int = ZERO3_SUB_GROUP_SIZE,
    frozen_bytes: int | None = None,
) -> ModelStates:
    """Model-state bytes per GPU for one trainable model under a ZeRO stage and offload choice (ZeRO-3 steps
    the optimizer ``sub_group_size`` elements at a time). ``frozen_bytes``: the frozen base's bytes when they are
    not ``d`` per parameter (QLoRA's quantized weights, :mod:`search.model.quantized`; ZeRO-0/1/2 only)."""
    d = DTYPE_BYTES[dtype]
    n = world_size
    t, f = trainable, frozen
    mixed = dtype != "fp32"
    offload_opt = offload_optimizer != "none"
    held = d * (t + f) if frozen_bytes is None else d * t + frozen_bytes  # ZeRO-0/1/2: every rank holds them
    if zero_stage == 0:
        # No ZeRO: FP16_Optimizer (bf16 too) keeps fp32 master, m, v; at step() it upcasts every 16-bit
        # grad to fp32 and flattens those copies (fused_optimizer.py step: _flatten_dense_tensors over
        # p.grad.to(fp32)), so 4T + 4T live beside the 16-bit grads. In fp32 the torch optimizer holds m, v.
        return ModelStates(
            parameters=held,
            gradients=d * t,
            optimizer_states=(12 if mixed else 8) * t,
            zero3_gathered=0,
            step_transient=(8 * t) if mixed else 0,
            host=0,
        )
    fp32_partition = 16 * t // n  # fp32 master copy, its gradient, Adam m and v
    if zero_stage in (1, 2):
        # ZeRO-1 keeps param.grad whole until the accumulation boundary; ZeRO-2 reduces every micro-step.
        full_lp_grads = zero_stage == 1 and grad_accum > 1
        lp_grads = d * t if full_lp_grads else d * t // n
        if offload_opt:
            return ModelStates(
                parameters=held,
                gradients=d * t if full_lp_grads else 0,
                optimizer_states=0,
                zero3_gathered=0,
                step_transient=0,
                host=fp32_partition,
            )
        # The reduced 16-bit partition (grads_in_partition) persists; its fp32 copy exists during step().
        return ModelStates(
            parameters=held,
            gradients=lp_grads,
            optimizer_states=12 * t // n,
            zero3_gathered=0,
            step_transient=4 * t // n,
            host=0,
        )
    # ZeRO-3: everything partitioned; the live module is gathered (params and full grads, 2 x d bytes).
    gathered = 2 * d * largest_module_params(model)
    lp_params = d * (t + f) // n
    # ZeRO-Infinity on NVMe keeps only swap buffers in host memory: a sub-group of optimizer states and
    # DeepSpeed's default parameter buffers (5 x 1e8 elements).
    host_optimizer = 16 * min(t // n, sub_group_size) if offload_optimizer == "nvme" else fp32_partition
    host_params = 5 * 100_000_000 * d if offload_param == "nvme" else lp_params
    nvme = (host_optimizer if offload_optimizer == "nvme" else 0) + (host_params if offload_param == "nvme" else 0)
    if offload_param != "none":
        on_cpu = host_params if offload_param == "cpu" else 0
        return ModelStates(
            parameters=0,
            gradients=0,
            optimizer_states=0,
            zero3_gathered=gathered,
            step_transient=0,
            host=host_optimizer + host_params,
            host_parameters=on_cpu,
            host_nvme=nvme,
        )
    if offload_opt:
        return ModelStates(
            parameters=lp_params,
            gradients=0,
            optimizer_states=0,
            zero3_gathered=gathered,
            step_transient=0,
            host=host_optimizer,
            host_parameters=0,
            host_nvme=nvme,
        )
    # The fp32 gradient exists only while its sub-group steps (stage3.py _prepare_fp32_grad_for_sub_group):
    # a flattened 16-bit copy and its fp32 upcast of at most sub_group_size elements.
    step_elements = min(t // n, sub_group_size)
    return ModelStates(
        parameters=lp_params,
        gradients=d * t // n,
        optimizer_states=12 * t // n,
        zero3_gathered=gathered,
        step_transient=(d + 4) * step_elements,
        host=0,
    )


# DeepSpeed's engine allreduces ZeRO-0 gradients in flattened buckets of this many elements
# (engine.py MEMORY_OPT_ALLREDUCE_SIZE, the default of buffered_allreduce_fallback), even on one rank.
ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
# stage3.py _constant_buffered_norm2 takes an offloaded gradient's norm in chunks of this many elements.
ZERO3_NORM_CHUNK_ELEMENTS = 250_000_000
FP64 = 8  # bytes: zero/utils.get_norm_dtype() is float64 wherever the accelerator has it (CUDA, CPU)


@dataclass(frozen=True)
class ZeroWorkspace:
    """DeepSpeed's working buffers around the model states, in bytes per GPU (host bytes per GPU too).

    ``ModelStates`` holds what DeepSpeed's estimators count; this holds the rest of what the engine and
    its ZeRO optimizer really allocate (``runtime/engine.py``, ``fp16/fused_optimizer.py``,
    ``zero/stage_1_and_2.py``, ``zero/stage3.py``), each with the moment it is live.
    """

    resident: int  # on the device for the whole run: communication buckets, offload staging buffers
    backward_buckets: int  # ZeRO-1/2 reduce buckets: setup_buckets() at the first gradient hook of a backward
    buckets_carried: bool  # ZeRO-1 with grad_accum > 1: the buckets live until the boundary's epilogue
    partition_grads: int  # ZeRO-1/2: 16-bit gradient partition made at the backward's epilogue, kept to step()
    carried_grads: int  # gradients alive between the micro-steps of one optimizer step (grad_accum > 1)
    grad_norm: int  # fp64 upcast of the largest gradient (piece) while DeepSpeed takes norms tensor by tensor
    norm_in_backward: bool  # offload: norms are taken as gradients are copied out, at the backward's end
    step_copies: int  # optimizer step: copies beyond ModelStates.step_transient (flattened 16-bit partition)
    allreduce_copy: int  # ZeRO-0: flattened 16-bit gradients of the allreduce after a boundary backward
    reduce_copy: int  # ZeRO-3: the largest module's full gradient plus its reduce-scatter buffer
    reduced: int  # ZeRO-3: the reduce-scatter buffer alone, once the full gradient is released
    host: int  # pinned host buffers beside the offloaded states (ModelStates.host), before any slack
    reduce_bucket: int = 0  # bytes of one ZeRO-1/2 reduce bucket tensor (backward_buckets is made of them)
    reuse_distance: int = 0  # ZeRO-3's max_reuse_distance (parameters), for what stays gathered (reuse.py)
    # overlap_comm: ZeRO's reductions run on their own stream beside the backward; off, on the compute stream
    comm_overlapped: bool = True


def zero_workspace(
    *,
    model: ModelSpec,
    trainable: int,
    dtype: str,
    zero_stage: int,
    offload_optimizer: str,
    world_size: int,
    grad_accum: int,
    lora_rank: int,
    lm_head: bool,
    coef: Coefficients,
    buckets: ZeroBuckets,
) -> ZeroWorkspace:
    """What DeepSpeed allocates around the states for one trainable model (see :class:`ZeroWorkspace`), with
    the config's bucket settings ``buckets`` (``store.ds_defaults.buckets_of``)."""
    d = DTYPE_BYTES[dtype]
    n = world_size
    t = trainable
    accumulating = grad_accum > 1
    offload_opt = offload_optimizer != "none"
    largest = largest_trainable_tensor(model, lora_rank, lm_head=lm_head)
    workspace = int(coef.cublas_workspace_bytes)
    if zero_stage == 0:
        return ZeroWorkspace(
            resident=workspace,
            backward_buckets=0,
            buckets_carried=False,
            partition_grads=0,
            carried_grads=d * t if accumulating else 0,  # param.grad accumulates across micro-steps
            grad_norm=0,
            norm_in_backward=False,
            step_copies=0,
            allreduce_copy=d * min(t, ALLREDUCE_BUCKET_ELEMENTS),
            reduce_copy=0,
            reduced=0,
            host=0,
        )
    if zero_stage in (1, 2):
        # setup_buckets(): one reduce_bucket_size buffer, two with overlap_comm (offload forces contiguous
        # gradients); released by _release_ipg_buffers() at the epilogue of every ZeRO-2 backward, and of
        # the boundary backward only under ZeRO-1 (engine.allreduce_gradients skips the others).
        bucket = d * buckets.reduce_bucket_size
        made = (2 if buckets.overlap_comm else 1) * bucket if (buckets.contiguous_gradients or offload_opt) else 0
        piece = min(largest, -(-t // n))
        if zero_stage == 1:
            carried = d * t if accumulating else 0  # param.grad, reduced only at the boundary
        else:
            carried = 0 if offload_opt or not accumulating else d * t // n  # grads_in_partition
        if offload_opt:
            # stage_1_and_2.py __init__: a 16-bit partition buffer and temp_grad_buffer_for_cpu_offload in
            # (pinned) host memory, temp_grad_buffer_for_gpu_offload on the device; with accumulation
            # accumulated_grads_in_cpu holds the partition's gradients on the host between micro-steps.
            host = d * t // n + d * largest + (d * t // n if accumulating else 0)
            return ZeroWorkspace(
                resident=workspace + d * largest,
                backward_buckets=made,
                buckets_carried=zero_stage == 1 and accumulating,
                partition_grads=0,
                carried_grads=carried,
                grad_norm=FP64 * piece,  # set_norm_for_param_grad_in_gpu in copy_grads_in_partition
                norm_in_backward=True,
                step_copies=0,
                allreduce_copy=0,
                reduce_copy=0,
                reduced=0,
                host=host,
                reduce_bucket=bucket,
                comm_overlapped=buckets.overlap_comm,
            )
        # step(): get_grad_norm_direct upcasts each gradient of the partition to fp64, then the 16-bit
        # partition is flattened (a copy) and upcast to fp32 (ModelStates.step_transient).
        return ZeroWorkspace(
            resident=workspace,
            backward_buckets=made,
            buckets_carried=zero_stage == 1 and accumulating,
            partition_grads=d * t // n,
            carried_grads=carried,
            grad_norm=FP64 * piece,
            norm_in_backward=False,
            step_copies=d * t // n,
            allreduce_copy=0,
            reduce_copy=0,
            reduced=0,
            host=0,
            reduce_bucket=bucket,
            comm_overlapped=buckets.overlap_comm,
        )
    # ZeRO-3: the reduce bucket is allocated at init and kept (stage3.py ipg_buckets); the prefetch bucket
    # bounds parameters gathered ahead, which one rank never gathers (all_gather_coalesced returns at once
    # when the partition world size is 1).
    resident = workspace + d * buckets.reduce_bucket_size + (d * buckets.prefetch_bucket_size if n > 1 else 0)
    piece = -(-largest // n)
    return ZeroWorkspace(
        resident=resident,
        backward_buckets=0,
        buckets_carried=False,
        partition_grads=0,
        carried_grads=0,  # gradients accumulate into the persistent partition buffer
        grad_norm=FP64 * (min(piece, ZERO3_NORM_CHUNK_ELEMENTS) if offload_opt else piece),
        norm_in_backward=offload_opt,
        step_copies=0,
        allreduce_copy=0,
        reduce_copy=d * largest + d * piece,
        reduced=d * piece,
        host=d * t // n if offload_opt else 0,  # grad_partitions_flat_buffer lives on the host with offload
        reuse_distance=buckets.max_reuse_distance,
        comm_overlapped=buckets.overlap_comm,
    )


def init_cached_bytes(
    *, trainable: int, resident: int, dtype: str, zero_stage: int, offload_param: str = "none"
) -> int:
    """Bytes of the model's own weights that DeepSpeed's engine init frees into torch's cache and that stay
    reserved (their segments are then shared with small long-lived tensors, so ``empty_cache`` cannot return
    them; only the step's activations, of similar sizes, reuse them). The search's screen adds them to a step's
    reserved bytes; each figure is at most what the allocator replay of the init keeps
    (:mod:`search.streams.init`, :func:`search.streams.build.build_stream`), so the screen's term is a lower
    bound of the replay's (``tests/search/test_screen_bound.py``).

    - ZeRO-1/2: the optimizer copies the trainable 16-bit weights into one flat buffer (stage_1_and_2.py
      ``torch.cat`` while the originals exist) and points each ``p.data`` at it: the originals, d x T, are
      freed. The other init transients (the 16-bit partition's clone, the fp32 zero gradient) are reused
      exactly by the same-sized ``grads_in_partition`` and Adam ``exp_avg`` of the first step.
    - ZeRO-0 with a 16-bit dtype: FP16_Optimizer (bf16 too) clones every weight, flattens the clones and frees
      them, then frees the originals (fused_optimizer.py): 2 x d x T.
    - ZeRO-3: 0. Under ``deepspeed.zero.Init`` (the HF Trainer, Accelerate, TRL, OpenRLHF, DeepSpeed-Chat:
      ``store.model_build``) weights are partitioned as they are made and nothing is freed. A model built whole
      first (memplan's own loop) frees every original weight while it is partitioned, but ``defragment``
      (stage3.py ``_create_fp16_partitions_with_defragmentation``) then calls ``empty_cache()``, which gives back
      every segment no partition still holds: what stays is only the part of the segments holding a frozen
      partition (LoRA's base), which the replay counts block by block and which is never below 0. (Counting
      ``d x resident`` here, as the screen once did, made it prune ZeRO-3 plans the replay fits: issue 42.)
      With the parameters offloaded the model is built on the host and its weights never occupy the GPU.
    """
    d = DTYPE_BYTES[dtype]
    if zero_stage == 3:
        return 0
    if zero_stage == 0:
        return 2 * d * trainable if dtype != "fp32" else 0
    return d * trainable

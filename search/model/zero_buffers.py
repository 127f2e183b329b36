"""What DeepSpeed allocates around one trained model's states: the cuBLAS workspace, the ZeRO reduce and prefetch
buckets, the gradients carried between micro-steps, the norm's upcasts, the copies of the step and the host
buffers of an offloaded optimizer (:class:`ZeroWorkspace`, :func:`zero_workspace`). The states themselves are
:mod:`search.model.states`.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.coefficients import Coefficients
from search.model.shapes import largest_trainable_tensor
from store.ds_buckets import ZeroBuckets
from store.records import DTYPE_BYTES, ModelSpec

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
        return _zero12_workspace(
            d,
            t,
            n,
            zero_stage=zero_stage,
            accumulating=accumulating,
            offload_opt=offload_opt,
            largest=largest,
            workspace=workspace,
            buckets=buckets,
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


def _zero12_workspace(
    d: int,
    t: int,
    n: int,
    *,
    zero_stage: int,
    accumulating: bool,
    offload_opt: bool,
    largest: int,
    workspace: int,
    buckets: ZeroBuckets,
) -> ZeroWorkspace:
    """ZeRO-1 and ZeRO-2's buffers around the states (:func:`zero_workspace`): the reduce buckets, the gradients
    carried between micro-steps, the norm's upcast, and the host buffers of an offloaded optimizer."""
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

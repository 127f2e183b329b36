"""The cost model of a single-model training step (sft, reward, dpo), read top to bottom.

A step is ``grad_accum`` micro-steps of forward and backward (DPO adds a no-grad reference forward
first), then one optimizer step. Each phase gets a peak allocated (live tensors), a peak reserved
(allocated plus the caching allocator's fragments) and a time. The step's peak is its largest phase.

A phase's peak allocated is the largest of a few moments, each the resident bytes plus what is live
then: the loss (fp32 copies of the logits), the top layer's backward, the last (embedding) gradient, the
gradient reduction's epilogue, the optimizer step's gradient copies. DeepSpeed's working buffers and when
they exist come from :func:`search.memory.zero_workspace`. Checked against CPU probes of tiny models
(``tests/probes/test_cost_model_accuracy.py``); :func:`predict_cpu_backend` is that view of a prediction.
"""

from __future__ import annotations

from search.coefficients import Coefficients
from search.memory import (
    LossLogits,
    activations,
    loss_logits,
    model_states,
    tied_embedding_extra,
    zero_workspace,
)
from search.prediction import PhasePrediction, Prediction
from search.shapes import forward_flops, lora_params, resident_params, token_embedding_params, trainable_params
from search.timing import (
    collective_time,
    compute_time,
    cpu_adam_time,
    empty_cache_time,
    gpu_adam_time,
    nvme_time,
    pcie_time,
    zero_comm_bytes,
)
from store.records import DTYPE_BYTES, Hardware, Strategy, Workload


def gpu_budget_bytes(hardware: Hardware, coef: Coefficients) -> int:
    """GPU bytes the caching allocator may reserve: total, less the safety margin and CUDA context."""
    usable = hardware.gpu_memory_bytes * (1.0 - hardware.safety_margin) - coef.cuda_context_bytes
    return max(0, int(usable))


def cpu_backend_coefficients(coef: Coefficients) -> Coefficients:
    """``coef`` for DeepSpeed's CPU accelerator: no CUDA context and no cuBLAS workspace exist there."""
    return coef.with_(cublas_workspace_bytes=0.0, cuda_context_bytes=0.0)


def predict_cpu_backend(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> Prediction:
    """The single-model prediction as DeepSpeed's CPU accelerator shows it (what the probes' CPU tracker counts).

    Two named differences from a GPU, nothing else: (1) no CUDA context or cuBLAS workspace
    (:func:`cpu_backend_coefficients`); (2) host and "device" are one memory, so offloaded optimizer
    states and their pinned buffers add to every phase's live bytes (:meth:`Prediction.on_cpu_backend`).
    """
    return predict_single_model(workload, strategy, hardware, cpu_backend_coefficients(coef)).on_cpu_backend()


def predict_cpu_allocated(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> int:
    """Peak live tensor bytes of one training step on DeepSpeed's CPU accelerator (one rank)."""
    return predict_cpu_backend(workload, strategy, hardware, coef).peak_allocated_bytes


def predict_single_model(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> Prediction:
    """Predicted peak memory per GPU, host memory per node and step time of one strategy."""
    model, s = workload.model, strategy
    d = DTYPE_BYTES[workload.dtype]
    n = hardware.world_size
    has_lm_head = workload.kind != "reward"
    sequences = s.micro_batch * workload.sequences_per_sample
    tokens = sequences * workload.seq_len
    notes: list[str] = []

    # --- model states ------------------------------------------------------------------------------
    trainable = trainable_params(model, s.lora_rank, lm_head=has_lm_head)
    resident = resident_params(model, s.lora_rank, lm_head=has_lm_head)
    states = model_states(
        model=model,
        trainable=trainable,
        frozen=resident - trainable,
        dtype=workload.dtype,
        zero_stage=s.zero_stage,
        offload_optimizer=s.offload_optimizer,
        offload_param=s.offload_param,
        world_size=n,
        grad_accum=s.grad_accum,
    )
    work = zero_workspace(
        model=model,
        trainable=trainable,
        dtype=workload.dtype,
        zero_stage=s.zero_stage,
        offload_optimizer=s.offload_optimizer,
        world_size=n,
        grad_accum=s.grad_accum,
        lora_rank=s.lora_rank,
        lm_head=has_lm_head,
        coef=coef,
    )
    # DPO's frozen reference: partitioned like the policy under ZeRO-3; with LoRA the policy's base
    # model with adapters disabled serves as the reference (TRL), so it costs nothing extra.
    reference = 0
    if workload.kind == "dpo" and s.lora_rank == 0:
        ref = workload.ref_model or model
        reference = d * ref.total_params // (n if s.zero_stage == 3 else 1)

    # --- activations and logits of one micro-batch ---------------------------------------------------
    acts = activations(
        model, sequences, workload.seq_len, workload.dtype, workload.attn_impl, s.gradient_checkpointing, coef
    )
    logits = loss_logits(model, sequences, workload.seq_len, workload.dtype, coef)
    if not has_lm_head:
        logits = LossLogits(0, 0, 0)
    working = int(coef.backward_working_layers * acts.layer)
    recompute = acts.layer if s.gradient_checkpointing else 0

    # --- phases: what is live at each phase's peak, the largest of a few moments ------------------------
    resident_bytes = {
        "parameters": states.parameters,
        "optimizer_states": states.optimizer_states,
        "reference_model": reference,
        "buffers": work.resident,
    }
    zero3, accumulating = s.zero_stage == 3, s.grad_accum > 1
    kept = states.gradients if zero3 else 0  # ZeRO-3's gradient partition buffer lives from init on
    steady = kept + work.carried_grads  # gradients alive before a micro-step starts (grad_accum > 1)
    carried_buckets = work.backward_buckets if work.buckets_carried else 0
    base = _moment(gradients=steady, buffers=carried_buckets)
    gathered_params = states.zero3_gathered // 2 if (zero3 and n > 1) else 0  # one rank never gathers
    # The last gradient of a backward is the token embedding's; a tied one is summed with the LM head's
    # contribution (kept since the head's backward) out of place. It is one tensor beside what is already
    # reduced (ZeRO-1/2 buckets, ZeRO-3 partitions) or beside the accumulated gradient (grad_accum > 1).
    embedding_grad = d * token_embedding_params(model) if s.lora_rank == 0 else 0
    tied = tied_embedding_extra(model, workload.dtype, s.lora_rank, has_lm_head)
    if s.zero_stage == 0:
        own = 1 if accumulating else 0
        # param.grad of the LM head (or the tied weight's share waiting in autograd), and of the top layer
        head = model.lm_head_params or token_embedding_params(model)
        head_grad = (d * head if has_lm_head else 0) + d * model.layer_params if not s.lora_rank else 0
    else:
        own = 1 + (1 if s.zero_stage == 1 and accumulating else 0)
        head_grad = tied // 2
    inflight = own * embedding_grad + tied
    moments: dict[str, list[dict[str, int]]] = {}
    if workload.kind == "dpo":
        moments["reference_forward"] = [
            _plus(base, activations=acts.forward_working, logits=logits.forward, zero3_gathered=gathered_params)
        ]
    # A checkpointed layer's forward keeps nothing for backward (non-reentrant checkpoint packs holders):
    # only its working tensors exist beside the checkpoints, as in a no-grad forward.
    layer_forward = acts.forward_working if s.gradient_checkpointing else 0
    moments["forward"] = [
        _plus(base, activations=acts.saved, logits=logits.forward),
        _plus(base, activations=acts.saved + layer_forward, zero3_gathered=gathered_params),
    ]
    backward = [
        _plus(base, activations=acts.saved, logits=logits.backward),  # the loss's backward
        _plus(  # the top layer's backward: ZeRO-1/2 buckets set up, the LM head's weight gradient formed
            base,
            gradients=head_grad,
            buffers=work.backward_buckets - carried_buckets,
            activations=acts.saved + working + recompute,
            logits=logits.held,
            zero3_gathered=gathered_params,
        ),
    ]
    if s.zero_stage == 0:
        backward.append(_moment(gradients=states.gradients + inflight, logits=logits.held))
        backward.append(_moment(gradients=states.gradients + work.allreduce_copy, logits=logits.held))
        step = [_moment(gradients=states.gradients + states.step_transient)]
    elif s.zero_stage in (1, 2):
        at_end = work.carried_grads if s.zero_stage == 2 else 0  # ZeRO-2: the previous micro-step's partition
        epilogue = work.grad_norm if work.norm_in_backward else work.partition_grads
        backward.append(_moment(gradients=at_end + inflight, buffers=work.backward_buckets, logits=logits.held))
        backward.append(_moment(gradients=epilogue, buffers=work.backward_buckets, logits=logits.held))
        step = [base]  # before the accumulation boundary engine.step() changes nothing
        if not work.norm_in_backward:
            copies = max(work.grad_norm, work.step_copies + states.step_transient)
            step.append(_moment(gradients=work.partition_grads + copies))
    else:
        embedding_params = embedding_grad if gathered_params else 0  # gathered for its own backward
        backward.append(_moment(gradients=kept + inflight, zero3_gathered=embedding_params, logits=logits.held))
        # reduce-scatter of the largest gradient: its flattened copy, then (offload) its fp64 norm once the
        # full gradient is released (stage3.py partition_grads / _offload_grad_partition_at_boundary)
        reducing = max(work.reduce_copy, work.reduced + (work.grad_norm if work.norm_in_backward else 0))
        backward.append(_moment(gradients=kept + reducing, logits=logits.held))
        step = [base]
        if not work.norm_in_backward:
            step.append(_moment(gradients=kept + max(work.grad_norm, states.step_transient)))
    moments["backward"] = backward
    moments["optimizer_step"] = step
    live = {name: max(options, key=lambda parts: sum(parts.values())) for name, options in moments.items()}
    phase_alloc = {name: sum(resident_bytes.values()) + sum(parts.values()) for name, parts in live.items()}
    transient = {name: max(0, sum(parts.values()) - steady) for name, parts in live.items()}

    # --- fragmentation: reserved minus allocated ----------------------------------------------------
    factor = 1.0
    if s.zero_stage == 3:
        factor *= coef.frag_zero3_factor
    if s.gradient_checkpointing:
        factor *= coef.frag_checkpointing_factor
    if s.offload_optimizer != "none" or s.offload_param != "none":
        factor *= coef.frag_offload_factor
    if s.allocator == "expandable-segments":
        factor *= coef.frag_expandable_factor
    largest_transient = max(transient.values())
    # Fragments of earlier steps survive unless the cache is emptied between steps or phases; the
    # reference forward's fragments survive into training unless emptied after inference (or phases).
    from_earlier_steps = 0.0 if s.empty_cache in ("every-step", "after-phase") else largest_transient
    from_inference = 0.0
    if "reference_forward" in transient and s.empty_cache not in ("after-inference", "after-phase"):
        from_inference = transient["reference_forward"]
    phase_reserved: dict[str, int] = {}
    for name, allocated in phase_alloc.items():
        carried = max(from_earlier_steps, from_inference if name != "reference_forward" else 0.0)
        fragments = factor * (coef.frag_within_step * transient[name] + coef.frag_carried * carried)
        phase_reserved[name] = allocated + int(fragments)

    # --- time ---------------------------------------------------------------------------------------
    flops_fwd = forward_flops(model, sequences, workload.seq_len, lm_head=has_lm_head)
    # full fine-tune: activation and weight gradients; LoRA: activation gradients and the adapters only
    lora_flops = 4.0 * lora_params(model, s.lora_rank) * tokens
    flops_bwd = flops_fwd + lora_flops if s.lora_rank else 2.0 * flops_fwd
    micro_time: dict[str, float] = {}
    if workload.kind == "dpo":
        micro_time["reference_forward"] = compute_time(flops_fwd, tokens, workload.dtype, hardware, coef)
    micro_time["forward"] = compute_time(flops_fwd, tokens, workload.dtype, hardware, coef)
    recompute_flops = flops_fwd if s.gradient_checkpointing else 0.0
    micro_time["backward"] = compute_time(flops_bwd + recompute_flops, tokens, workload.dtype, hardware, coef)

    passes = 3 if s.gradient_checkpointing else 2
    comm = collective_time(
        zero_comm_bytes(
            zero_stage=s.zero_stage,
            trainable=trainable,
            resident=resident,
            dtype=workload.dtype,
            world_size=n,
            grad_accum=s.grad_accum,
            passes=passes,
        ),
        hardware,
        coef,
    )
    offload = 0.0
    if s.offload_optimizer != "none":
        grads_down = 4 * trainable / n * (s.grad_accum if s.zero_stage >= 2 else 1)
        params_up = 4 * trainable / n
        offload += pcie_time(grads_down + params_up, hardware, coef)
        if s.offload_optimizer == "nvme" and s.zero_stage == 3:
            offload += nvme_time(2 * 16 * trainable / n * hardware.gpus, coef)
    if s.offload_param != "none":
        fetched = passes * d * resident / n * s.grad_accum
        offload += pcie_time(fetched, hardware, coef)
        if s.offload_param == "nvme":
            offload += nvme_time(fetched * hardware.gpus, coef)
    if s.offload_optimizer != "none":
        optimizer = cpu_adam_time(trainable // n, hardware, coef)
    else:
        optimizer = gpu_adam_time(trainable if s.zero_stage == 0 else trainable // n, hardware, coef)

    calls_per_step = {
        "never": 0.0,
        "after-generation": 0.0,
        "after-inference": float(s.grad_accum) if workload.kind == "dpo" else 0.0,
        "after-phase": float(len(micro_time) * s.grad_accum + 1),
        "every-step": 1.0,
    }[s.empty_cache]
    cache = empty_cache_time(calls_per_step, largest_transient, coef)
    overhead = coef.step_overhead_s * s.grad_accum
    step_time = s.grad_accum * sum(micro_time.values()) + comm + offload + optimizer + cache + overhead

    # --- assemble -----------------------------------------------------------------------------------
    peak_phase = max(phase_reserved, key=lambda name: (phase_reserved[name], phase_alloc[name]))
    phase_times = dict(micro_time, optimizer_step=optimizer)
    phases = tuple(
        PhasePrediction(
            name=name,
            peak_allocated_bytes=phase_alloc[name],
            peak_reserved_bytes=phase_reserved[name],
            time_s=phase_times[name] * (1 if name == "optimizer_step" else s.grad_accum),
            count=1 if name == "optimizer_step" else s.grad_accum,
        )
        for name in phase_alloc
    )
    peak_allocated = max(phase_alloc.values())
    peak_reserved = max(phase_reserved.values())
    breakdown = dict(resident_bytes)
    for name, value in live[peak_phase].items():
        breakdown[name] = breakdown.get(name, 0) + value
    breakdown["kv_cache"] = 0
    breakdown["fragmentation"] = phase_reserved[peak_phase] - phase_alloc[peak_phase]
    # Host memory per node: offloaded states with DeepSpeed's pinned-buffer slack, or, when larger, every
    # local rank loading its 16-bit copy of the model before deepspeed.initialize (ZeRO-3 builds it
    # partitioned under zero.Init).
    loading = hardware.gpus * d * resident // (n if s.zero_stage == 3 else 1)
    host = int(max(coef.host_buffer_factor * states.host * hardware.gpus, loading))
    if s.lora_rank and s.lora_rank * 8 > model.hidden_size:
        notes.append(f"LoRA rank {s.lora_rank} is large for hidden size {model.hidden_size}")
    return Prediction(
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=peak_reserved,
        gpu_budget_bytes=gpu_budget_bytes(hardware, coef),
        host_bytes=host,
        host_budget_bytes=hardware.cpu_memory_bytes,
        step_time_s=step_time,
        breakdown=breakdown,
        phases=phases,
        peak_phase=peak_phase,
        time_breakdown={
            "compute": s.grad_accum * sum(micro_time.values()),
            "communication": comm,
            "offload": offload,
            "optimizer": optimizer,
            "empty_cache": cache,
            "overhead": overhead,
        },
        notes=tuple(notes),
        host_states_bytes=states.host + work.host,
    )


LIVE_PARTS = ("gradients", "zero3_gathered", "activations", "logits", "buffers")


def _moment(**parts: int) -> dict[str, int]:
    """The bytes live beside the resident ones at one moment of a phase, named as in the JSON breakdown
    (``buffers`` here: DeepSpeed's buckets that exist only for a while)."""
    unknown = set(parts) - set(LIVE_PARTS)
    if unknown:
        raise ValueError(f"unknown live parts {sorted(unknown)}")
    return {name: int(parts.get(name, 0)) for name in LIVE_PARTS}


def _plus(moment: dict[str, int], **parts: int) -> dict[str, int]:
    """``moment`` with ``parts`` added."""
    extra = _moment(**parts)
    return {name: moment[name] + extra[name] for name in LIVE_PARTS}

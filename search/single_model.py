"""The cost model of a single-model training step (sft, reward, dpo), read top to bottom.

A step is ``grad_accum`` micro-steps of forward and backward (DPO adds a no-grad reference forward
first), then one optimizer step. Each phase gets a peak allocated (live tensors), a peak reserved
(allocated plus the caching allocator's fragments) and a time. The step's peak is its largest phase.

A phase's peak allocated is the largest of a few moments (:mod:`search.training_moments`), each the
resident bytes plus what is live then. Checked against CPU probes of tiny models
(``tests/probes/test_cost_model_accuracy.py``; :func:`search.predict.predict_cpu_backend` is that view).
"""

from __future__ import annotations

from search.coefficients import Coefficients
from search.memory import (
    LossLogits,
    activations,
    loss_logits,
    model_states,
    zero_workspace,
)
from search.prediction import PhasePrediction, Prediction
from search.shapes import forward_flops, lora_params, resident_params, trainable_params
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
from search.training_moments import Moment, largest, plus, training_moments
from store.records import DTYPE_BYTES, Hardware, Strategy, Workload


def gpu_budget_bytes(hardware: Hardware, coef: Coefficients) -> int:
    """GPU bytes the caching allocator may reserve: total, less the safety margin and CUDA context."""
    usable = hardware.gpu_memory_bytes * (1.0 - hardware.safety_margin) - coef.cuda_context_bytes
    return max(0, int(usable))


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
        ref = workload.model_for("reference")
        reference = d * ref.total_params // (n if s.zero_stage == 3 else 1)

    # --- activations and logits of one micro-batch ---------------------------------------------------
    acts = activations(
        model, sequences, workload.seq_len, workload.dtype, workload.attn_impl, s.gradient_checkpointing, coef
    )
    logits = loss_logits(model, sequences, workload.seq_len, workload.dtype, coef)
    if not has_lm_head:
        logits = LossLogits(0, 0, 0)

    # --- phases: what is live at each phase's peak, the largest of a few moments ------------------------
    resident_bytes = {
        "parameters": states.parameters,
        "optimizer_states": states.optimizer_states,
        "reference_model": reference,
        "buffers": work.resident,
    }
    training = training_moments(
        model=model,
        lm_head=has_lm_head,
        dtype=workload.dtype,
        zero_stage=s.zero_stage,
        lora_rank=s.lora_rank,
        gradient_checkpointing=s.gradient_checkpointing,
        grad_accum=s.grad_accum,
        world_size=n,
        states=states,
        work=work,
        acts=acts,
        logits=logits,
        backward_working=int(coef.backward_working_layers * acts.layer),
    )
    steady = training.steady
    moments: dict[str, list[Moment]] = {}
    if workload.kind == "dpo":
        moments["reference_forward"] = [
            plus(
                training.base,
                activations=acts.forward_working,
                logits=logits.forward,
                zero3_gathered=training.gathered_params,
            )
        ]
    moments.update(training.phases)
    live = {name: largest(options) for name, options in moments.items()}
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

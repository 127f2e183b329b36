"""The cost model of a single-model training step (sft, reward, dpo), read top to bottom.

A step is ``grad_accum`` micro-steps of forward and backward (DPO adds a no-grad reference forward
first), then one optimizer step. The steps are those of every workload: place the model's states
(:mod:`search.model.placement`), list each phase's moments (:mod:`search.model.moments`), time them
(:mod:`search.model.training_time`), then fragments and assembly (:mod:`search.step`) under the strategy's
``empty_cache`` policy and allocator. The actor and critic of an RLHF step go through the same pieces.

Checked against CPU probes of tiny models (``tests/probes/test_cost_model_accuracy.py``;
:func:`search.predictor.predict_cpu_backend` is that view).
"""

from __future__ import annotations

from functools import lru_cache

from search.coefficients import Coefficients
from search.model.fused_head import trl_fused_head
from search.model.kernels import gpu_attention
from search.model.micro_batch import MicroBatchContext
from search.model.moment_parts import Moment, NamedTensors, plus
from search.model.placement import TrainedPlacement, micro_step, trained_placement
from search.model.states import init_cached_bytes
from search.model.training_time import training_time
from search.prediction import Prediction
from search.single.host_memory import build_notes, host_memory
from search.single.loss_head import fused_head, head_tokens, model_loss, sft_holds_output
from search.spread.measured import with_measured_spread
from search.step.assemble import Step, screen_step
from search.step.finish import finish_step
from search.streams.init import engine_init
from search.streams.phases import OPTIMIZER, TRAINING, StepPhase, live_of, trained_factor
from search.streams.sizes import resident_sizes, sizes_of, training_sizes, weight_tensors
from search.streams.workspaces import backward_workspace
from store.errors import InputError
from store.frameworks import TRL_HEAD_OUTPUTS
from store.module_dropout import workload_as_run
from store.records import DTYPE_BYTES, Hardware, Strategy, TrainedModelStrategy, Workload
from store.workload_kinds import traits


def layout_of(strategy: Strategy) -> TrainedModelStrategy:
    """The per-model knobs of a single-model strategy: the layout an RLHF actor would have."""
    s = strategy
    return TrainedModelStrategy(
        s.zero_stage, s.offload_optimizer, s.offload_param, s.gradient_checkpointing, s.lora_rank, s.quantization
    )


def place(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> TrainedPlacement:
    """The trained model's states and buffers (a reward model trains a scalar head, not the LM head)."""
    lm_head = not traits(workload.kind).scalar_head
    world = hardware.world_size
    return trained_placement(
        workload.model,
        lm_head,
        layout_of(strategy),
        workload.dtype,
        world_size=world,
        grad_accum=strategy.grad_accum,
        coef=coef,
        ds_buckets=strategy.ds_buckets,
    )


def reference_bytes(workload: Workload, strategy: Strategy, hardware: Hardware) -> int:
    """DPO's frozen reference: partitioned like the policy under ZeRO-3; with LoRA the policy's base model
    with adapters disabled serves as the reference (TRL), so it costs nothing extra."""
    if not traits(workload.kind).reference_forward or strategy.lora_rank:
        return 0
    n = hardware.world_size if strategy.zero_stage == 3 else 1
    return DTYPE_BYTES[workload.dtype] * workload.model_for("reference").total_params // n


def micro_batch_of(
    workload: Workload, strategy: Strategy, coef: Coefficients, hardware: Hardware | None = None
) -> MicroBatchContext:
    """One micro-batch of the trained model (:class:`search.model.micro_batch.MicroBatchContext`): what the
    step's moments, tensor sizes and seconds are priced on; its attention is the kernel sdpa picks on
    ``hardware``'s GPU (:func:`search.model.kernels.attention_impl`)."""
    # sft: HF Trainer's training_step and TRL's SFTTrainer drop the model output before the backward; the
    # DPO and reward losses here keep it (their log-probs and values come from it)
    holds_output = not traits(workload.kind).causal_lm_loss or sft_holds_output(workload.framework)
    return MicroBatchContext(
        sequences=strategy.micro_batch * workload.sequences_per_sample,
        seq_len=workload.seq_len,
        dtype=workload.dtype,
        attn_impl=gpu_attention(workload.attn_impl, workload.dtype, hardware, workload.model.head_dim),
        coef=coef,
        loss=model_loss(workload, strategy),
        head=fused_head(workload, strategy),
        holds_output=holds_output,
    )


def phase_moments(
    workload: Workload, strategy: Strategy, placed: TrainedPlacement, batch: MicroBatchContext
) -> tuple[dict[str, list[Moment]], int, dict[str, tuple[NamedTensors, ...]]]:
    """The candidate peak moments of every phase of ``batch`` (:func:`micro_batch_of`), in step order, the
    bytes steady between micro-steps, and the tensors each moment holds by name
    (:data:`search.model.moments.NamedTensors`)."""
    implies = traits(workload.kind)
    head = batch.head
    micro = micro_step(placed, batch)
    training = micro.moments
    moments: dict[str, list[Moment]] = {}
    if implies.reference_forward and head is not None:
        # TRL's DPOTrainer._compute_loss (dpo_trainer.py): the policy's forward first, then the reference's
        # under no_grad, both through the fused head, and the backward last: the reference runs beside the
        # policy's saved activations and its head's saved hidden copy and vectors.
        # the reference's head (add_fused_lm_head(self.ref_model): log_probs only; with LoRA the policy's own)
        outputs = TRL_HEAD_OUTPUTS[workload.kind] if strategy.lora_rank else ("log_probs",)
        reference_head = trl_fused_head(
            workload.model_for("reference"),
            head_tokens(workload, strategy),
            workload.dtype,
            head_trainable=False,
            outputs=outputs,
        )
        reference = plus(
            training.base,
            activations=micro.acts.saved + micro.acts.forward_working,
            logits=head.hidden_copy + head.vectors + reference_head.forward,
            zero3_gathered=training.gathered_params,
        )
        moments["forward"] = training.phases["forward"]
        moments["reference_forward"] = [reference]
    elif implies.reference_forward:
        reference = plus(
            training.base,
            activations=micro.acts.forward_working,
            logits=micro.logits.forward,
            zero3_gathered=training.gathered_params,
        )
        moments["reference_forward"] = [reference]
    moments.update(training.phases)
    named = {name: training.named_of(name) if name in training.phases else () for name in moments}
    return moments, training.steady, named


def _phases(
    workload: Workload,
    s: Strategy,
    placed: TrainedPlacement,
    batch: MicroBatchContext,
    optimizer_s: float,
    per_micro_step: dict[str, float],
    coef: Coefficients,
) -> list[StepPhase]:
    """The step's phases: each one's moments, its fragmentation multiplier and what it leaves cached."""
    moments, steady, named = phase_moments(workload, s, placed, batch)
    trained_sizes = training_sizes(placed, batch)
    phases: list[StepPhase] = []
    for name, options in moments.items():
        inference = name == "reference_forward"
        in_step = name == "optimizer_step"
        phases.append(
            StepPhase(
                name=name,
                group=OPTIMIZER if in_step else TRAINING,
                moments=tuple(live_of(parts, steady) for parts in options),
                factor=trained_factor(placed, coef, training=not inference),
                carry=coef.frag_inference_carried if inference else coef.frag_carried,
                time_s=optimizer_s if in_step else per_micro_step[name] * s.grad_accum,
                count=1 if in_step else s.grad_accum,
                sizes=trained_sizes,
                moment_named=named[name],
            )
        )
    return phases


def single_step(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> Step:
    """Everything about the strategy's step except its ``empty_cache`` policy and allocator."""
    s, model = strategy, workload.model
    # --- place states --------------------------------------------------------------------------------
    placed = place(workload, s, hardware, coef)
    states, work = placed.states, placed.work
    resident = {
        "parameters": states.parameters,
        "optimizer_states": states.optimizer_states,
        "reference_model": reference_bytes(workload, s, hardware),
        "buffers": work.resident,
        **backward_workspace(coef),
    }
    # --- time --------------------------------------------------------------------------------------------
    batch = micro_batch_of(workload, s, coef, hardware)
    seconds = training_time(
        placed,
        micro_batch=batch.sequences,
        grad_accum=s.grad_accum,
        seq_len=batch.seq_len,
        dtype=batch.dtype,
        hardware=hardware,
        coef=coef,
        loss=batch.loss,
    )
    per_micro_step = {"forward": seconds.forward, "backward": seconds.backward}
    implies = traits(workload.kind)
    if implies.reference_forward:
        per_micro_step = {"reference_forward": seconds.forward, **per_micro_step}
        seconds.terms["reference_forward"] = seconds.forward * s.grad_accum
    # --- phases: each one's moments, its fragmentation multiplier and what it leaves cached -------------
    phases = _phases(workload, s, placed, batch, seconds.optimizer, per_micro_step, coef)
    time = {
        "compute": s.grad_accum * sum(per_micro_step.values()),
        "communication": seconds.communication,
        "offload": seconds.offload,
        "optimizer": seconds.optimizer,
        "overhead": coef.step_overhead_s * s.grad_accum,
    }
    host, partitioned = host_memory(workload, s, placed, hardware, coef)
    notes = build_notes(workload, s, partitioned)
    return Step(
        resident=resident,
        phases=tuple(phases),
        repeats={TRAINING: s.grad_accum, OPTIMIZER: 1},
        host=host,
        host_states=states.host + work.host,
        time=time,
        time_terms=dict(seconds.terms, overhead=coef.step_overhead_s * s.grad_accum),
        init_cached=init_cached_bytes(
            trainable=placed.trainable,
            resident=placed.resident,
            dtype=workload.dtype,
            zero_stage=s.zero_stage,
            offload_param=s.offload_param,
        ),
        notes=tuple(notes),
        resident_sizes=sizes_of(
            parameters=resident_sizes(
                model,
                workload.dtype,
                s.lora_rank,
                flat=s.zero_stage in (1, 2) and not s.lora_rank,
                quantization=s.quantization if s.zero_stage != 3 else "none",
            ),
            optimizer_states=(states.optimizer_states // 3,),
            reference_model=weight_tensors(workload.model_for("reference"), workload.dtype),
        ),
        engines=(
            (
                "optimizer_step",
                states.parameters,
                states.optimizer_states,
                engine_init(
                    placed, workload.dtype, hardware.gpu_memory_bytes, workload.framework, workload.model_build
                ),
                weight_tensors(model, workload.dtype, s.lora_rank, s.quantization, s.zero_stage),
            ),
        ),
    )


def checked_step(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> Step:
    """The strategy's step, once the strategy is known to apply to the workload."""
    if strategy.loss != "hf" and not traits(workload.kind).causal_lm_loss:
        raise InputError(
            f"strategy: loss {strategy.loss!r} applies to sft (the causal LM's cross-entropy); "
            f'{workload.kind} computes its loss otherwise: use loss "hf"'
        )
    if strategy.loss != "hf" and model_loss(workload, strategy) == "trl":
        # trl/trainer/sft_trainer.py: liger_kernel_config={"fused_linear_cross_entropy": True} raises ValueError
        raise InputError(
            f"strategy: TRL computes the loss with its own fused log-prob head; loss {strategy.loss!r} (Liger's fused "
            'linear cross-entropy) is refused by its trainers: use loss "hf" with --framework trl'
        )
    if strategy.empty_cache != "never" or strategy.allocator != "default":
        strategy = strategy.with_(empty_cache="never", allocator="default")
    return _policy_free_step(workload, strategy, hardware, coef)


@lru_cache(maxsize=4096)
def _policy_free_step(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> Step:
    """One Step for every ``empty_cache`` policy and allocator of a strategy (a Step holds neither), of the
    models as the framework runs them (TRL's ``disable_dropout``: ``store.module_dropout.workload_as_run``)."""
    return single_step(workload_as_run(workload), strategy, hardware, coef)


@lru_cache(maxsize=4096)  # a search's confirmation and the report ask for the same plan again
def predict_single_model(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> Prediction:
    """Predicted peak memory per GPU, host memory per node and step time of one strategy (peak reserved from
    the allocator replay of its step)."""
    step = checked_step(workload, strategy, hardware, coef)
    prediction = finish_step(step, strategy.empty_cache, strategy.allocator, hardware, coef)
    return with_measured_spread(prediction, workload, strategy, hardware, coef)


def screen_single_model(workload: Workload, strategy: Strategy, hardware: Hardware, coef: Coefficients) -> Prediction:
    """The search's screen of one strategy: as :func:`predict_single_model`, peak reserved from the fragment
    coefficients (:func:`search.step.assemble.screen_step`)."""
    step = checked_step(workload, strategy, hardware, coef)
    return screen_step(step, strategy.empty_cache, strategy.allocator, hardware, coef)

"""The single-model probe step (sft, reward, dpo): one engine (DPO: and its reference), real phases.

A step is ``grad_accum`` micro-steps, each a ``forward`` (DPO: a no-grad ``reference_forward`` first) and
a ``backward``, and ``engine.step()`` after each backward in ``optimizer_step`` (DeepSpeed steps the
optimizer at the accumulation boundary; the last call also ends the step for ``every-step``):

- sft: the causal LM's loss on ``micro_batch`` random sequences of ``seq_len`` tokens (labels = inputs);
  the model's output stays alive through the backward, as in DeepSpeed-Chat's step-1 loop;
- reward: a value model (backbone + scalar head) scores ``micro_batch`` pairs (2 x micro_batch
  sequences) at the last token; the pairwise loss ``-log sigmoid(chosen - rejected)``;
- dpo: sequence log-probabilities of the pairs under the policy and the frozen reference, the DPO loss
  (beta 0.1). The reference is its own engine with the eval config TRL derives from the policy's
  (ZeRO-3 stays ZeRO-3, anything else runs at stage 0); with LoRA it is the policy with its adapters
  switched off, as TRL does (and as the cost model counts: no extra copy).
"""

from __future__ import annotations

from typing import Any

from launch.ds_config import render_ds_config
from probes.model.build import (
    ProbePlan,
    build_causal_lm,
    build_value_model,
    frozen_config_like,
    init_engine,
    prepare_trained,
    torch_dtype,
)
from probes.model.logprobs import token_logprobs
from probes.model.quantize import quantize_linears
from probes.step.phases import PhaseClock
from store.records import Strategy
from store.workload_kinds import traits

DPO_BETA = 0.1


def build_device(device: str, offload_param: str) -> str:
    """Where to build a model: on the device, except parameters offloaded to the host start there."""
    return "cpu" if offload_param != "none" else device


class SingleModelRun:
    """Models and engines of one single-model probe; :meth:`step` runs one optimizer step's phases."""

    def __init__(self, plan: ProbePlan, extra: dict[str, Any]) -> None:
        import torch

        strategy = plan.strategy
        assert isinstance(strategy, Strategy)
        workload = plan.workload
        self.plan, self.strategy, self.workload = plan, strategy, workload
        self.device = plan.device
        self.attn_impl = extra.get("attn_impl", workload.attn_impl)
        where = build_device(plan.device, strategy.offload_param)
        self.config = render_ds_config(strategy, workload, plan.hardware)
        torch.manual_seed(0)
        quantized = strategy.quantization != "none"
        built_on = "cpu" if quantized else where  # QLoRA: quantized weight by weight from the host, as loaded
        if traits(workload.kind).scalar_head:
            model = build_value_model(workload.model, workload.dtype, self.attn_impl, built_on)
        else:
            model = build_causal_lm(workload.model, workload.dtype, self.attn_impl, built_on)
        adapter_dtype = None
        if quantized:
            adapter_dtype = torch_dtype(workload.dtype)
            on_host = strategy.offload_param != "none"
            extra["quantized_linears"] = quantize_linears(
                model,
                strategy.quantization,
                adapter_dtype,
                device=plan.device,
                zero_stage=strategy.zero_stage,
                on_host=on_host,
            )
            model.to(where)  # the 16-bit rest
        extra.update(prepare_trained(model, strategy.gradient_checkpointing, strategy.lora_rank, adapter_dtype))
        self.engine = init_engine(model, self.config, trained=True)
        self.engine.train()
        self.reference = None
        if traits(workload.kind).reference_forward and strategy.lora_rank == 0:
            torch.manual_seed(1)
            ref = build_causal_lm(workload.model_for("reference"), workload.dtype, self.attn_impl, where)
            ref.requires_grad_(False)
            self.reference = init_engine(ref, frozen_config_like(self.config), trained=False)
            self.reference.eval()
        extra["dpo_reference"] = (
            None
            if not traits(workload.kind).reference_forward
            else ("own engine" if self.reference is not None else "policy without LoRA")
        )
        extra["engines"] = {"model": type(self.engine).__name__}
        if self.reference is not None:
            extra["engines"]["reference"] = type(self.reference).__name__
        self.generator = torch.Generator(device=self.device).manual_seed(1234)
        self.vocab = workload.model.vocab_size

    def _batch(self) -> Any:
        import torch

        rows = self.strategy.micro_batch * self.workload.sequences_per_sample
        shape = (rows, self.workload.seq_len)
        low = min(3, self.vocab - 1)
        return torch.randint(low, self.vocab, shape, generator=self.generator, device=self.device)

    def step(self, clock: PhaseClock) -> None:
        """One optimizer step: ``grad_accum`` micro-steps of the workload's phases."""
        accum = self.strategy.grad_accum
        for micro in range(accum):
            ids = self._batch()
            ref_logp = self._reference_forward(clock, ids) if traits(self.workload.kind).reference_forward else None
            with clock.phase("forward"):
                outputs, loss = self._forward(ids, ref_logp)
            with clock.phase("backward"):
                self.engine.backward(loss)
            del outputs, loss
            with clock.phase("optimizer_step"):
                self.engine.step()
                if micro == accum - 1:
                    clock.end_step()

    def _reference_forward(self, clock: PhaseClock, ids: Any) -> Any:
        import torch

        from probes.model.lora import adapters_disabled

        with clock.phase("reference_forward"), torch.no_grad():
            if self.reference is not None:
                logits = self.reference(input_ids=ids, use_cache=False).logits
            else:
                with adapters_disabled(self.engine.module):
                    logits = self.engine(input_ids=ids, use_cache=False).logits
            return token_logprobs(logits, ids).sum(-1)

    def _forward(self, ids: Any, ref_logp: Any) -> tuple[Any, Any]:
        """(the outputs kept alive through the backward, the loss)."""
        import torch.nn.functional as F

        kind, pairs = traits(self.workload.kind), self.strategy.micro_batch
        if kind.causal_lm_loss and self.strategy.loss == "chunked":
            from probes.model.chunked_loss import causal_lm_hidden_states, chunked_causal_lm_loss, output_head

            module = self.engine.module
            hidden = causal_lm_hidden_states(module, ids)
            return None, chunked_causal_lm_loss(hidden, output_head(module), ids, self.workload.model.vocab_size)
        if kind.causal_lm_loss:
            # as HF Trainer's training_step and TRL's SFTTrainer: only the loss outlives the forward
            loss = self.engine(input_ids=ids, labels=ids, use_cache=False).loss
            return None, loss
        if kind.scalar_head:
            values = self.engine(ids).float()[:, -1]
            loss = -F.logsigmoid(values[:pairs] - values[pairs:]).mean()
            return values, loss
        outputs = self.engine(input_ids=ids, use_cache=False)
        logp = token_logprobs(outputs.logits, ids).sum(-1)
        margin = (logp[:pairs] - ref_logp[:pairs]) - (logp[pairs:] - ref_logp[pairs:])
        loss = -F.logsigmoid(DPO_BETA * margin).mean()
        return outputs, loss

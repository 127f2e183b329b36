"""The loss and LM head a single-model program runs: the model output it keeps, TRL's fused head or the
strategy's loss, and the tokens through that head (read by :mod:`search.single.predict`)."""

from __future__ import annotations

from search.model.fused_head import FusedHead, scored_tokens, workload_head
from store.frameworks import TRL_FUSED_HEAD_WORKLOADS
from store.records import Strategy, Workload

__all__ = ["fused_head", "head_tokens", "model_loss", "sft_holds_output"]


def sft_holds_output(framework: str) -> bool:
    """Whether the program keeps the model output (its logits) alive through an sft backward. DeepSpeed-Chat's
    step 1 does: ``outputs = model(**batch, use_cache=False); loss = outputs.loss; model.backward(loss)``
    (microsoft/DeepSpeedExamples, applications/DeepSpeed-Chat/training/step1_supervised_finetuning/main.py);
    the Trainer (and TRL, accelerate and memplan's own loop as it documents it) keep only the loss."""
    return framework == "deepspeed-chat"


def model_loss(workload: Workload, strategy: Strategy) -> str:
    """The loss the program runs: ``"trl"`` where TRL's trainer replaces the LM head by its fused log-prob head
    (``store.frameworks.TRL_FUSED_HEAD_WORKLOADS``), else the strategy's loss knob."""
    if workload.framework == "trl" and workload.kind in TRL_FUSED_HEAD_WORKLOADS:
        return "trl"
    return strategy.loss


def fused_head(workload: Workload, strategy: Strategy) -> FusedHead | None:
    """TRL's fused head of one micro-batch of the trained model (None where the program computes logits):
    the LM head's weight trains in a full fine-tune (LoRA's adapters leave it frozen)."""
    sequences = strategy.micro_batch * workload.sequences_per_sample
    return workload_head(workload, strategy.lora_rank, sequences, workload.seq_len)


def head_tokens(workload: Workload, strategy: Strategy) -> int:
    """Tokens one micro-batch puts through TRL's fused head (``search.model.fused_head.scored_tokens``)."""
    return scored_tokens(workload.kind, strategy.micro_batch * workload.sequences_per_sample, workload.seq_len)

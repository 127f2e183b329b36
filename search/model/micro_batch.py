"""One micro-batch of a trained model's step: the values that travel together from a step's cost model into
the model-level pieces that price a micro-step (:func:`search.model.placement.micro_step`,
:func:`search.streams.sizes.training_sizes`, :func:`search.rlhf.memory.training_live`).

The single-model step (:mod:`search.single.predict`) makes one from its workload and strategy; an RLHF step
makes one per trained model (:func:`search.rlhf.models.role_micro_batch`), as :class:`search.rlhf.job.RLHFContext`
carries the rest of an RLHF step.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.coefficients import Coefficients
from search.model.fused_head import FusedHead


@dataclass(frozen=True)
class MicroBatchContext:
    """``sequences`` sequences of ``seq_len`` tokens through a trained model in ``dtype`` under ``attn_impl``,
    priced with ``coef``; hashed by value (a cache key of the pieces it reaches).

    ``loss``: ``"hf"`` or ``"chunked"`` (the strategy's loss knob), or ``"trl"`` where TRL's fused log-prob head
    replaces the LM head; ``head``: that head's tensors (None where the program computes the logits);
    ``holds_output``: the training loop keeps the model output (its logits) alive through the backward;
    ``policy``: an RLHF actor, whose loss is built on the token log-probs of the model output instead of
    transformers' loss."""

    sequences: int
    seq_len: int
    dtype: str
    attn_impl: str
    coef: Coefficients
    loss: str = "hf"
    head: FusedHead | None = None
    holds_output: bool = True
    policy: bool = False

"""The mechanisms that set how far a prediction of peak reserved memory can be off: a plan's (or a record's) kind.

Each mechanism is one the stored GPU records were under-predicted by (issue 46): the ZeRO stage (ZeRO-3 gathers
and frees parameters of many sizes), offload (the offloaded init and the reduction stream's partition copies),
gradient checkpointing (without it the layer forward's temporaries fill the holes the backward needs), a large
vocabulary (the logits, the loss's fp32 upcast and the LM head's gradient are the step's largest tensors) and an
RLHF step (generation's KV cache and the inference phases' fragments). RLHF plans take the actor's layout.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from store.records import RLHFStrategy, Strategy, Workload

# Vocabularies from here up make the logits the largest activation of a step: Llama-3's 128,256, Qwen2's 151,936
# and Gemma-3's 262,144 tokens against OPT's 50,272 and Llama-2's 32,000 (at 12 bytes per b*s*vocab element in
# the loss, coef.logits_peak_bytes, 150k tokens is 1.8 MB per token against a 1.5B model's few hundred kB of
# activations per layer).
LARGE_VOCAB = 100_000


@dataclass(frozen=True)
class SpreadKind:
    """The mechanisms of one plan or record; two kinds are as far apart as the number of mechanisms they differ in."""

    zero_stage: int
    offload: str  # "none", "optimizer" or "optimizer+param"
    checkpointing: bool
    large_vocab: bool  # vocabulary of LARGE_VOCAB tokens or more
    rlhf: bool  # an RLHF step (generation, scoring and training phases)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape (``residuals.json`` rows and a plan's ``reserved_spread_basis.kind``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpreadKind:
        """The kind a ``to_dict`` document holds."""
        return cls(
            zero_stage=int(data["zero_stage"]),
            offload=str(data["offload"]),
            checkpointing=bool(data["checkpointing"]),
            large_vocab=bool(data["large_vocab"]),
            rlhf=bool(data["rlhf"]),
        )

    def differs(self, other: SpreadKind) -> tuple[str, ...]:
        """The mechanisms in which ``other`` is not this kind, in field order."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name))


def _offload(optimizer: str, param: str) -> str:
    if param != "none":
        return "optimizer+param"
    return "optimizer" if optimizer != "none" else "none"


def kind_of(workload: Workload, strategy: Strategy | RLHFStrategy) -> SpreadKind:
    """The mechanisms ``strategy`` runs ``workload`` with (RLHF: the actor's layout)."""
    layout = strategy.actor if isinstance(strategy, RLHFStrategy) else strategy
    return SpreadKind(
        zero_stage=layout.zero_stage,
        offload=_offload(layout.offload_optimizer, layout.offload_param),
        checkpointing=layout.gradient_checkpointing,
        large_vocab=workload.model.vocab_size >= LARGE_VOCAB,
        rlhf=isinstance(strategy, RLHFStrategy),
    )

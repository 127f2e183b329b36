"""TRL 1.16's fused LM head: per-token log-probs in tiles, never the ``(batch, seq, vocab)`` logits.

SFTTrainer, DPOTrainer and GRPOTrainer patch the trained model (and DPO's/GRPO's reference) with
``trl.trainer.utils.add_fused_lm_head`` and call it with ``fused_lm_head=True``. The patched forward runs the
backbone, takes ``hidden_states = last_hidden_state[:, :-1]`` (a view) and hands
``trl.kernels.chunked_logprob.ChunkedLogProbFunction`` the hidden states of the positions whose shifted label
is not ``-100`` (``hidden_states[mask]``: on CUDA, where Triton runs, only those are scored; the index makes a
copy). What that function holds, read from its code (bytes for ``N`` scored tokens, hidden size ``H``,
vocabulary ``V``, compute dtype of ``d`` bytes):

- forward: seven fp32 running statistics of ``N`` (``running_max``, ``sum_exp``, ``x_sum_exp``, ``sq_sum_exp``,
  ``z_sum``, ``max_before_target``, ``target_logit``) and one projection tile ``mm_buf`` of
  ``min(N, TOKEN_CHUNK_SIZE) x chunk_size`` elements in the compute dtype, with ``chunk_size =
  _CHUNKED_LOGPROB_CHUNK_SIZE = 32768`` columns whatever the vocabulary; then ``log_z``, ``logprobs`` and each
  requested output (fp32 of ``N``; ``is_top1`` bool). ``ctx.save_for_backward`` keeps the compact hidden
  copy (``N x H x d``), ``log_z`` and the entropy until the head's backward.
- backward: ``grad_hidden`` (fp32 ``N x H``, accumulated in fp32 whatever the inputs), ``grad_weight`` (fp32
  ``V x H``, only when the LM head's weight trains: a full fine-tune; LoRA leaves it frozen), a new tile, and
  at ``return`` their casts to the compute dtype (``N x H x d``, ``V x H x d``; no copy in fp32) while the
  fp32 ones are still referenced. On CUDA with torch >= 2.8 ``_addmm_fp32`` accumulates with
  ``out_dtype=torch.float32``, no fp32 copies of the tile or the weight slice.

Nothing of the head is held through the rest of the backward (``LossLogits.held`` is 0): the saved hidden copy
goes with the head's own backward, the first one of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.model.activations import LossLogits
from store.frameworks import TRL_FUSED_HEAD_WORKLOADS, TRL_HEAD_OUTPUTS
from store.records import DTYPE_BYTES, ModelSpec, Workload
from store.workload_kinds import traits

TOKEN_CHUNK_SIZE = 4096  # trl/kernels/chunked_logprob.py: tokens per projection tile
VOCAB_CHUNK_SIZE = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: the tile's columns (chunk_size)
RUNNING_STATISTICS = 7  # fp32 vectors of N the forward folds each tile into
FP32 = 4
# ChunkedLogProbFunction's forward always returns logprobs and keeps log_z; each requested output adds a vector
OUTPUT_BYTES = {"log_probs": FP32, "entropy": FP32, "log_sum_sq_probs": FP32, "mean_logits": FP32, "is_top1": 1}


def scored_tokens(kind: str, sequences: int, seq_len: int, gen_len: int | None = None) -> int:
    """Tokens the fused head scores in one forward of ``sequences`` sequences: positions whose shifted label
    is not ``-100``. A kind that generates (GRPO) labels only the completion (``labels[:, :-logits_to_keep] =
    -100``, grpo_trainer.py ``_get_per_token_logps_and_entropies``); SFT and DPO label the completion too, but a
    workload does not say where the prompt ends, so every shifted position counts (the most the head scores)."""
    shifted = seq_len - 1
    if traits(kind).generates and gen_len:
        shifted = min(shifted, gen_len)
    return sequences * max(1, shifted)


@dataclass(frozen=True)
class FusedHead:
    """The tensors of TRL's fused head for one micro-batch, in bytes (see the module docstring)."""

    hidden_copy: int  # hidden_states[mask], saved for backward
    tile: int  # mm_buf, forward and backward each make one
    vectors: int  # the forward's fp32 statistics and outputs of N tokens
    saved_vectors: int  # log_z and the entropy, saved for backward
    grad_hidden: int  # fp32 accumulator
    grad_weight: int  # fp32 accumulator of the LM head's weight (0 when it does not train)
    casts: int  # both gradients cast to the compute dtype at return (0 in fp32)

    @property
    def forward(self) -> int:
        """Bytes while the head's forward runs its last tile."""
        return self.hidden_copy + self.tile + self.vectors

    @property
    def backward(self) -> int:
        """Bytes at the head backward's ``return``: saved tensors, accumulators, the tile and the casts."""
        return self.hidden_copy + self.saved_vectors + self.tile + self.grad_hidden + self.grad_weight + self.casts

    def sizes(self) -> tuple[int, ...]:
        """The tensors in the order the head makes them (the allocation stream's pattern for ``logits``)."""
        made = (self.hidden_copy, self.tile, self.grad_hidden, self.grad_weight, self.casts)
        return tuple(size for size in made if size > 0)


@lru_cache(maxsize=4096)
def trl_fused_head(
    model: ModelSpec, tokens: int, dtype: str, *, head_trainable: bool, outputs: tuple[str, ...] = ("log_probs",)
) -> FusedHead:
    """TRL's fused head over ``tokens`` scored tokens (:func:`scored_tokens`) of ``model`` in ``dtype``;
    ``head_trainable``: the LM head's weight gets a gradient (a full fine-tune); ``outputs``: the per-token
    outputs the trainer asks for (``store.frameworks.TRL_HEAD_OUTPUTS``)."""
    d = DTYPE_BYTES[dtype]
    n, h, v = tokens, model.hidden_size, model.vocab_size
    tile = min(n, TOKEN_CHUNK_SIZE) * VOCAB_CHUNK_SIZE * d
    vectors = RUNNING_STATISTICS * FP32 * n + FP32 * n  # the statistics, log_z
    vectors += sum(OUTPUT_BYTES[name] for name in dict.fromkeys(("log_probs", *outputs))) * n
    saved = FP32 * n * (2 if "entropy" in outputs else 1)
    grad_weight = FP32 * v * h if head_trainable else 0
    casts = 0 if d == FP32 else d * n * h + (d * v * h if head_trainable else 0)
    return FusedHead(
        hidden_copy=d * n * h,
        tile=tile,
        vectors=vectors,
        saved_vectors=saved,
        grad_hidden=FP32 * n * h,
        grad_weight=grad_weight,
        casts=casts,
    )


def workload_head(workload: Workload, lora_rank: int, sequences: int, seq_len: int) -> FusedHead | None:
    """TRL's fused head of the trained model (the actor in RLHF) for one micro-batch of ``sequences``
    sequences, or None where the program computes the logits (any other framework, or a TRL trainer without
    the fused head). The LM head's weight trains in a full fine-tune; LoRA's adapters leave it frozen."""
    if workload.framework != "trl" or workload.kind not in TRL_FUSED_HEAD_WORKLOADS:
        return None
    tokens = scored_tokens(workload.kind, sequences, seq_len, workload.gen_len)
    return trl_fused_head(
        workload.model, tokens, workload.dtype, head_trainable=lora_rank == 0, outputs=TRL_HEAD_OUTPUTS[workload.kind]
    )


def trl_loss_logits(head: FusedHead) -> LossLogits:
    """The head as the cost model's :class:`search.model.activations.LossLogits`: nothing held, no
    cross-entropy over the vocabulary."""
    return LossLogits(forward=head.forward, backward=head.backward, held=0, cross_entropy_elements=0)

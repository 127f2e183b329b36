"""A causal-LM loss over chunks of tokens, in plain torch: the LM head and cross-entropy never see all logits.

What ``loss: "chunked"`` runs in a probe (and what ``planner.runtime`` offers a user's own loop): the final
hidden states are shifted against the labels and split into chunks of ``store.loss_chunks.chunk_tokens``
tokens; each chunk's head and fp32 cross-entropy run under non-reentrant activation checkpointing, so the
forward keeps only the chunk's slice of hidden states and the backward recomputes one chunk's logits at a time.
The memory is one chunk's logits and their fp32 work instead of the whole micro-batch's; the time is one more
LM-head product (the recompute) and a few kernels per chunk. Liger-Kernel's fused linear cross-entropy keeps
the same one chunk at a time without the recompute (it forms the gradients in the forward), which is what a
user of transformers or TRL turns on with ``use_liger_kernel=True``.

The head is called as a module (``lm_head(chunk)``), so ZeRO-3 gathers its weight for every chunk as it
gathers any module's. Final-logit soft-capping (Gemma 2/3) is not applied: the memory is the same, the loss
value is not that model's.
"""

from __future__ import annotations

from typing import Any

from store.loss_chunks import chunk_tokens

IGNORE_INDEX = -100


def _chunk_loss(head: Any, hidden: Any, labels: Any) -> Any:
    import torch.nn.functional as F

    logits = head(hidden).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_causal_lm_loss(hidden_states: Any, lm_head: Any, labels: Any, vocab_size: int) -> Any:
    """Mean next-token cross-entropy of ``hidden_states`` (batch x tokens x hidden, after the final norm)
    through ``lm_head`` against ``labels`` (batch x tokens; -100 ignored), as HF's ForCausalLMLoss computes it,
    one chunk of tokens at a time."""
    import torch
    from torch.utils.checkpoint import checkpoint

    hidden = hidden_states[:, :-1, :].reshape(-1, hidden_states.shape[-1])
    targets = labels[:, 1:].reshape(-1)
    tokens, width = hidden.shape
    step = chunk_tokens(tokens, vocab_size, width)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, tokens, step):
        part = slice(start, start + step)
        total = total + checkpoint(_chunk_loss, lm_head, hidden[part], targets[part], use_reentrant=False)
    counted = (targets != IGNORE_INDEX).sum().clamp(min=1)
    return total / counted


def _causal_lm(model: Any) -> Any:
    """The transformers causal LM inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def causal_lm_hidden_states(model: Any, input_ids: Any) -> Any:
    """The final hidden states of a transformers causal LM (its base model's output: after the final norm)."""
    return _causal_lm(model).base_model(input_ids=input_ids, use_cache=False).last_hidden_state


def output_head(model: Any) -> Any:
    """The LM head module of a transformers causal LM (through a PEFT wrapper)."""
    return _causal_lm(model).get_output_embeddings()

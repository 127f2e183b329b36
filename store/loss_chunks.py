"""How a chunked loss splits a micro-batch's tokens: one rule for the cost model and the probes.

``loss: "chunked"`` computes the LM head and the cross-entropy over chunks of tokens, never the whole
``tokens x vocab`` logits at once. The chunk follows Liger-Kernel's fused linear cross-entropy
(``liger_kernel/ops/fused_linear_cross_entropy.py``): ``inc_factor = ceil(V / H)``, ``chunk_size =
next_power_of_2(ceil(BT / inc_factor))``, so that one chunk's logits are about as large as the hidden states.
"""

from __future__ import annotations

LOSSES: tuple[str, ...] = ("hf", "chunked")


def chunk_tokens(tokens: int, vocab_size: int, hidden_size: int) -> int:
    """Tokens per chunk of a chunked loss over ``tokens`` tokens (at least 1, at most ``tokens``' power of 2)."""
    factor = -(-vocab_size // hidden_size)
    wanted = max(1, -(-tokens // factor))
    return 1 << (wanted - 1).bit_length()


def chunk_count(tokens: int, vocab_size: int, hidden_size: int) -> int:
    """How many chunks a chunked loss runs over ``tokens`` tokens."""
    return -(-tokens // chunk_tokens(tokens, vocab_size, hidden_size))

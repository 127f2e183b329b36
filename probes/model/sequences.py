"""Sequences as transformers reads them on the meta device."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """transformers looks for packed sequences in the position ids of a forward without a KV cache (no-grad
    scoring, checkpointed training): a tensor ``.item()``, which the meta device has no value for. The trace's
    sequences are not packed: say so."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original

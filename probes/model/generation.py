"""The probe's ``generate`` call: its arguments besides the prompts and sampling."""

from __future__ import annotations

from typing import Any


def generate_kwargs(prompts: Any, gen_len: int, pad_token_id: int) -> dict[str, Any]:
    """The arguments of the probe's ``generate`` call besides ``input_ids``, ``do_sample`` and the samples."""
    import torch

    return {
        "attention_mask": torch.ones_like(prompts),
        "max_new_tokens": gen_len,
        "min_new_tokens": gen_len,
        "use_cache": True,
        "pad_token_id": pad_token_id,
    }

"""Token log-probabilities as the probes take them (the RLHF actor's and the tracers')."""

from __future__ import annotations

from typing import Any


def token_logprobs(logits: Any, sequences: Any) -> Any:
    """Log-probability of each next token, fp32, shape (batch, seq - 1)."""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)

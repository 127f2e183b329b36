"""The chunked causal-LM loss of the probes: HF's loss and gradients, without HF's full logits in memory."""

from __future__ import annotations

import pytest
import torch

from probes.measure.tracker import LiveTensorTracker
from probes.model.chunked_loss import causal_lm_hidden_states, chunked_causal_lm_loss
from probes.trace.activations import cut_model
from store.loss_chunks import chunk_count, chunk_tokens

CONFIGS = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 256,
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "opt": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 4096, "word_embed_proj_dim": 64, "dropout": 0.0, "pad_token_id": 0},
}  # fmt: skip


def _model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = cut_model(CONFIGS[family], "fp32", "eager", device="cpu")
    model.eval()  # no dropout: the two losses must see the same function
    return model


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (4, 64), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_chunked_loss_is_hfs_loss_with_hfs_gradients(family: str) -> None:
    model = _model(family)
    ids = _ids(CONFIGS[family]["vocab_size"])
    hf = model(input_ids=ids, labels=ids, use_cache=False).loss
    hf.backward()
    hf_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    hidden = causal_lm_hidden_states(model, ids)
    chunked = chunked_causal_lm_loss(hidden, model.get_output_embeddings(), ids, model.config.vocab_size)
    chunked.backward()
    assert chunked.item() == pytest.approx(hf.item(), rel=1e-5)
    for name, grad in hf_grads.items():
        assert torch.allclose(grad, model.get_parameter(name).grad, rtol=1e-4, atol=1e-6), name


def test_the_chunked_loss_never_holds_the_whole_logits() -> None:
    model = _model("llama")
    ids = _ids(4096)
    peaks = {}
    for loss in ("hf", "chunked"):
        model.zero_grad(set_to_none=True)
        with LiveTensorTracker(device_types=("cpu",)) as tracker:
            if loss == "hf":
                model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            else:
                hidden = causal_lm_hidden_states(model, ids)
                chunked_causal_lm_loss(hidden, model.get_output_embeddings(), ids, 4096).backward()
        peaks[loss] = tracker.peak
    logits_fp32 = 4 * 64 * 4096 * 4
    assert peaks["hf"] - peaks["chunked"] > 2 * logits_fp32  # HF's fp32 upcast, log-softmax and gradients


@pytest.mark.parametrize(
    ("tokens", "vocab", "hidden", "chunk"),
    [(4096, 128256, 4096, 128), (2048, 50272, 2048, 128), (255, 4096, 64, 4), (1, 262144, 1152, 1), (64, 64, 64, 64)],
)
def test_chunks_follow_ligers_rule(tokens: int, vocab: int, hidden: int, chunk: int) -> None:
    """chunk = next power of 2 of ceil(tokens / ceil(vocab / hidden)): one chunk's logits ~ the hidden states."""
    assert chunk_tokens(tokens, vocab, hidden) == chunk
    assert chunk_count(tokens, vocab, hidden) == -(-tokens // chunk)

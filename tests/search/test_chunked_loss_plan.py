"""The loss knob: ``loss: "chunked"`` trades the whole logits for one chunk at a time and a little time."""

from __future__ import annotations

import pytest

from search import DEFAULT_COEFFICIENTS, predict, search
from search.model.activations import loss_logits
from store.errors import InputError
from store.gpus import get_gpu
from store.loss_chunks import chunk_tokens
from store.models import get_model
from store.records import Hardware, Strategy, Workload

COEF = DEFAULT_COEFFICIENTS


def _hw(gib: int = 24) -> Hardware:
    return Hardware(gpu=get_gpu("A10"), gpu_memory_bytes=gib * 2**30, cpu_memory_bytes=64 * 2**30)


def _sft(model: str = "gemma-3-1b", seq: int = 2048, batch: int = 8) -> Workload:
    return Workload(kind="sft", model=get_model(model), seq_len=seq, global_batch=batch)


def test_a_chunked_loss_holds_one_chunk_of_logits_and_the_hidden_gradient() -> None:
    model = get_model("llama-3.1-8b")
    tokens, d = 4 * 2048, 2
    chunk = chunk_tokens(tokens, model.vocab_size, model.hidden_size)
    chunked = loss_logits(model, 4, 2048, "bf16", COEF, loss="chunked")
    hf = loss_logits(model, 4, 2048, "bf16", COEF, holds_output=False)
    assert chunked.held == 0
    assert chunked.forward == (2 + 4 + 4) * chunk * model.vocab_size
    assert chunked.backward == (2 * d + 16) * chunk * model.vocab_size + d * tokens * model.hidden_size
    assert hf.backward > 10 * chunked.backward  # the logits of 8192 tokens against those of 256


def test_the_chunked_loss_costs_a_little_time_and_saves_the_logits() -> None:
    base = Strategy(zero_stage=2, offload_optimizer="cpu", gradient_checkpointing=True, micro_batch=4, grad_accum=2)
    hf, chunked = (predict(_sft(), base.with_(loss=loss), _hw()) for loss in ("hf", "chunked"))
    assert chunked.peak_allocated_bytes < hf.peak_allocated_bytes / 2  # 262k vocabulary: the logits dominate
    assert hf.step_time_s < chunked.step_time_s < 1.2 * hf.step_time_s  # one more head product, a few kernels


def test_the_search_picks_a_chunked_loss_only_when_the_logits_do_not_fit() -> None:
    roomy = search(_sft(seq=512, batch=4), _hw(80), COEF).best
    assert roomy is not None and roomy.strategy.loss == "hf"
    tight = search(_sft(seq=4096, batch=16), _hw(24), COEF).best
    assert tight is not None and tight.strategy.loss == "chunked"


@pytest.mark.parametrize("kind", ["dpo", "reward"])
def test_a_chunked_loss_is_refused_where_the_loss_is_not_the_lms_cross_entropy(kind: str) -> None:
    workload = Workload(kind=kind, model=get_model("opt-125m"), seq_len=128, global_batch=4)
    with pytest.raises(InputError, match="applies to sft"):
        predict(workload, Strategy(micro_batch=2, loss="chunked"), _hw())
    assert all(c.strategy.loss == "hf" for c in search(workload, _hw(), COEF).ranked)


def test_the_strategy_json_carries_the_loss_only_when_it_is_not_hfs() -> None:
    assert "loss" not in Strategy().to_dict()
    chunked = Strategy(loss="chunked")
    assert chunked.to_dict()["loss"] == "chunked"
    assert Strategy.from_dict(chunked.to_dict()) == chunked
    with pytest.raises(InputError, match="loss must be one of hf, chunked"):
        Strategy(loss="fused")

"""TRL's ``disable_dropout`` as ``store.module_dropout`` models it, against the real TRL 1.16 config classes, its
``disable_dropout_in_model`` on transformers' own model classes, and the tracer (tiny models on the CPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from store.frameworks import TRL_NO_DROPOUT_WORKLOADS
from store.models import catalog_configs
from store.module_dropout import MODULE_DROPOUT_KEYS, no_dropout_terms, without_module_dropout_config

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

TINY = {"gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 64, "n_positions": 64},
        "opt": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "ffn_dim": 64,
                "vocab_size": 64, "max_position_embeddings": 64, "word_embed_proj_dim": 32},
        "llama": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                  "vocab_size": 64, "max_position_embeddings": 64}}  # fmt: skip
# every dropout probability of each family's config, set high so that a dropout left on shows
PROBS = {"gpt2": ("attn_pdrop", "resid_pdrop", "embd_pdrop"), "opt": ("dropout", "attention_dropout"),
         "llama": ("attention_dropout",)}  # fmt: skip


def default(config_class: type, name: str) -> object:
    return {f.name: f.default for f in dataclasses.fields(config_class)}.get(name, "absent")


def test_trl_configs_that_disable_dropout_by_default() -> None:
    from trl import DPOConfig, GRPOConfig, RewardConfig, SFTConfig

    assert default(DPOConfig, "disable_dropout") is True and default(RewardConfig, "disable_dropout") is True
    assert default(GRPOConfig, "disable_dropout") is False and default(SFTConfig, "disable_dropout") == "absent"
    assert TRL_NO_DROPOUT_WORKLOADS == ("dpo", "reward")


def _outputs(model_type: str, config: Mapping[str, object], disable: bool) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import disable_dropout_in_model

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **config)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).train()
    if disable:
        disable_dropout_in_model(model)
    ids = torch.arange(16).reshape(2, 8)
    with torch.no_grad():
        torch.manual_seed(1)
        first = model(input_ids=ids).logits
        torch.manual_seed(2)
        second = model(input_ids=ids).logits
    return first, second


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_disable_dropout_in_model_turns_off_exactly_the_module_keys(model_type: str) -> None:
    config = {**TINY[model_type], **dict.fromkeys(PROBS[model_type], 0.5)}
    first, second = _outputs(model_type, config, disable=True)
    # deterministic in training mode iff every probability of the family sits in an nn.Dropout module
    assert torch.equal(first, second) == (set(MODULE_DROPOUT_KEYS.get(model_type, ())) == set(PROBS[model_type]))
    if model_type in MODULE_DROPOUT_KEYS:  # and then it is the model of the config with those keys at 0
        zeroed_config = without_module_dropout_config({"model_type": model_type, **config})
        zeroed_config.pop("model_type")
        zeroed, _ = _outputs(model_type, zeroed_config, disable=False)
        assert torch.equal(first, zeroed)


def test_catalog_families_with_dropout_are_the_ones_tested() -> None:
    # a catalog family with a nonzero dropout default must be one whose module keys the test above pins
    for name, config in catalog_configs().items():
        kind = str(config["model_type"])
        probs = [v for k, v in config.items() if ("drop" in k) and isinstance(v, float) and v > 0]
        if probs:
            assert kind in TINY, name


def test_stored_no_dropout_terms_are_the_tracers() -> None:
    from probes.trace.terms import trace_terms

    config = without_module_dropout_config(catalog_configs()["gpt2"])
    traced = trace_terms(config, "bf16", "sdpa", variants=False)
    stored = no_dropout_terms("gpt2")
    assert stored is not None
    assert stored["2-sdpa"]["layer_saved"] == traced["layer_saved"]
    assert stored["2-sdpa"]["outside_saved"] == traced["outside_saved"]
    for window in ("layer_forward", "layer_backward", "head_forward", "head_backward"):
        assert stored["2-sdpa"]["windows"][window] == traced["windows"][window], window

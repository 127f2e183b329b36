"""Model shapes read from transformers' own module tree (probes.model.shape), against transformers itself.

The catalog's package data is re-derived here model by model; the five families with a pure-Python formula
must give the same counts both ways; mixture-of-experts and multimodal configs are read the way their
model classes build them; a layer cut of a traced spec equals a trace of the cut config.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from probes.model.shape import spec_of_config, trace_model_shape
from probes.trace.terms import trace_all_terms, trace_layer_backward
from store.activation_terms import LAYER_BACKWARD_TENSORS, TRACED_SETTINGS
from store.errors import InputError
from store.model_params import SUPPORTED_MODEL_TYPES, spec_from_hf_config
from store.model_shape import CATALOG_TERM_KEYS, SHAPE_VERSION, catalog_shape, spec_from_shape
from store.models import catalog_configs, get_model, with_layers

CATALOG = catalog_configs()
_VOLATILE = ("versions", "activation_terms", "activation_unfitted")  # library versions; the terms are checked below


def _stable(shape: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in shape.items() if k not in _VOLATILE}


def _packaged(name: str) -> dict[str, Any]:
    """One model's packaged shape (``catalog_shapes()[name]``, without parsing every other model's terms)."""
    shape = catalog_shape(name)
    assert shape is not None, f"{name} has no packaged shape"
    return shape


@pytest.mark.parametrize("name", list(CATALOG))
def test_the_packaged_catalog_shape_is_what_transformers_builds_today(name: str) -> None:
    """Re-derive the package data (``python -m probes.trace.catalog --write-catalog`` rewrites it)."""
    assert _stable(trace_model_shape(CATALOG[name], name)) == _stable(_packaged(name))


# One model of each kind of model code (the whole catalog takes minutes: `python -m probes.model.shape
# --write-catalog`): OPT, GPT-2 (Conv1D, learned positions), Llama, Qwen3-MoE (Qwen3's attention, routed
# experts), Gemma 3 (sliding windows, Gemma's norms), Phi (fused projections). Qwen2 (Llama's layout with
# biases) and Gemma 2 (eager attention only) are left to the catalog's regeneration, to keep the suite short.
# Each model is traced in one of the catalog's settings (both attentions are held across the sample); every
# setting of every model is re-traced when the catalog is regenerated.
TERM_SAMPLE = [("opt-350m", "2-eager"), ("gpt2", "2-sdpa"), ("llama-3.2-1b", "2-sdpa"), ("qwen3-30b-a3b", "2-sdpa"),
               ("gemma-3-1b", "2-eager"), ("phi-4-mini", "2-eager")]  # fmt: skip


@pytest.mark.parametrize(("name", "key"), TERM_SAMPLE)
def test_the_packaged_activation_terms_are_what_the_model_code_does_today(name: str, key: str) -> None:
    assert key in CATALOG_TERM_KEYS
    traced = trace_all_terms(CATALOG[name], (key,))
    assert "unfitted" not in traced, traced.get("unfitted")
    packaged = dict(_packaged(name)["activation_terms"][key])
    packaged.pop(LAYER_BACKWARD_TENSORS, None)  # the catalog's own term (trace_layer_backward): below
    assert traced[key] == packaged


def test_the_packaged_layer_backward_is_what_autograd_does_today() -> None:
    """The catalog's ``layer_backward_tensors`` (``--write-catalog`` adds it; trace_all_terms does not), re-traced
    for one OPT setting (a backward per shape: the catalog's regeneration re-traces every setting)."""
    name, key = "opt-350m", "2-eager"
    traced = trace_layer_backward(CATALOG[name], *TRACED_SETTINGS[key])
    assert traced is not None and traced == _packaged(name)["activation_terms"][key][LAYER_BACKWARD_TENSORS]


@pytest.mark.parametrize("name", list(CATALOG))
def test_the_parts_add_up_to_transformers_own_parameter_count(name: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = copy.deepcopy(CATALOG[name])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config))
    spec = get_model(name)
    parts = spec.embedding_params + sum(spec.layer_param_counts) + spec.lm_head_params
    final_norm = spec.total_params - parts
    assert spec.total_params == model.num_parameters()
    assert 0 <= final_norm <= 2 * spec.hidden_size  # a final norm (weight, maybe bias) or none (opt-350m)
    assert len(spec.layer_param_counts) == spec.num_layers


FORMULA_NAMES = [name for name, config in CATALOG.items() if config["model_type"] in SUPPORTED_MODEL_TYPES]
_FORMULA_FIELDS = (
    "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
    "max_positions", "tie_word_embeddings", "gated_mlp", "dropout", "total_params", "layer_params",
    "embedding_params", "lm_head_params",
)  # fmt: skip


@pytest.mark.parametrize("name", FORMULA_NAMES)
def test_the_formula_families_count_the_same_both_ways(name: str) -> None:
    formula = spec_from_hf_config(name, copy.deepcopy(CATALOG[name]))
    traced = get_model(name)
    assert traced.shape_source == "traced"
    assert {f: getattr(formula, f) for f in _FORMULA_FIELDS} == {f: getattr(traced, f) for f in _FORMULA_FIELDS}


# Published totals (model cards): total and active parameters, in billions, as the cards round them.
PUBLISHED = {
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
    "mixtral-8x7b": (46.7, 12.9),
    "qwen3-8b": (8.2, 8.2),
    "gemma-2-9b": (9.24, 9.24),
    "phi-4": (14.7, 14.7),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_totals_and_active_parameters_match_the_model_cards(name: str) -> None:
    spec = get_model(name)
    total, active = PUBLISHED[name]
    assert spec.total_params / 1e9 == pytest.approx(total, rel=0.01)
    assert spec.active_params / 1e9 == pytest.approx(active, rel=0.02)


def test_a_mixture_of_experts_layer_holds_its_routed_experts_and_its_largest_module_is_them() -> None:
    spec = get_model("qwen3-30b-a3b")
    h, expert_width, experts = 2048, 768, 128
    one_layer_experts = experts * 3 * h * expert_width  # fused gate_up (2 x width) and down, per expert
    assert spec.num_experts == experts and spec.experts_per_token == 8
    assert spec.expert_param_counts == (one_layer_experts,) * spec.num_layers
    assert spec.largest_module == one_layer_experts  # the fused experts module: what ZeRO-3 gathers at once
    assert spec.intermediate_size == 8 * expert_width  # a token runs 8 experts' MLPs
    assert spec.total_params - spec.active_params == spec.num_layers * (experts - 8) * 3 * h * expert_width


def test_a_multimodal_config_is_read_as_its_text_model() -> None:
    text = {"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 4096}  # fmt: skip
    both = {"model_type": "gemma3", "text_config": text, "vision_config": {"model_type": "siglip_vision_model"}}
    assert spec_of_config("g", both).total_params == spec_of_config("t", text).total_params


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gemma-3-1b", "phi-3.5-mini", "opt-350m"])
def test_a_cut_of_a_traced_spec_equals_a_trace_of_the_cut_config(name: str) -> None:
    cut = with_layers(get_model(name), 2)
    traced = spec_from_shape(name, cut.hf_config, trace_model_shape(cut.hf_config, name))
    assert cut.activation_terms == get_model(name).activation_terms  # per layer: a cut keeps them
    assert dataclasses.replace(cut, activation_terms={}) == traced


def test_a_local_config_of_a_new_family_is_traced_and_keeps_its_config() -> None:
    config = copy.deepcopy(CATALOG["qwen3-0.6b"])
    spec = spec_of_config("/models/qwen3/config.json", config)
    assert spec.total_params == get_model("qwen3-0.6b").total_params
    assert spec.hf_config == config and spec.shape_source == "traced"


def test_the_shape_records_what_read_it() -> None:
    shape = trace_model_shape(CATALOG["smollm2-135m"], "smollm2-135m")
    assert shape["shape_version"] == SHAPE_VERSION
    assert set(shape["versions"]) == {"torch", "transformers"}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"model_type": "no-such-arch", "hidden_size": 8}, "unknown to transformers"),
        ({"model_type": "t5", "d_model": 64, "num_layers": 2}, "no causal language model class"),
        ({"hidden_size": 8}, "model_type"),
        ({"model_type": "bert", "hidden_size": 64}, "is an encoder"),
        ({"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2}, "has no num_attention_heads"),
    ],
    ids=["unknown-type", "encoder-decoder", "no-type", "encoder", "state-space"],
)
def test_a_config_transformers_cannot_build_as_a_causal_lm_is_one_clear_line(config: dict, says: str) -> None:
    with pytest.raises(InputError) as caught:
        trace_model_shape(config, "cfg.json")
    message = str(caught.value)
    assert says in message and "\n" not in message and message.startswith("cfg.json: ")

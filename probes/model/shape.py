"""A model's shape read from transformers' own module tree, built on the meta device (no weights, no compute).

Any decoder-only causal LM config the installed transformers knows works: ``AutoConfig.for_model`` builds the
config class, ``AutoModelForCausalLM.from_config`` the model under ``torch.device("meta")``, and the counts are
read from the modules it made: each decoder layer, the token (and position) embeddings with any projections,
the final norm, the LM head (tied or not), the module with the most direct parameters (what DeepSpeed's ZeRO-3
estimator calls ``largest_layer_params``), every ``nn.Linear`` of the decoder layers (where LoRA adapters go)
and, for mixture-of-experts models, the routed experts (total against what one token runs).

A multimodal config (one with a ``text_config``) is read as its text model: what a text fine-tune trains.
The result is a dict of :class:`store.records.ModelSpec` fields (see :func:`store.model_shape.spec_from_shape`).
Imports torch and transformers: only the probes layer and the planner's first use of an uncached config call it.
"""

from __future__ import annotations

import copy
from typing import Any

from store.errors import InputError
from store.model_bounds import check_config_bounds
from store.model_shape import SHAPE_VERSION, UntracedModelError, installed_versions, spec_from_shape
from store.models import spec_for_config
from store.records import ModelSpec

# Config keys naming the same quantity across families (the first one set wins).
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token")
_DENSE_WIDTH_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
_DROPOUT_KEYS = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)
_GATE_NAMES = ("gate_proj", "gate_up_proj", "w1", "w3", "gate_up")


def config_object(hf_config: dict[str, Any], source: str) -> Any:
    """transformers' config object of an HF config dict (a multimodal config's text config); InputError with
    one line for a model_type transformers does not know, a config it cannot read, or an encoder."""
    from transformers import AutoConfig

    config = copy.deepcopy(hf_config)
    model_type = config.pop("model_type", None)
    if not isinstance(model_type, str):
        raise InputError(f"{source}: missing required key(s) 'model_type'")
    unreadable: tuple[type[Exception], ...] = (TypeError, KeyError, AttributeError, *_strict_field_errors())
    try:
        built = AutoConfig.for_model(model_type, **config)
    except ValueError as err:
        raise InputError(f"{source}: model_type {model_type!r} is unknown to transformers ({err})") from None
    except unreadable as err:
        reason = " ".join(str(err).split())
        raise InputError(f"{source}: transformers cannot read this config ({type(err).__name__}: {reason})") from None
    if getattr(built, "text_config", None) is not None:
        built = built.get_text_config()
    check_config_bounds(built.to_dict(), source)  # with the class defaults: a MoE's experts per token
    missing = [key for key in ("hidden_size", "num_attention_heads", "vocab_size") if _first(built, (key,)) is None]
    if missing:
        raise InputError(
            f"{source}: model_type {built.model_type!r} has no {missing[0]}: memplan plans transformer decoders"
            " with attention heads (not state-space or recurrent models)"
        )
    if built.model_type in _encoder_types():
        raise InputError(
            f"{source}: model_type {built.model_type!r} is an encoder (its causal LM head is for use as a decoder"
            " in a seq2seq model); memplan plans decoder-only causal language models"
        )
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(built) not in MODEL_FOR_CAUSAL_LM_MAPPING:  # what AutoModelForCausalLM.from_config refuses (T5, Whisper)
        raise InputError(
            f"{source}: model_type {built.model_type!r} has no causal language model class in transformers "
            "(an encoder-decoder or a model of another task); memplan plans decoder-only causal language models"
        )
    return built


def _strict_field_errors() -> tuple[type[Exception], ...]:
    """What transformers' typed config fields raise for a value of the wrong type (``text_config: []``):
    huggingface_hub's strict-dataclass errors, where that version has them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: configs are not strict dataclasses there
        return ()
    return (StrictDataclassError,)


def _encoder_types() -> set[str]:
    """Model types transformers also builds as masked LMs (BERT, RoBERTa, BART...): encoders, not decoder-only."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return set(MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def _build(config: Any, source: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except ValueError as err:
        line = f"{source}: not a causal language model transformers can build ({_first_line(err)})"
        raise InputError(line, detail=str(err)) from None
    except Exception as err:  # a config transformers accepts but its model code cannot build
        why = f"{type(err).__name__}: {_first_line(err)}"
        raise InputError(f"{source}: transformers could not build the model ({why})", detail=str(err)) from None


REASON_CHARS = 200  # transformers' reason, as the refusing line repeats it


def _first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, cut to REASON_CHARS: transformers lists every model class it knows
    after the first line (3 KB for a T5 config), and a refusal is one short line (the whole message is the
    refusal's ``detail``, which ``planner --verbose`` prints)."""
    lines = str(err).strip().splitlines()
    first = " ".join(lines[0].split()) if lines else type(err).__name__
    return first if len(first) <= REASON_CHARS else first[: REASON_CHARS - 3] + "..."


def decoder_layers(model: Any, layers: int) -> tuple[Any, Any]:
    """(the module holding the decoder layers, the ModuleList of them): the largest list of ``layers`` modules."""
    import torch

    found: list[tuple[int, Any, Any]] = []
    for _, parent in model.named_modules():
        for child in parent.children():
            if isinstance(child, torch.nn.ModuleList) and len(child) == layers:
                found.append((sum(p.numel() for p in child.parameters()), parent, child))
    if not found:
        raise InputError(f"no list of {layers} decoder layers in {type(model).__name__}")
    _, parent, blocks = max(found, key=lambda item: item[0])
    return parent, blocks


def _first(config: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        try:
            value = getattr(config, key, None)
        except AttributeError:  # transformers' heterogeneous configs raise past getattr's default
            value = None
        if value is not None:
            return value
    return None


def _count(parameters: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in parameters}.values())


def _expert_counts(block: Any) -> int:
    """Parameters of the routed experts in one decoder layer (modules named ``experts``, not shared ones)."""
    seen: set[int] = set()
    total = 0
    for name, param in block.named_parameters():
        parts = name.split(".")
        if any(part == "experts" for part in parts) and id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    return total


def _linears(block: Any) -> list[tuple[int, int]]:
    import torch

    return [(m.in_features, m.out_features) for m in block.modules() if isinstance(m, torch.nn.Linear)]


def _kv_windows(config: Any, layers: int) -> list[int]:
    """Per layer, what transformers' DynamicCache keeps (its own rule, ``get_layer_types_and_kwargs``): 0 every
    token, the window for sliding and chunked layers, -1 for a layer that keeps none."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        types, kwargs = get_layer_types_and_kwargs(config)
    except (ImportError, AttributeError, TypeError, ValueError):  # an older transformers, or no cache rule
        return []
    pairs = zip(types, kwargs, strict=False)
    windows = [-1 if kind == "dummy" else int(more.get("sliding_window") or 0) for kind, more in pairs]
    return windows if len(windows) == layers else []


KV_PROBE_TOKENS = 1  # one token: every layer keeps it, sliding windows included


def _kv_token_elements(hf_config: dict[str, Any], source: str) -> int:
    """Elements of K and V that transformers' DynamicCache keeps per token in one layer, read from the cache
    after a no-grad prefill of a two-layer cut on the meta device (MLA models cache a compressed latent; most
    cache K and V of every KV head). 0 when the model cannot be run that way (the planner then counts
    ``2 x num_kv_heads x head_dim``)."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from probes.model.sequences import unpacked_sequences
    from store.models import cut_config

    try:
        config = config_object(cut_config(hf_config, str(hf_config.get("model_type")), 2), source)
        with torch.device("meta"):  # 16-bit: MoE grouped GEMMs take no other (the elements are the same)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        cache = DynamicCache(config=model.config)
        ids = torch.zeros((1, KV_PROBE_TOKENS), dtype=torch.long, device="meta")
        with torch.no_grad(), unpacked_sequences():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        kept = [
            sum(t.numel() for t in (layer.keys, layer.values) if t is not None)
            for layer in getattr(cache, "layers", [])
        ]
    except Exception:  # model code the meta device cannot run: fall back to the head count
        return 0
    return max(kept, default=0) // KV_PROBE_TOKENS


def trace_model_shape(hf_config: dict[str, Any], source: str = "model config") -> dict[str, Any]:
    """The ModelSpec fields (all but ``name`` and ``hf_config``) of the model transformers builds from
    ``hf_config``, read on the meta device. InputError for a config transformers cannot build as a causal LM."""
    config = config_object(hf_config, source)
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers < 1:
        raise InputError(f"{source}: the config names no number of decoder layers (num_hidden_layers)")
    model = _build(config, source)
    base, blocks = decoder_layers(model, layers)
    per_layer = [_count(block.parameters()) for block in blocks]
    total = _count(model.parameters())
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    tied = head is not None and embedding is not None and head.weight is embedding.weight
    head_params = 0 if tied or head is None else _count(head.parameters())
    final_norm = sum(
        _count(child.parameters())
        for child in base.children()
        if child is not blocks and "norm" in type(child).__name__.lower()
    )
    largest = max(_count(m.parameters(recurse=False)) for m in model.modules())
    linears = [_linears(block) for block in blocks]
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    experts = int(_first(config, _EXPERT_KEYS) or 0)
    expert_params = [_expert_counts(block) for block in blocks] if experts else [0] * layers
    top_k = int(_first(config, _TOP_K_KEYS) or 0) if experts else 0
    names = {part for name, _ in blocks[-1].named_parameters() for part in name.split(".")}
    gated = any(gate in names for gate in _GATE_NAMES)
    width = int(_first(config, _DENSE_WIDTH_KEYS) or 4 * hidden)
    if experts and sum(expert_params):
        moe_width = int(getattr(config, "moe_intermediate_size", None) or width)
        shared = int(getattr(config, "shared_expert_intermediate_size", None) or 0)
        shared += int(getattr(config, "n_shared_experts", None) or 0) * moe_width
        width = top_k * moe_width + shared
    probs = [float(v) for key in _DROPOUT_KEYS if isinstance(v := getattr(config, key, None), int | float)]
    positions = _first(config, ("max_position_embeddings", "n_positions")) or 2048
    return {
        "model_type": str(hf_config.get("model_type")),
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": width,
        "vocab_size": int(config.vocab_size),
        "max_positions": int(positions),
        "tie_word_embeddings": bool(tied),
        "gated_mlp": gated,
        "dropout": max(probs, default=0.0),
        "total_params": total,
        "layer_params": round(sum(per_layer) / layers),
        "embedding_params": total - sum(per_layer) - head_params - final_norm,
        "lm_head_params": head_params,
        "shape_source": "traced",
        "layer_param_counts": per_layer,
        "largest_module": largest,
        "lora_in_out": sum(n_in + n_out for block in linears for n_in, n_out in block),
        "lora_widest": max((max(pair) for block in linears for pair in block), default=0),
        "num_experts": experts if sum(expert_params) else 0,
        "experts_per_token": top_k if sum(expert_params) else 0,
        "expert_params": sum(expert_params),
        "expert_param_counts": expert_params if sum(expert_params) else [],
        "kv_windows": [] if not any(w := _kv_windows(config, layers)) else w,
        "kv_token_elements": _kv_token_elements(hf_config, source),
        "attn_impls": ["eager"]
        + (["sdpa"] if getattr(model, "_supports_sdpa", True) else [])
        + (["flash_attention_2"] if getattr(model, "_supports_flash_attn", True) else []),
        "shape_version": SHAPE_VERSION,
        "versions": installed_versions(),
    }


def spec_of_config(name: str, hf_config: dict[str, Any], source: str | None = None) -> ModelSpec:
    """The spec of an HF config: by formula where ``store.models`` has one, else traced here and now."""
    try:
        return spec_for_config(name, hf_config, source)
    except UntracedModelError as untraced:
        return spec_from_shape(name, untraced.config, trace_model_shape(untraced.config, untraced.source))

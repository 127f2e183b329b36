"""Exact parameter counts of the supported decoder-only architectures, read from HF config dicts.

Pure Python: each formula mirrors the module tree that transformers builds for ``model_type`` (the
``*ForCausalLM`` class), so the counts equal what it instantiates on the meta device. Missing keys take
the defaults of transformers' config classes, which differ per architecture (``tie_word_embeddings``,
``num_key_value_heads``, dropout). ``store.models`` is the public face; this module holds the maths.
"""

from __future__ import annotations

import copy
from typing import Any

from store.errors import InputError
from store.records import ModelSpec

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("opt", "gpt2", "llama", "mistral", "qwen2")

_MISSING = object()


MAX_DIMENSION = 2**24  # sizes, layers, heads and vocabularies of real models are far below 16.7 M


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Reader:
    """Typed, validated access to a config dict; every problem is an InputError naming ``source``."""

    def __init__(self, config: dict[str, Any], source: str) -> None:
        self.config = config
        self.source = source

    def fail(self, problem: str) -> InputError:
        return InputError(f"{self.source}: {problem}")

    def raw(self, keys: tuple[str, ...], default: Any) -> Any:
        """The first of ``keys`` present and not null, else ``default`` (``_MISSING``: required)."""
        for key in keys:
            if self.config.get(key) is not None:
                return self.config[key]
        if default is _MISSING:
            raise self.fail(f"missing required key(s) {keys[0]!r} for model_type {self.config['model_type']!r}")
        return default

    def count(self, *keys: str, default: Any = _MISSING) -> int:
        value = self.raw(keys, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.fail(f"{keys[0]!r} must be a whole number >= 1, not {_shown(value)}")
        if value > MAX_DIMENSION:
            raise self.fail(f"{keys[0]!r} is {_shown(value)}, more than any model has (at most {MAX_DIMENSION})")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw((key,), default)
        if not isinstance(value, bool):
            raise self.fail(f"{key!r} must be true or false, not {value!r}")
        return value

    def largest_prob(self, defaults: dict[str, float]) -> float:
        """The largest of the dropout probabilities named in ``defaults`` (class defaults when missing)."""
        probs = []
        for key, default in defaults.items():
            value = self.raw((key,), default)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise self.fail(f"{key!r} must be a probability between 0 and 1, not {value!r}")
            probs.append(float(value))
        return max(probs)


def _divisible(r: _Reader, hidden: int, heads: int) -> None:
    if hidden % heads:
        raise r.fail(f"hidden size {hidden} is not a multiple of the number of attention heads {heads}")


def _opt(r: _Reader) -> dict[str, Any]:
    # OPTForCausalLM: learned positions with 2 extra rows; opt-350m projects 512-wide token embeddings
    # into the 1024-wide blocks (project_in/out, no bias) and, being post-LN, has no final layer norm.
    h = r.count("hidden_size")
    heads = r.count("num_attention_heads")
    _divisible(r, h, heads)
    ffn = r.count("ffn_dim")
    vocab = r.count("vocab_size")
    positions = r.count("max_position_embeddings", default=2048)
    proj = r.count("word_embed_proj_dim", default=h)
    bias = r.flag("enable_bias", True)
    norm = 2 * h if r.flag("layer_norm_elementwise_affine", True) else 0
    final_norm = r.flag("do_layer_norm_before", True) and not r.flag("_remove_final_layer_norm", False)
    tie = r.flag("tie_word_embeddings", True)
    attention = 4 * h * h + (4 * h if bias else 0)
    mlp = 2 * h * ffn + (ffn + h if bias else 0)
    return {
        "hidden_size": h,
        "num_layers": r.count("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": h // heads,
        "intermediate_size": ffn,
        "vocab_size": vocab,
        "max_positions": positions,
        "tie_word_embeddings": tie,
        "gated_mlp": False,
        "dropout": r.largest_prob({"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0}),
        "layer_params": attention + mlp + 2 * norm,
        "embedding_params": vocab * proj + (positions + 2) * h + (2 * proj * h if proj != h else 0),
        "final_norm_params": norm if final_norm else 0,
        "lm_head_params": 0 if tie else vocab * proj,
    }


def _gpt2(r: _Reader) -> dict[str, Any]:
    # GPT2LMHeadModel: Conv1D layers (weight and bias always), learned positions (wpe), ln_f.
    e = r.count("n_embd", "hidden_size")
    heads = r.count("n_head", "num_attention_heads")
    _divisible(r, e, heads)
    inner = r.count("n_inner", default=4 * e)
    vocab = r.count("vocab_size")
    positions = r.count("n_positions", "max_position_embeddings", default=1024)
    tie = r.flag("tie_word_embeddings", True)
    layer = (4 * e * e + 4 * e) + (2 * e * inner + inner + e) + 4 * e
    if r.flag("add_cross_attention", False):
        layer += 4 * e * e + 6 * e  # c_attn (2e), q_attn, c_proj and ln_cross_attn
    return {
        "hidden_size": e,
        "num_layers": r.count("n_layer", "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": e // heads,
        "intermediate_size": inner,
        "vocab_size": vocab,
        "max_positions": positions,
        "tie_word_embeddings": tie,
        "gated_mlp": False,
        "dropout": r.largest_prob({"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}),
        "layer_params": layer,
        "embedding_params": vocab * e + positions * e,
        "final_norm_params": 2 * e,
        "lm_head_params": 0 if tie else vocab * e,
    }


# Defaults of transformers' config classes where they differ between the Llama-like families.
_KV_HEADS_DEFAULT: dict[str, int | None] = {"llama": None, "mistral": 8, "qwen2": 32}
_MAX_POSITIONS_DEFAULT: dict[str, int] = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}


def _llama_like(r: _Reader) -> dict[str, Any]:
    # RMSNorm (weight only), SwiGLU MLP, GQA. Biases: llama follows attention_bias (q, k, v, o) and
    # mlp_bias; mistral has none whatever the config says; qwen2 always has q/k/v biases, no o_proj bias.
    model_type = r.config["model_type"]
    h = r.count("hidden_size")
    heads = r.count("num_attention_heads")
    if model_type == "llama":
        _divisible(r, h, heads)
    kv_given = r.config.get("num_key_value_heads", _KV_HEADS_DEFAULT[model_type])  # null means: heads
    kv = heads if kv_given is None else r.count("num_key_value_heads", default=kv_given)
    if heads % kv:
        raise r.fail(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    head_dim = r.count("head_dim", default=h // heads)
    inter = r.count("intermediate_size")
    vocab = r.count("vocab_size")
    tie = r.flag("tie_word_embeddings", False)
    q, k_or_v, o = h * heads * head_dim, h * kv * head_dim, heads * head_dim * h
    mlp = 3 * h * inter
    if model_type == "llama":
        if r.flag("attention_bias", False):
            q, k_or_v, o = q + heads * head_dim, k_or_v + kv * head_dim, o + h
        if r.flag("mlp_bias", False):
            mlp += 2 * inter + h
    elif model_type == "qwen2":
        q, k_or_v = q + heads * head_dim, k_or_v + kv * head_dim
    return {
        "hidden_size": h,
        "num_layers": r.count("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "max_positions": r.count("max_position_embeddings", default=_MAX_POSITIONS_DEFAULT[model_type]),
        "tie_word_embeddings": tie,
        "gated_mlp": True,
        "dropout": r.largest_prob({"attention_dropout": 0.0}),
        "layer_params": q + 2 * k_or_v + o + mlp + 2 * h,
        "embedding_params": vocab * h,
        "final_norm_params": h,
        "lm_head_params": 0 if tie else vocab * h,
    }


# Keys without which the shape is unknown ("a|b": either name); the rest take the class defaults.
_LLAMA_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_REQUIRED: dict[str, tuple[str, ...]] = {
    "opt": ("hidden_size", "ffn_dim", "num_hidden_layers", "num_attention_heads", "vocab_size"),
    "gpt2": ("n_embd|hidden_size", "n_layer|num_hidden_layers", "n_head|num_attention_heads", "vocab_size"),
    "llama": _LLAMA_REQUIRED,
    "mistral": _LLAMA_REQUIRED,
    "qwen2": _LLAMA_REQUIRED,
}

_FORMULAS = {"opt": _opt, "gpt2": _gpt2, "llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like}


def spec_from_hf_config(name: str, config: dict[str, Any], source: str | None = None) -> ModelSpec:
    """A ModelSpec with exact parameter counts for the HF config dict ``config`` of ``model_type``
    opt, gpt2, llama, mistral or qwen2.

    ``source`` labels error messages (default: ``name``). Bad input (not a dict, no or an unsupported
    ``model_type``, a missing or ill-typed key) raises InputError. ``hf_config`` of the result is a
    copy of ``config`` (``model_type`` included), ready for ``AutoConfig.for_model(**hf_config)``.
    """
    source = source or name
    if not isinstance(config, dict):
        raise InputError(f"{source}: a model config must be a JSON object, not {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type is None:
        raise InputError(f"{source}: missing required key(s) 'model_type'")
    if not isinstance(model_type, str) or model_type not in _FORMULAS:
        raise InputError(
            f"{source}: model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    required = _REQUIRED[model_type]
    missing = [keys.split("|")[0] for keys in required if all(config.get(k) is None for k in keys.split("|"))]
    if missing:
        raise InputError(
            f"{source}: missing required key(s) {', '.join(map(repr, missing))} for model_type {model_type!r}"
        )
    fields = _FORMULAS[model_type](_Reader(config, source))
    final_norm = fields.pop("final_norm_params")
    total = (
        fields["embedding_params"]
        + fields["num_layers"] * fields["layer_params"]
        + final_norm
        + fields["lm_head_params"]
    )
    return ModelSpec(name=name, model_type=model_type, total_params=total, hf_config=copy.deepcopy(config), **fields)

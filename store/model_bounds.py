"""Sane maxima for a local model config, checked before anything reads it further.

A config is data the user hands over: ``num_hidden_layers: 10000000`` is accepted by transformers, and then
the planner's search (linear in the layers) or the trace on the meta device (one module per layer and expert)
grinds for hours. Every released decoder is far inside these bounds (the deepest has about 130 layers, the
widest MoE about 512 routed experts per layer), so a value beyond one is a typo or a test, refused in one
line. A mixture-of-experts config must route each token to between 1 and all of its experts.

The config and its text model (``text_config``, what a multimodal config trains) are checked; nothing here
imports transformers.
"""

from __future__ import annotations

from typing import Any

from store.errors import InputError

MAX_LAYERS = 1024
MAX_EXPERTS = 2**14  # Doge routes among 16384 small experts; the widest others have 512
# Routed experts over all layers, which the trace and the search walk one by one: released models have up to
# about 25,000 (DeepSeek-V3 61 x 256, Qwen3-Next 48 x 512); 2**16 takes minutes already.
MAX_EXPERT_LAYERS = 2**16
# Config keys naming the same quantity across model families, and the most any model has.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "num_experts_per_token")  # not "top_k": a sampling knob
WIDTH_MAXIMA: dict[str, int] = {
    "hidden_size": 2**17,
    "n_embd": 2**17,
    "d_model": 2**17,
    "intermediate_size": 2**20,
    "ffn_dim": 2**20,
    "n_inner": 2**20,
    "moe_intermediate_size": 2**20,
    "num_attention_heads": 2**12,
    "n_head": 2**12,
    "num_key_value_heads": 2**12,
    "head_dim": 2**14,
    "vocab_size": 2**23,
}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    """(key, value) of the first of ``keys`` set (not null) in ``config``."""
    return next(((key, config[key]) for key in keys if config.get(key) is not None), None)


def _whole(source: str, key: str, value: Any, lowest: int, highest: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{source}: {key!r} must be a whole number >= {lowest}, not {_shown(value)}")
    if not lowest <= value <= highest:
        raise InputError(f"{source}: {key!r} is {_shown(value)}; {why}")
    return value


def _counts(source: str, key: str, value: Any, lowest: int, highest: int, why: str) -> list[int]:
    """A whole number, or a list of them (one per layer, as a few families write it), each within bounds."""
    values = value if isinstance(value, list) and value else [value]
    return [_whole(source, key, one, lowest, highest, why) for one in values]


def _check_moe(config: dict[str, Any], source: str, layers: int) -> None:
    if config.get("is_moe") is False:  # a family that builds dense unless told (Doge): its expert keys are unused
        return
    experts = _first(config, EXPERT_KEYS)
    top_k = _first(config, TOP_K_KEYS)
    per_token = [] if top_k is None else _counts(source, top_k[0], top_k[1], 0, MAX_EXPERTS, "too many experts")
    if experts is None:
        return
    key, value = experts
    counts = _counts(source, key, value, 0, MAX_EXPERTS, f"a model has at most {MAX_EXPERTS} experts per layer")
    if max(counts) == 0:  # transformers builds some families dense with 0 experts, but only routing to none
        if per_token and max(per_token) == 0:
            return
        routed = f", but {top_k[0]!r} sends each token to {max(per_token)}" if top_k else ""
        raise InputError(f"{source}: {key!r} is 0{routed}: a mixture-of-experts model needs at least 1 expert")
    if layers and max(counts) * layers > MAX_EXPERT_LAYERS:
        raise InputError(
            f"{source}: {max(counts)} experts x {layers} layers = {max(counts) * layers} expert modules; "
            f"a model has at most {MAX_EXPERT_LAYERS}"
        )
    if top_k is not None and (max(per_token) > min(counts) or min(per_token) < 1):
        raise InputError(
            f"{source}: {top_k[0]!r} is {_shown(top_k[1])}, but each token goes to 1 to {key} = {_shown(value)} experts"
        )


def _check_one(config: dict[str, Any], source: str) -> None:
    layers = 0
    found = _first(config, LAYER_KEYS)
    if found is not None:
        key, value = found
        why = f"a model has 1 to {MAX_LAYERS} decoder layers (the deepest released model has about 130)"
        layers = _whole(source, key, value, 1, MAX_LAYERS, why)
    for key, highest in WIDTH_MAXIMA.items():  # other types are left to the formulas and transformers
        value = config.get(key)
        for one in value if isinstance(value, list) else [value]:
            if isinstance(one, int) and not isinstance(one, bool) and not 0 < one <= highest:
                raise InputError(f"{source}: {key!r} is {_shown(one)}; a model has 1 to {highest}")
    _check_moe(config, source, layers)


def check_config_bounds(config: dict[str, Any], source: str) -> None:
    """InputError (one line naming ``source`` and the key) when a model config's layers, widths, vocabulary,
    heads or experts are not whole numbers within the maxima above, when a mixture-of-experts config has no
    expert or routes a token to more experts than it has, or when its ``text_config`` is not an object."""
    _check_one(config, source)
    text = config.get("text_config")
    if text is None:
        return
    if not isinstance(text, dict):
        raise InputError(f"{source}: 'text_config' must be a JSON object (the text model's config), not {_shown(text)}")
    _check_one(text, f"{source} (text_config)")

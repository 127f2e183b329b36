"""The kernels a decoder layer launches and the tensors the optimizer walks, counted on transformers' own code.

``search.model.kernels.layer_kernels`` and ``search.model.passes.trainable_tensors`` are counts read off each
family's modeling code. Here a real transformers model of the family (the catalog config at a tiny width, bf16,
sdpa) runs a forward under a ``TorchDispatchMode`` that counts every aten operator that launches a kernel (views
and metadata left out); the difference between two depths is one layer's count. The catalog's count must match
within what the CPU and CUDA paths differ by (the head-merge copy, a sliding-window mask's three conversions),
and the parameter tensors exactly.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from search.model.kernels import layer_kernels
from search.model.passes import trainable_tensors
from store.models import get_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

NO_KERNEL = {
    "view", "_unsafe_view", "transpose", "t", "as_strided", "slice", "select", "unsqueeze", "squeeze", "expand",
    "permute", "reshape", "alias", "detach", "empty", "empty_strided", "empty_like", "split", "split_with_sizes",
    "unbind", "chunk", "narrow", "_reshape_alias", "lift_fresh", "new_empty", "new_empty_strided", "set_",
    "resize_", "unfold", "diagonal", "is_same_size", "_local_scalar_dense", "view_as", "expand_as",
}  # fmt: skip


class LaunchCounter(TorchDispatchMode):
    """Counts the aten operators that reach the dispatcher and launch a kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.launches = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func._schema.name.split("::")[-1] not in NO_KERNEL:
            self.launches += 1
        return func(*args, **(kwargs or {}))


def _tiny(name: str, layers: int) -> Any:
    spec = get_model(name)
    values = {k: v for k, v in spec.hf_config.items() if k not in ("model_type", "layer_types")}
    heads = values["num_attention_heads"]
    values.update(num_hidden_layers=layers, vocab_size=256, intermediate_size=128)
    if values.get("head_dim"):
        values.update(head_dim=16, hidden_size=64)
    else:
        values.update(hidden_size=16 * heads)
    if "word_embed_proj_dim" in values:  # OPT: no projection in or out at the model's own width
        values["word_embed_proj_dim"] = values["hidden_size"]
    if values.get("sliding_window"):
        values["sliding_window"] = 8  # below the sequence, so the sliding layers take their mask
    config = transformers.AutoConfig.for_model(spec.model_type, **values)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    return model.train()


def _forward_launches(name: str, layers: int) -> int:
    model = _tiny(name, layers)
    ids = torch.randint(3, 256, (1, 16))
    counter = LaunchCounter()
    with counter:
        model(input_ids=ids, labels=ids, use_cache=False)
    return counter.launches


# (model, the depths whose difference is a whole number of the family's layer pattern, allowed difference)
CASES = [
    ("gemma-3-1b", (6, 12), 3),  # five sliding layers to one global: 3 mask conversions on a sliding layer
    ("qwen3-4b", (2, 4), 2),
    ("qwen2.5-1.5b", (2, 4), 2),
    ("llama-3.2-1b", (2, 4), 2),
]


@pytest.mark.parametrize(("name", "depths", "slack"), CASES)
def test_a_layer_launches_what_the_catalog_counts(name: str, depths: tuple[int, int], slack: int) -> None:
    low, high = depths
    per_layer = (_forward_launches(name, high) - _forward_launches(name, low)) / (high - low)
    assert abs(layer_kernels(get_model(name), 0) - per_layer) <= slack, per_layer


@pytest.mark.parametrize("name", [case[0] for case in CASES] + ["opt-125m"])
def test_the_optimizer_walks_every_parameter_tensor(name: str) -> None:
    spec = get_model(name)
    model = _tiny(name, spec.num_layers)
    tensors = Counter(p.requires_grad for p in model.parameters())[True]
    assert trainable_tensors(spec, 0) == tensors

"""The model catalog against transformers itself: every spec's counts equal a meta-device build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from store.errors import InputError
from store.model_catalog import CATALOG
from store.models import get_model, model_names, spec_from_hf_config
from store.records import ModelSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def _unique_params(module: Any) -> int:
    """Parameters of ``module``, each tensor counted once however often it is shared."""
    seen: dict[int, int] = {}
    for _, param in module.named_parameters(remove_duplicate=False):
        seen[id(param)] = param.numel()
    return sum(seen.values())


def _first_block(model: Any, num_layers: int) -> Any:
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module[0]
    raise AssertionError("no ModuleList of decoder blocks found")


def _meta_counts(spec: ModelSpec) -> dict[str, int]:
    """Counts read off the real transformers models built on the meta device from ``spec.hf_config``."""
    config = transformers.AutoConfig.for_model(**spec.hf_config)
    with torch.device("meta"):
        lm = transformers.AutoModelForCausalLM.from_config(config)
        backbone = transformers.AutoModel.from_config(config)
    head = lm.get_output_embeddings()
    tied = head.weight is lm.get_input_embeddings().weight
    return {
        "total": _unique_params(lm),
        "layer": _unique_params(_first_block(lm, spec.num_layers)),
        "lm_head": 0 if tied else _unique_params(head),
        "backbone": _unique_params(backbone),
        "embedding": _unique_params(lm.get_input_embeddings()),
    }


def _assert_matches_transformers(spec: ModelSpec) -> None:
    got = _meta_counts(spec)
    assert spec.total_params == got["total"]
    assert spec.layer_params == got["layer"]
    assert spec.lm_head_params == got["lm_head"]
    assert spec.backbone_params == got["backbone"]
    assert spec.embedding_params >= got["embedding"]  # plus learned positions and OPT projections


@pytest.mark.parametrize("name", model_names())
def test_catalog_counts_equal_meta_instantiation(name: str) -> None:
    _assert_matches_transformers(get_model(name))


# Published totals (model cards / safetensors metadata), to pin the catalog data itself.
PUBLISHED = {
    "opt-125m": 125_239_296,
    "opt-350m": 331_196_416,
    "opt-1.3b": 1_315_758_080,
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-70b": 68_976_648_192,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_matches_published_totals(name: str) -> None:
    assert get_model(name).total_params == PUBLISHED[name]


def test_catalog_fields_follow_the_architecture() -> None:
    opt350 = get_model("opt-350m")
    assert opt350.embedding_params == 50272 * 512 + 2050 * 1024 + 2 * 512 * 1024
    assert (opt350.max_positions, opt350.tie_word_embeddings, opt350.gated_mlp) == (2048, True, False)
    assert opt350.lm_head_params == 0 and opt350.dropout == 0.1
    llama = get_model("llama-3.1-8b")
    assert (llama.num_kv_heads, llama.head_dim, llama.gated_mlp, llama.dropout) == (8, 128, True, 0.0)
    assert llama.lm_head_params == 128256 * 4096 and llama.hf_config["model_type"] == "llama"
    assert get_model("gpt2").intermediate_size == 3072 and get_model("gpt2").max_positions == 1024
    assert get_model("qwen2.5-0.5b").lm_head_params == 0


def test_names_are_unique_and_in_catalog_order() -> None:
    names = model_names()
    assert names == [name for name, _, _ in CATALOG]
    keys = [alias.lower() for name, aliases, _ in CATALOG for alias in (name, *aliases)]
    assert len(keys) == len(set(keys))
    assert {"opt-1.3b", "gpt2", "llama-2-7b", "llama-3.1-8b", "mistral-7b", "qwen2.5-7b"} <= set(names)


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("facebook/opt-1.3b", "opt-1.3b"),
        ("OPT-1.3B", "opt-1.3b"),
        ("openai-community/gpt2", "gpt2"),
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("llama-3-8b", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3-8B", "llama-3.1-8b"),
        ("llama-3-70b", "llama-3.1-70b"),
        ("llama-3-1b", "llama-3.2-1b"),
        ("llama-3-3b", "llama-3.2-3b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
        (" gpt2-XL ", "gpt2-xl"),
    ],
)
def test_aliases_resolve_to_the_canonical_spec(alias: str, canonical: str) -> None:
    spec = get_model(alias)
    assert spec.name == canonical
    assert spec == get_model(canonical)
    assert spec.hf_config == get_model(canonical).hf_config


def test_returned_configs_are_copies() -> None:
    get_model("llama-3.1-8b").hf_config["rope_scaling"]["factor"] = 1.0
    assert get_model("llama-3.1-8b").hf_config["rope_scaling"]["factor"] == 8.0


TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "attention_bias": True,
    "mlp_bias": True,
    "architectures": ["LlamaForCausalLM"],
    "torch_dtype": "bfloat16",
    "_name_or_path": "someone/tiny-llama",
    "transformers_version": "4.45.0",
}


def test_local_config_file_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    file = folder / "config.json"
    file.write_text(json.dumps(TINY_LLAMA))
    from_file = get_model(str(file))
    from_folder = get_model(str(folder))
    assert from_file.name == str(file) and from_folder.name == str(folder)
    assert from_file.total_params == from_folder.total_params
    assert from_file.num_kv_heads == 2 and from_file.max_positions == 256
    _assert_matches_transformers(from_file)
    _assert_matches_transformers(from_folder)


# Configs that exercise the less common switches and the class defaults for missing keys.
VARIANTS: dict[str, dict[str, Any]] = {
    "opt-no-bias-no-affine-untied": {
        "model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "ffn_dim": 128, "vocab_size": 500, "max_position_embeddings": 64, "enable_bias": False,
        "layer_norm_elementwise_affine": False, "tie_word_embeddings": False,
    },
    "opt-proj-post-ln-untied": {
        "model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "ffn_dim": 128, "vocab_size": 500, "word_embed_proj_dim": 32, "do_layer_norm_before": False,
        "tie_word_embeddings": False,
    },
    "opt-removed-final-norm": {
        "model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "ffn_dim": 128, "vocab_size": 500, "_remove_final_layer_norm": True,
    },
    "gpt2-n-inner-untied-hidden-size-key": {
        "model_type": "gpt2", "hidden_size": 64, "n_layer": 2, "n_head": 4, "n_inner": 100,
        "vocab_size": 500, "n_positions": 128, "tie_word_embeddings": False,
    },
    "gpt2-cross-attention": {
        "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 500,
        "add_cross_attention": True,
    },
    "llama-kv-null-tied": {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": None, "vocab_size": 500, "tie_word_embeddings": True,
    },
    "mistral-defaults-head-dim": {
        "model_type": "mistral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 16, "head_dim": 8, "vocab_size": 500, "attention_bias": True,
    },
    "qwen2-default-kv-heads": {
        "model_type": "qwen2", "hidden_size": 128, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 64, "vocab_size": 500,
    },
    "qwen2-explicit-head-dim-tied": {
        "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 500,
        "tie_word_embeddings": True,
    },
}  # fmt: skip


@pytest.mark.parametrize("label", sorted(VARIANTS))
def test_config_variants_equal_meta_instantiation(label: str) -> None:
    _assert_matches_transformers(spec_from_hf_config(label, VARIANTS[label]))


def test_class_defaults_for_missing_keys() -> None:
    assert spec_from_hf_config("m", VARIANTS["mistral-defaults-head-dim"]).num_kv_heads == 8
    assert spec_from_hf_config("q", VARIANTS["qwen2-default-kv-heads"]).num_kv_heads == 32
    assert spec_from_hf_config("l", VARIANTS["llama-kv-null-tied"]).num_kv_heads == 4
    gpt2 = spec_from_hf_config("g", VARIANTS["gpt2-cross-attention"])
    assert (gpt2.max_positions, gpt2.dropout, gpt2.tie_word_embeddings) == (1024, 0.1, True)
    opt = spec_from_hf_config("o", VARIANTS["opt-removed-final-norm"])
    assert (opt.max_positions, opt.dropout, opt.tie_word_embeddings) == (2048, 0.1, True)


def test_unknown_name_suggests_close_names() -> None:
    with pytest.raises(InputError, match=r"unknown model 'opt-1\.3'.*did you mean .*opt-1\.3b") as err:
        get_model("opt-1.3")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="did you mean .*llama-3.1-8b"):
        get_model("llama-3.1-8")
    with pytest.raises(InputError, match="unknown model 'zzzz'"):
        get_model("zzzz")
    with pytest.raises(InputError, match="model name is empty"):
        get_model(" ")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('{"hidden_size": 64}', "missing required key(s) 'model_type'"),
        # no formula: the planner traces it with transformers (tests/planner/test_model_shapes.py)
        ('{"model_type": "bert", "hidden_size": 64}', "model_type 'bert' has to be traced with transformers"),
        ('{"model_type": ["llama"]}', "model_type ['llama'] is not supported"),
        (
            '{"model_type": "llama", "hidden_size": 64, "vocab_size": 10}',
            "missing required key(s) 'intermediate_size', 'num_hidden_layers', 'num_attention_heads'",
        ),
        (
            '{"model_type": "gpt2", "hidden_size": 64}',
            "missing required key(s) 'n_layer', 'n_head', 'vocab_size'",
        ),
        (
            json.dumps({**TINY_LLAMA, "num_hidden_layers": "3"}),
            "'num_hidden_layers' must be a whole number >= 1, not '3'",
        ),
        (json.dumps({**TINY_LLAMA, "num_key_value_heads": 3}), "not a multiple of num_key_value_heads 3"),
        (
            json.dumps({**TINY_LLAMA, "tie_word_embeddings": "no"}),
            "'tie_word_embeddings' must be true or false",
        ),
        (json.dumps({**TINY_LLAMA, "attention_dropout": 2}), "'attention_dropout' must be a probability"),
    ],
)
def test_malformed_config_names_file_and_problem(tmp_path: Path, content: str, problem: str) -> None:
    file = tmp_path / "config.json"
    file.write_text(content)
    for given in (str(file), str(tmp_path)):
        with pytest.raises(InputError) as err:
            get_model(given)
        message = str(err.value)
        assert message.startswith(str(file)) and problem in message and "\n" not in message


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="folder has no config.json"):
        get_model(str(tmp_path))


def test_spec_from_hf_config_rejects_non_dict() -> None:
    with pytest.raises(InputError, match="must be a JSON object"):
        spec_from_hf_config("x", ["model_type"])  # type: ignore[arg-type]


def test_import_stays_light() -> None:
    code = "import store.models, sys; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]

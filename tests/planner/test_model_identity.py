"""One model, one identity (issue 32, item 6): a model is its shape (its config), never the name it is called by.

The same shape gives the same plan whatever it is called (a catalog alias, a local ``config.json`` copied from
the hub with its labels) and whatever the store has cached; where two configs are different models the plan says
what differs, and why its activations come from the formulas. Real pieces: the catalog's configs, the CLI as
users run it, and a real SQLite plan database.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import run_main
from tiny_models import QWEN3_NEXT

import planner.job.model_shapes
from planner.job.model_shapes import installed_versions, resolve_model
from store.db import open_storage
from store.model_shape import catalog_shape, shape_key
from store.models import catalog_configs

JOB = ("--gpu", "A100-80G", "--gpus", "8", "--batch", "64", "--workload", "sft", "--seq-len", "4096")
# What a config.json from the hub carries beside the shape: labels that make no tensor
LABELS = {"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", "transformers_version": "4.43.0",
          "use_cache": True}  # fmt: skip


def _write(folder: Path, config: dict[str, Any]) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _plan(model: str, db: Path) -> dict[str, Any]:
    result = run_main(["recommend", "--model", model, *JOB, "--json", "--db", str(db)])
    assert result.rc == 0, result.err
    doc: dict[str, Any] = result.json()
    return doc


def test_a_hub_copy_of_a_catalog_config_is_that_model(tmp_path: Path) -> None:
    """Meta's Llama-3.1-8B config.json (the catalog's config plus its labels) plans as ``llama-3-8b`` does:
    before, a local llama config was counted by the formulas (67.85 against 68.91 GiB for this job)."""
    db = tmp_path / "plans.db"
    local = _write(tmp_path / "llama31", {**catalog_configs()["llama-3.1-8b"], **LABELS})
    by_name, by_file = _plan("llama-3-8b", db), _plan(local, db)
    assert by_file["predicted"]["peak_reserved_bytes"] == by_name["predicted"]["peak_reserved_bytes"]
    assert by_file["strategy"] == by_name["strategy"]
    assert by_file["workload"]["shapes"]["actor"]["activations"] == "traced"
    assert any("same shape as the catalog's llama-3.1-8b" in line for line in by_file["readings"])
    assert any("llama-3-8b is the catalog's llama-3.1-8b" in line for line in by_name["readings"])


def test_llama_3_0_differs_in_rotary_keys_only_and_the_plan_says_so(tmp_path: Path) -> None:
    """Llama 3.0's own config (8k context, no rope scaling) is the 3.1 shape: the same bytes, the two keys named."""
    db = tmp_path / "plans.db"
    config = {**catalog_configs()["llama-3.1-8b"], **LABELS, "max_position_embeddings": 8192, "rope_scaling": None}
    doc = _plan(_write(tmp_path / "llama30", config), db)
    assert doc["predicted"]["peak_reserved_bytes"] == _plan("llama-3.1-8b", db)["predicted"]["peak_reserved_bytes"]
    said = " ".join(doc["readings"])
    assert "max_position_embeddings 8192 here, 131072 in llama-3.1-8b" in said
    assert "rope_scaling" in said and "change no tensor's size" in said


def test_another_shape_says_what_differs_and_why_the_formula(tmp_path: Path) -> None:
    config = {**catalog_configs()["llama-3.1-8b"], "intermediate_size": 11008}
    model = _write(tmp_path / "narrow", config)
    doc = _plan(model, tmp_path / "plans.db")
    actor = doc["workload"]["shapes"]["actor"]
    assert actor["activations"] == "formula"
    assert "intermediate_size 11008 here, 14336 in llama-3.1-8b" in actor["activations_reason"]
    text = run_main(["recommend", "--model", model, *JOB, "--db", str(tmp_path / "plans.db")])
    assert text.rc == 0, text.err
    assert "from the formula because" in " ".join(text.out.split()) and "intermediate_size" in text.out


def test_relabelled_config_reads_the_shape_cached_for_its_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's shape cache is keyed by the shape: a config that differs only in labels (token ids, dtype, the
    writing library) reads the entry cached for the first, in a real SQLite database, and traces nothing."""
    db = str(tmp_path / "shapes.db")
    first = {**catalog_configs()["qwen3-0.6b"], "rms_norm_eps": 1e-5}  # not a catalog shape: traced and cached
    relabelled = {**first, "eos_token_id": 151643, "torch_dtype": "float32", "transformers_version": "4.51.0"}
    shape = catalog_shape("qwen3-0.6b")
    assert shape is not None
    with open_storage(db) as storage:
        storage.save_model_shape(shape_key(first, installed_versions()), shape)

    def no_trace(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("traced again although this shape is cached")

    monkeypatch.setattr(planner.job.model_shapes, "_trace", no_trace)
    monkeypatch.setattr(planner.job.model_shapes, "_with_terms", no_trace)
    spec = resolve_model(_write(tmp_path / "relabelled", relabelled), [], db, ("bf16", "sdpa"))
    assert spec.activation_terms == shape["activation_terms"]
    assert shape_key(first, installed_versions()) == shape_key(relabelled, installed_versions())
    assert shape_key(first, installed_versions()) != shape_key({**first, "rms_norm_eps": 1e-6}, installed_versions())


def _qwen3_next_plan(tmp_path: Path) -> tuple[list[str], dict[str, Any]]:
    """(recommend's arguments, the JSON's actor shape) of a plan of the tiny Qwen3-Next config in ``tmp_path``."""
    folder = tmp_path / "qwen3-next-tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_NEXT))
    args = [
        "recommend",
        "--model",
        str(folder),
        "--gpu-mem",
        "24G",
        "--workload",
        "sft",
        "--db",
        str(tmp_path / "p.db"),
    ]
    result = run_main([*args, "--json"])
    assert result.rc == 0, result.err
    return args, result.json()["workload"]["shapes"]["actor"]


def test_a_hybrid_family_is_traced_and_says_how(tmp_path: Path) -> None:
    """Qwen3-Next's hybrid attention is traced per kind of layer: the JSON says which Gated DeltaNet code the
    linear-attention layers ran (transformers' torch fallback, flash-linear-attention not being installed)."""
    args, actor = _qwen3_next_plan(tmp_path)
    assert actor["activations"] != "formula"
    assert "3 linear_attention + 1 full_attention layers" in actor["activations_reason"]
    assert "linear-attention layers through transformers' torch fallback" in actor["activations_reason"]


def test_an_untraceable_model_plans_from_the_formula_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace that fails (here made to, as an op without a meta kernel would): the plan says so and why, in the
    text and the JSON."""
    import probes.trace.terms

    def no_meta_kernel(*args: object, **kwargs: object) -> None:
        raise NotImplementedError("no meta kernel for this op")

    monkeypatch.setattr(probes.trace.terms, "trace_terms", no_meta_kernel)
    args, actor = _qwen3_next_plan(tmp_path)
    assert actor["activations"] == "formula"
    assert actor["activations_reason"] == (
        "the trace of qwen3_next (2-sdpa) failed: NotImplementedError: no meta kernel for this op"
    )
    text = run_main(args)
    assert "from the formula because the trace of qwen3_next" in " ".join(text.out.split())

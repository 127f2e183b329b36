"""Any architecture transformers knows plans: a local config without a formula is traced once, then cached.

Real pieces throughout: the config is read by transformers on the meta device, the shape goes into a real
SQLite database, and a later plan in a fresh interpreter reads it without importing torch or transformers.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO, CliResult, subprocess_env

import probes.model.shape
import probes.trace.terms
from planner.job.model_shapes import installed_versions, resolve_model
from store.db import open_storage
from store.model_shape import shape_key
from store.records import ModelSpec

# A small Qwen3-MoE (every layer sparse, 8 experts, 2 per token): the family the formulas never knew.
QWEN3_MOE = {
    "model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 768, "moe_intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 4096, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip


@pytest.fixture
def moe_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "qwen3-moe-tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_MOE))
    return folder


SETTING = ("bf16", "sdpa")  # what recommend's default job on an H100 needs


@dataclass(frozen=True)
class FirstUse:
    """The first plan of QWEN3_MOE's folder on an empty database: what it traced, read and said on stderr."""

    folder: Path
    db: Path
    spec: ModelSpec
    readings: list[str]
    stderr: str


@pytest.fixture(scope="module")
def first_use(tmp_path_factory: pytest.TempPathFactory) -> FirstUse:
    """QWEN3_MOE traced once for SETTING into an empty database (keyed by the config's shape, not its folder),
    with the default note (stderr): the tests that start from a cached shape copy it instead of tracing again."""
    folder = tmp_path_factory.mktemp("traced") / "qwen3-moe-tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_MOE))
    db = folder.parent / "shapes.db"
    readings: list[str] = []
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        spec = resolve_model(str(folder), readings, str(db), SETTING)
    return FirstUse(folder, db, spec, readings, said.getvalue())


@pytest.fixture(scope="module")
def traced_db(first_use: FirstUse) -> Path:
    """A database holding the shape of QWEN3_MOE traced once for SETTING."""
    return first_use.db


def _cached(traced_db: Path, tmp_path: Path) -> str:
    """A copy of the traced database in ``tmp_path``."""
    copy = tmp_path / "shapes.db"
    shutil.copyfile(traced_db, copy)
    return str(copy)


def _no_trace(*args: Any, **kwargs: Any) -> dict[str, Any]:
    raise AssertionError("traced again although the shape is cached")


def test_first_use_traces_and_says_so_then_the_cache_answers(
    first_use: FirstUse, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = first_use.spec
    assert "on the meta device" in first_use.stderr
    assert set(first.activation_terms) == {"2-sdpa"}  # only the setting the plan needs is traced
    assert "traced now" in first_use.readings[-1]
    h, experts, width = 256, 8, 128
    assert first.expert_params == 4 * experts * 3 * h * width
    assert first.num_experts == experts and first.experts_per_token == 2

    db = _cached(first_use.db, tmp_path)
    monkeypatch.setattr(probes.model.shape, "trace_model_shape", _no_trace)
    monkeypatch.setattr(probes.trace.terms, "trace_all_terms", _no_trace)
    again: list[str] = []
    assert resolve_model(str(first_use.folder), again, db, SETTING) == first
    assert "cached shape" in again[-1] and capsys.readouterr().err == ""


def test_a_new_setting_traces_its_terms_once_and_keeps_the_others(
    moe_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    traced_db: Path,
) -> None:
    db = _cached(traced_db, tmp_path)
    sdpa = resolve_model(str(moe_dir), None, db, SETTING)
    notes: list[str] = []  # the caller's on_note gets the first-use line, as every other progress line of memplan
    eager = resolve_model(str(moe_dir), None, db, ("bf16", "eager"), on_note=notes.append)
    assert set(eager.activation_terms) == {"2-sdpa", "2-eager"}
    assert eager.activation_terms["2-sdpa"] == sdpa.activation_terms["2-sdpa"]
    assert any("2-eager" in line and "first use" in line for line in notes) and capsys.readouterr().err == ""
    resolve_model(str(moe_dir), None, db, ("fp32", "eager"))  # grouped expert GEMMs take 16-bit inputs only
    assert "4-eager" in capsys.readouterr().err  # no on_note: stderr
    with open_storage(db) as storage:
        cached = storage.load_model_shape(shape_key(QWEN3_MOE, installed_versions()))
    assert cached is not None and set(cached["activation_unfitted"]) == {"4-eager"}
    monkeypatch.setattr(probes.trace.terms, "trace_all_terms", _no_trace)
    for setting in (SETTING, ("bf16", "eager"), ("fp32", "eager")):  # traced, or found untraceable: not again
        resolve_model(str(moe_dir), None, db, setting)


def test_the_cache_key_follows_the_library_versions(traced_db: Path) -> None:
    db = str(traced_db)
    newer = {**installed_versions(), "transformers": "99.0.0"}
    with open_storage(db) as storage:
        assert storage.load_model_shape(shape_key(QWEN3_MOE, installed_versions())) is not None
        assert storage.load_model_shape(shape_key(QWEN3_MOE, newer)) is None


def test_a_damaged_cache_entry_is_traced_again(moe_dir: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "shapes.db")
    with open_storage(db) as storage:
        storage.save_model_shape(shape_key(QWEN3_MOE, installed_versions()), {"model_type": "qwen3_moe"})
    spec = resolve_model(str(moe_dir), None, db, SETTING)
    assert spec.shape_source == "traced" and spec.num_experts == 8


def test_a_cached_config_plans_in_a_fresh_interpreter_without_torch_or_transformers(
    moe_dir: Path, tmp_path: Path, traced_db: Path
) -> None:
    db = _cached(traced_db, tmp_path)  # traced in this interpreter: the fresh one below only reads it
    script = (
        "import sys, json, planner\n"
        f"plan = planner.recommend({str(moe_dir)!r}, gpu_mem='24G', cpu_mem='64G', workload='sft', db={db!r})\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'fits': plan.fits, 'workload': plan.model_dump()['workload']}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert result["fits"] is True
    model = result["workload"]["shapes"]["actor"]
    assert model["shape_source"] == "traced" and model["experts"] == {"routed": 8, "per_token": 2}


def test_the_cli_plans_a_local_moe_config(moe_dir: Path, tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    """``planner recommend --model DIR`` on an empty database traces the config and says so. In this process (the
    CLI's own ``main``): a fresh interpreter's plan of a local config is the test above's, and ``python -m planner``
    as a process is test_cli_process's; a process here paid torch's and transformers' imports again."""
    db = tmp_path / "plans.db"
    done = cli("recommend", "--model", moe_dir, "--gpu-mem", "80G", "--cpu-mem", "64G", "--workload", "sft",
               "--db", db, "--json")  # fmt: skip
    assert done.rc == 0, done.err
    plan = done.json()
    assert plan["fits"] is True and plan["workload"]["shapes"]["actor"]["shape_source"] == "traced"
    assert "on the meta device" in done.err


def test_a_model_whose_class_refuses_sdpa_is_planned_with_the_eager_attention_it_runs() -> None:
    from planner import recommend
    from store.models import get_model

    assert get_model("gemma-2-2b").attn_impls == ("eager", "flash_attention_2")  # softcapping: no sdpa
    assert get_model("llama-3.2-1b").attn_impls == ("eager", "sdpa", "flash_attention_2")
    plan = recommend("gemma-2-2b", gpu_mem="80G", cpu_mem="64G", workload="sft", save=False)
    document = plan.model_dump()
    assert document["workload"]["attn_impl"] == "eager"
    assert any("runs no sdpa" in line for line in document["readings"])
    assert document["workload"]["shapes"]["actor"]["activations"] == "traced"  # its eager trace ships
    llama = recommend("llama-3.2-1b", gpu_mem="80G", cpu_mem="64G", workload="sft", save=False).model_dump()
    assert llama["workload"]["attn_impl"] == "sdpa"

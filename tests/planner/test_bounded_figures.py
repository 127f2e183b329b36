"""Every byte figure of a plan is finite and at most what the hardware holds (issue 42: "4252017667.50 GiB").

The README's RLHF example once printed a yardstick ("if memory were unlimited") whose rollout engine had been
given unlimited memory, its KV cache filling it; the JSON Schemas accepted it. Now the yardstick's engine keeps
a real size, and the schemas bound every byte field (planner.report.bounded).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from planner import predict, recommend
from planner.report.bounded import MAX_PLAN_BYTES
from planner.schema import committed_schema

SIGNED_SUFFIX = "_saved_bytes"  # a byte figure that is a difference of two sizes (empty_cache_effect)
README_RLHF = {"critic_model": "opt-350m", "reward_model": "opt-350m", "gpu_mem": "24G", "gpus": 8}


def _byte_figures(document: Any, key: str = "") -> Iterator[tuple[str, int]]:
    """(key, value) of every integer under a ``*_bytes`` key or in a ``breakdown`` of ``document``."""
    if isinstance(document, dict):
        for name, value in document.items():
            inner = name if name.endswith("_bytes") or name in ("breakdown", "host_breakdown", "host_phases") else key
            yield from _byte_figures(value, inner)
    elif isinstance(document, list):
        for item in document:
            yield from _byte_figures(item, key)
    elif isinstance(document, int) and not isinstance(document, bool) and key:
        yield key, document


@pytest.fixture(scope="module")
def readme_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = Path(tmp_path_factory.mktemp("db")) / "plans.sqlite3"
    return recommend("opt-1.3b", db=str(db), save=False, calibration="none", **README_RLHF).model_dump()


def test_the_readme_rlhf_plan_holds_no_unbounded_figure(readme_plan: dict[str, Any]) -> None:
    gpu = readme_plan["hardware"]["gpu_memory_bytes"]
    jsonschema.Draft202012Validator(committed_schema("plan")).validate(readme_plan)
    figures = list(_byte_figures(readme_plan))
    # a saving is a difference: an empty_cache placement can leave more reserved than never calling it (the text
    # says "more"), so its figure is bounded in size, not in sign; every other figure is a size
    sizes = [abs(value) if name.endswith(SIGNED_SUFFIX) else value for name, value in figures]
    assert sizes and all(0 <= size <= MAX_PLAN_BYTES for size in sizes), figures
    for block in (readme_plan, *readme_plan["alternatives"]):
        predicted = block.get("predicted", {})
        if block.get("fits", predicted.get("peak_reserved_bytes", 0) <= predicted.get("gpu_budget_bytes", 0)):
            assert predicted["peak_reserved_bytes"] <= gpu
    fastest = readme_plan["fastest_ignoring_memory"]["predicted"]
    engine = fastest["rollout"]
    if engine:  # the yardstick's engine at a real size: its KV cache and its bytes fit on one GPU
        assert engine["kv_cache_bytes"] <= gpu and engine["awake_bytes"] <= gpu
    assert fastest["step_time_s"] <= readme_plan["predicted"]["step_time_s"]  # a yardstick no slower than the plan


def test_an_unbounded_document_fails_the_schema() -> None:
    document = predict(
        "opt-125m", {"zero_stage": 2, "micro_batch": 2}, gpu_mem="8G", workload="sft", calibration="none"
    ).model_dump()
    schema = committed_schema("prediction")
    jsonschema.Draft202012Validator(schema).validate(document)
    unbounded = 4565569205981900800  # the README plan's peak reserved before issue 42
    for path in (("peak_reserved_bytes",), ("breakdown", "activations"), ("host_phases", "loading")):
        bad = copy.deepcopy(document)
        target = bad["predicted"]
        for name in path[:-1]:
            target = target[name]
        target[path[-1]] = unbounded
        assert not jsonschema.Draft202012Validator(schema).is_valid(bad), path
    bad = copy.deepcopy(document)
    bad["predicted"]["rollout"] = {"engine": "vllm", "kv_cache_bytes": unbounded}
    assert not jsonschema.Draft202012Validator(schema).is_valid(bad)

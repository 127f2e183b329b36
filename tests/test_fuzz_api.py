"""Property-based fuzzing of the Python API: any input gives a result or the project's one-line InputError.

Covered: the size parser, ``recommend``, ``predict``, ``check`` (ds_config documents of any shape) and the
building of probe requests (``probes.model.build.plan_from_request``). Any other exception fails the test.

CI runs the ``ci`` profile (derandomized, a bounded number of examples: about a minute on 2 cores). Before
a release run the longer profile::

    HYPOTHESIS_PROFILE=release .venv/bin/python -m pytest tests/test_fuzz_api.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.errors import InputError

settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("release", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
JSON = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=30,
)
ODD_INTS = st.integers() | st.sampled_from([0, -1, 10**23, 2**63, 99999999999999])
ODD_TEXT = st.text(max_size=80) | st.sampled_from(["", "~nosuchuser/x", "24G", "nan", "inf", "9" * 300, "é" * 700])
SIZES = ODD_TEXT | ODD_INTS | st.sampled_from(["24G", "80GiB", "24576MiB", "1.5T"])
MODELS = st.sampled_from(["opt-125m", "opt-1.3b", "llama-3-8b", "nope", ""]) | ODD_TEXT
WORKLOADS = st.sampled_from(["sft", "reward", "dpo", "ppo", "remax", "grpo"]) | ODD_TEXT
JOB = st.fixed_dictionaries(
    {"gpu_mem": SIZES, "workload": WORKLOADS},
    optional={
        "batch": ODD_INTS,
        "seq_len": ODD_INTS,
        "gpus": ODD_INTS,
        "nodes": ODD_INTS,
        "cpu_mem": SIZES,
        "dtype": st.sampled_from(["bf16", "fp16", "fp32"]) | ODD_TEXT,
        "prompt_len": ODD_INTS,
        "gen_len": ODD_INTS,
        "gpu": ODD_TEXT,
        "node": st.sampled_from(["dgx-h100", "p4d.24xlarge", "workstation-4090", "dgx"]) | ODD_TEXT,
        "inter_node_gbps": st.floats() | ODD_INTS,
        "attn_impl": st.sampled_from(["eager", "sdpa", "flash_attention_2"]) | ODD_TEXT,
        "safety_margin": st.floats(),
    },
)


def _only_input_errors(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except InputError as exc:
        message = str(exc)
        assert message and "\n" not in message, repr(message)


@given(SIZES)
def test_size_parser(text: Any) -> None:
    from store.sizes import MAX_SIZE, parse_size

    try:
        value = parse_size(text, "--gpu-mem")
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(value, int) and 0 < value <= MAX_SIZE


@given(MODELS, JOB)
def test_recommend(tmp_path_factory: pytest.TempPathFactory, model: str, job: dict[str, Any]) -> None:
    from planner import recommend

    db = Path(tmp_path_factory.mktemp("fuzz")) / "plans.db"
    _only_input_errors(recommend, model, db=str(db), **job)


@given(MODELS, JOB, JSON)
def test_predict(model: str, job: dict[str, Any], strategy: Any) -> None:
    from planner import predict

    _only_input_errors(predict, model, strategy, **job)


@given(JOB, JSON)
def test_check(job: dict[str, Any], ds_config: Any) -> None:
    from planner import check

    _only_input_errors(check, ds_config, "opt-125m", **job)


@given(JSON, JSON, JSON, st.sampled_from(["cpu", "cuda", "tpu", ""]), ODD_INTS, ODD_INTS | st.none())
def test_probe_request_building(
    workload: Any, strategy: Any, hardware: Any, device: str, steps: Any, layers: Any
) -> None:
    from probes.model.build import plan_from_request
    from store.measurements import ProbeRequest

    def build() -> None:
        request = ProbeRequest(
            workload=workload, strategy=strategy, hardware=hardware, device=device, steps=steps, layers=layers
        )
        plan_from_request(request)

    _only_input_errors(build)

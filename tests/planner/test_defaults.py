"""Job defaults live once (``planner.job.inputs.JobSpec`` and its named constants): every command's options,
the Python API and the README say the same. Old divergence: ``planner.recommend()`` defaulted to sft while
``planner recommend`` defaulted to ppo, and ``planner probe`` to sft."""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import pytest
import typer
from planner_helpers import REPO

import planner
from planner.cli import app
from planner.job.inputs import JobSpec, resolve
from planner.job.spec import (
    CONFIG_WORKLOAD,
    DEFAULT_ATTN_IMPL,
    DEFAULT_BATCH_PER_GPU,
    DEFAULT_GEN_LEN,
    DEFAULT_GPUS,
    DEFAULT_GRPO_SAMPLES,
    DEFAULT_PROMPT_LEN,
    DEFAULT_SEQ_LEN,
)

JOB_COMMANDS = ("recommend", "predict", "check", "probe")
SPEC_DEFAULTS = {f.name: f.default for f in dataclasses.fields(JobSpec) if f.default is not dataclasses.MISSING}


def _cli_defaults(command: str) -> dict[str, Any]:
    group = typer.main.get_command(app)
    return {p.name: p.default for p in group.commands[command].params if p.name in SPEC_DEFAULTS}


def _readme_defaults() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    line = text[text.index("Job defaults") :].split("\n\n", 1)[0]
    return dict(re.findall(r"`--([a-z-]+) ([^`\s]+)`", line))


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_every_command_offers_jobspec_defaults(command: str) -> None:
    expected = dict(SPEC_DEFAULTS, workload=CONFIG_WORKLOAD) if command == "check" else SPEC_DEFAULTS
    offered = _cli_defaults(command)
    assert offered, command
    assert offered == {name: expected[name] for name in offered}


def test_the_api_takes_its_defaults_from_jobspec() -> None:
    for function in (planner.recommend, planner.predict, planner.check, planner.probe):
        own = {p.name for p in inspect.signature(function).parameters.values()}
        assert not own & (set(SPEC_DEFAULTS) - {"model"}), function.__name__  # no second copy of a default
    job = resolve(JobSpec(model="opt-1.3b", gpu_mem="24G", cpu_mem="64G"))
    assert job.workload.kind == "ppo" == SPEC_DEFAULTS["workload"]
    assert (job.workload.prompt_len, job.workload.gen_len) == (DEFAULT_PROMPT_LEN, DEFAULT_GEN_LEN)
    assert job.workload.global_batch == DEFAULT_BATCH_PER_GPU
    sft = resolve(JobSpec(model="opt-1.3b", gpu_mem="24G", cpu_mem="64G", workload="sft"))
    assert sft.workload.seq_len == DEFAULT_SEQ_LEN
    grpo = resolve(JobSpec(model="opt-1.3b", gpu_mem="24G", cpu_mem="64G", workload="grpo"))
    assert grpo.workload.samples_per_prompt == DEFAULT_GRPO_SAMPLES


def test_the_readme_states_the_same_defaults() -> None:
    stated = _readme_defaults()
    assert stated == {
        "workload": SPEC_DEFAULTS["workload"],
        "seq-len": str(DEFAULT_SEQ_LEN),
        "prompt-len": str(DEFAULT_PROMPT_LEN),
        "gen-len": str(DEFAULT_GEN_LEN),
        "batch": str(DEFAULT_BATCH_PER_GPU),
        "samples-per-prompt": str(DEFAULT_GRPO_SAMPLES),
        "dtype": "bf16",
        "attn-impl": SPEC_DEFAULTS["attn_impl"] or DEFAULT_ATTN_IMPL,  # None: the framework's, else sdpa
        "gpus": str(DEFAULT_GPUS),  # JobSpec's None: the node's GPUs per node with --node, else DEFAULT_GPUS
        "nodes": str(SPEC_DEFAULTS["nodes"]),
        "ppo-epochs": str(SPEC_DEFAULTS["ppo_epochs"]),
        "safety-margin": str(SPEC_DEFAULTS["safety_margin"]),
        "framework": SPEC_DEFAULTS["framework"],
    }
    readme = (REPO / "README.md").read_text()
    assert 'workload defaults to "ppo"' in readme and SPEC_DEFAULTS["workload"] == "ppo"

"""Every command is a thin call of the Python API, its job options declared once (``planner.cli.options``).

Old behaviour these catch: each command re-listed every job option by hand (so one could drift or go
missing), ``planner probes`` and ``planner explain`` opened ``store.db`` and read ``search`` directly, and
``planner predict`` did the micro-batch arithmetic itself, so ``planner.predict()`` answered differently
(a strategy without ``grad_accum`` ran one sample per step; RLHF accumulation was counted in prompts).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from planner_helpers import CPU_MEM, REPO, CliResult, assert_one_error_line

from planner.cli import app
from planner.cli.options import JOB_OPTIONS
from planner.job.inputs import JobSpec

Cli = Callable[..., CliResult]
JOB_FIELDS = {f.name for f in dataclasses.fields(JobSpec)}
# What a config or a probe cannot take (docs/contracts.md "Interfaces"): the rest is every JobSpec field.
NOT_OFFERED = {
    "recommend": set(),
    "predict": set(),
    # check's --batch fills a transformers config's "auto" batch keys
    "check": {"prompt_len", "gen_len", "critic_model", "reward_model", "ppo_epochs", "samples_per_prompt", "kl_coef"},
    # a probe runs on this machine, one node of a plan: no catalog node, no network between nodes
    "probe": {"nvme_path", "safety_margin", "framework", "node", "inter_node_gbps"},
}
# Where a command may reach data: the public API (``planner``), its typed inputs and the CLI's own helpers.
CLI_MAY_IMPORT = {
    "planner",
    "planner.api",
    "planner.job.inputs",
    "planner.files.atomic",
    "planner.report.text",
    "planner.report.calibration_text",
    "planner.progress",  # the progress lines' interval and elapsed time, shared with the job layer's heartbeat
    "store.errors",
    "store.choices",  # the closed sets (StrEnum) the CLI offers as choices: data, like store.errors
}
GIB = 2**30


def _options(command: str) -> dict[str, Any]:
    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}


def test_every_jobspec_field_has_one_declared_option() -> None:
    assert set(JOB_OPTIONS) == JOB_FIELDS


@pytest.mark.parametrize("command", sorted(NOT_OFFERED))
def test_job_commands_offer_the_declared_options_under_their_flags(command: str) -> None:
    params = _options(command)
    offered = set(params) & JOB_FIELDS
    assert offered == JOB_FIELDS - NOT_OFFERED[command]
    for name in offered:
        declared = JOB_OPTIONS[name].__metadata__[0]  # the typer.Option of planner.cli.options
        assert list(params[name].opts) == [declared.default, *declared.param_decls], (command, name)
    assert params["model"].required


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted((REPO / "planner" / "cli").glob("*.py")), ids=lambda p: p.name)
def test_commands_reach_data_only_through_the_api(path: Path) -> None:
    project = {m for m in _imports(path) if m.split(".")[0] in ("planner", "search", "probes", "store")}
    own = {m for m in project if m.startswith("planner.cli")}
    assert project - own <= CLI_MAY_IMPORT, sorted(project - own - CLI_MAY_IMPORT)


def test_predict_api_keeps_the_global_batch_like_the_cli(cli: Cli) -> None:
    from planner import predict

    job: dict[str, Any] = {"gpu_mem": "24G", "cpu_mem": "64G", "workload": "sft"}
    report = predict("opt-1.3b", {"zero_stage": 2, "micro_batch": 2}, **job)
    assert (report.strategy["micro_batch"], report.strategy["grad_accum"]) == (2, 4)
    assert report.workload["global_batch"] == 8
    flags = cli("predict", "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, "--zero", "2", "--micro-batch", "2")
    assert flags.rc == 0, flags.err
    as_json = cli(
        "predict", "--model", "opt-1.3b", "--gpu-mem", "24G", *CPU_MEM, "--zero", "2", "--micro-batch", "2", "--json"
    )
    assert as_json.json() == report.model_dump()
    # No micro-batch: one GPU's whole share of --batch in one micro-step (was 1 sample, then a --batch error).
    big = predict("opt-1.3b", {"zero_stage": 2}, batch=16, **job)
    assert (big.strategy["micro_batch"], big.strategy["grad_accum"], big.workload["global_batch"]) == (16, 1, 16)


def test_predict_api_counts_rlhf_accumulation_in_sequences() -> None:
    from planner import predict

    # grpo: 8 prompts per GPU x 4 samples = 32 sequences per step (the CLI once filled in 8, then failed).
    report = predict("opt-125m", {"actor": {"zero_stage": 2}, "micro_batch": 8}, workload="grpo", gpu_mem="24G")
    assert (report.strategy["micro_batch"], report.strategy["grad_accum"]) == (8, 4)


def test_single_model_knobs_under_an_rlhf_workload_are_one_line(cli: Cli) -> None:
    result = cli("predict", "--model", "opt-1.3b", "--gpu-mem", "24G", "--zero", "2", "--grad-ckpt")
    assert_one_error_line(result, "gradient_checkpointing, zero_stage", "--workload ppo", "--workload sft")


def test_probe_api_plans_for_the_cli_default_gpu(tmp_path: Path) -> None:
    """``planner.probe`` without gpu_mem or gpu plans for 24G on the CPU backend, as ``planner probe`` did alone."""
    from planner import probe
    from store.measurements import PhaseMeasurement, ProbeResult

    folder = tmp_path / "tiny"
    folder.mkdir()
    config = {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    strategies = tmp_path / "one.json"
    strategies.write_text(json.dumps([{"zero_stage": 0, "micro_batch": 2, "grad_accum": 1}]))

    def runner(request: Any) -> ProbeResult:
        phase = PhaseMeasurement(name="backward", peak_allocated_bytes=1, peak_reserved_bytes=1, time_s=0.1)
        return ProbeResult(outcome="ok", phases=(phase,), layers=request.layers)

    report = probe(
        str(folder), workload="sft", cpu_mem="64G", batch=2, seq_len=32, strategies=str(strategies), device="cpu",
        runner=runner, db=str(tmp_path / "p.db"),
    )  # fmt: skip
    assert report.hardware["gpu_memory_bytes"] == 24 * GIB


def test_rlhf_shorter_sequence_suggestion_halves_prompt_and_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLHF takes --prompt-len/--gen-len (``--seq-len`` is bad input there); the suggestion once halved only
    the unused ``seq_len``, so its search could never differ and its flag could never be passed."""
    import planner.planning.suggest
    from planner.job.inputs import resolve
    from search import DEFAULT_COEFFICIENTS, search

    job = resolve(JobSpec(model="opt-125m", gpu_mem="24G", cpu_mem="64G"))  # ppo, prompt 256 + generation 256
    nothing = search(job.workload, job.hardware, DEFAULT_COEFFICIENTS, lora_ranks=(16,))
    fitting = search(job.workload, job.hardware, DEFAULT_COEFFICIENTS)
    assert fitting.best is not None

    def only_short_prompts_fit(workload: Any, hardware: Any, coef: Any, **kwargs: Any) -> Any:
        short = workload.prompt_len == 128 and workload.gen_len == 128 and workload.seq_len == 256
        return fitting if short else dataclasses.replace(nothing, ranked=())

    monkeypatch.setattr(planner.planning.suggest, "run_search", only_short_prompts_fit)
    lines = planner.planning.suggest.what_would_fit(job, DEFAULT_COEFFICIENTS, include_lora=False)
    assert lines == [
        f"sequences of 256 tokens fit: {fitting.best.strategy.describe()} (--prompt-len 128 --gen-len 128)"
    ]


def _readme_use_commands() -> list[list[str]]:
    """The ``planner recommend|predict|plans|explain`` lines of the README's "Use" block, as argv lists."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("## Use") :].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].split() for line in block.splitlines()]
    return [
        words[1:]
        for words in lines
        if words[:1] == ["planner"] and words[1] in ("recommend", "predict", "plans", "explain")
    ]


def test_the_readme_use_examples_run() -> None:
    """Each README example runs with today's defaults (two once broke when the default workload became ppo:
    ``--seq-len`` and the single-model ``--zero`` flags need ``--workload sft``). They run once for the suite: every
    recommend, predict, plans and explain line here is a line that
    ``test_readme_use.py::test_the_use_section_runs_as_pasted`` runs, in order, through the same ``planner.cli.main``,
    each to exit 0 (files they write land in a temporary folder)."""
    from test_readme_use import use_section_blocks

    commands = _readme_use_commands()
    assert {argv[0] for argv in commands} == {"recommend", "predict", "plans", "explain"}
    pasted = [
        shlex.split(line, comments=True)[1:]
        for block in use_section_blocks((REPO / "README.md").read_text())
        for line in block
        if line.startswith("planner ")
    ]
    assert [argv for argv in pasted if argv in commands] == commands  # every one run, in the README's order
    assert any(argv[0] == "recommend" and "--json" in argv for argv in commands)  # a plan id for what follows

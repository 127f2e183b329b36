"""Integration: ``run_probe`` runs real DeepSpeed engines on tiny models in a fresh process and measures.

Every probe here is a real child process (``python -m probes.step.child``, forked from the one preloaded starter
the file's probes share: ``tests/one_starter.py``) on the CPU accelerator: tiny Llama / OPT models built from their
HF configs, engines from the exported configs, the workload's phases measured by the live-tensor tracker. Failures
are real too: the tracker's memory cap, a model config that transformers rejects, a timeout that kills the child's
process group; after each one the next probe runs clean. About 2-10 CPU s per probe on 2 cores (once DeepSpeed's
CPU ops are compiled).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from one_starter import settle_environment
from tiny_models import make_hardware, tiny_llama_hf_config, tiny_opt_hf_config

from probes import PHASES, run_probe
from store.measurements import ProbeRequest, ProbeResult

pytestmark = pytest.mark.slow

LLAMA = {"model_type": "llama", **tiny_llama_hf_config(), "num_hidden_layers": 3}
CRITIC = {**LLAMA, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
CRITIC.update(num_attention_heads=2, num_key_value_heads=2)
OPT = {"model_type": "opt", **tiny_opt_hf_config()}
MiB = 2**20


def single(kind: str = "sft", strategy: dict[str, Any] | None = None, config: dict | None = None, **changes: Any):
    workload = {
        "kind": kind,
        "model": "tiny",
        "seq_len": 16,
        "global_batch": 2,
        "dtype": "bf16",
        "attn_impl": "sdpa",
        "hf_configs": {"model": config or LLAMA},
    }
    values: dict[str, Any] = {
        "workload": workload,
        "strategy": {"zero_stage": 0, "micro_batch": 2, **(strategy or {})},
        "hardware": make_hardware().to_dict(),
        "device": "cpu",
        "steps": 2,
        "timeout_s": 3600.0,
    }
    values.update(changes)
    return ProbeRequest(**values)


def rlhf(kind: str, actor: dict[str, Any], critic: dict[str, Any] | None, **knobs: Any) -> ProbeRequest:
    workload = {
        "kind": kind,
        "model": "tiny-opt",
        "seq_len": 12,
        "prompt_len": 8,
        "gen_len": 4,
        "global_batch": 2,
        "dtype": "bf16",
        "attn_impl": "sdpa",
        "ref_model": "tiny-opt",
        "reward_model": "tiny-critic",
        "ppo_epochs": 1,
        "samples_per_prompt": 2 if kind == "grpo" else 1,
        "hf_configs": {"model": OPT, "ref_model": OPT, "reward_model": {**CRITIC, "vocab_size": OPT["vocab_size"]}},
    }
    if critic is not None:
        workload["critic_model"] = "tiny-critic"
        workload["hf_configs"]["critic_model"] = workload["hf_configs"]["reward_model"]
    strategy: dict[str, Any] = {"actor": actor, "reference": {"zero_stage": 0}, "reward": {"zero_stage": 0}}
    if critic is not None:
        strategy["critic"] = critic
    strategy.update({"generation_batch": 2, "micro_batch": 2, "grad_accum": 1, "empty_cache": "after-inference"})
    strategy.update(knobs)
    return ProbeRequest(workload, strategy, make_hardware().to_dict(), device="cpu", steps=2, timeout_s=3600.0)


def assert_ok(result: ProbeResult, phases: tuple[str, ...], layers: int) -> None:
    detail = f"{result.message}\n{result.extra.get('traceback', '')}\n{result.extra.get('log_tail', '')[-3000:]}"
    assert result.outcome == "ok", detail
    assert tuple(p.name for p in result.phases) == phases
    for phase in result.phases:
        assert phase.peak_allocated_bytes > 0 and phase.time_s > 0, phase
        assert phase.peak_reserved_bytes == phase.peak_allocated_bytes  # CPU: no caching allocator
        assert phase.peak_allocated_bytes >= result.extra["resident_bytes"] > 0  # model states stay live
    assert result.failed_phase is None and result.message == ""
    assert result.layers == layers
    assert result.host_rss_peak_bytes > 100 * MiB  # torch and deepspeed alone take more
    fingerprint = result.fingerprint
    assert fingerprint is not None and fingerprint.device == "cpu" and fingerprint.name
    assert (
        fingerprint.total_memory_bytes > 0 and fingerprint.torch and fingerprint.deepspeed and fingerprint.transformers
    )
    assert result.extra["measured_steps"] == 1 and result.extra["warmup_steps"] == 1
    assert result.wall_s > 0


def test_sft_zero0_measures_three_phases() -> None:
    settle_environment()
    result = run_probe(single())
    assert_ok(result, PHASES["sft"], layers=3)
    forward, backward, step = result.phases
    # bf16 weights (2 B) + fp32 master (4 B) + Adam m and v (8 B) per parameter, at least
    params = 128 * 64 * 2 + 3 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert result.extra["resident_bytes"] >= 14 * params
    assert backward.peak_allocated_bytes > result.extra["resident_bytes"]


def test_oom_by_memory_cap_then_zero2_runs_clean() -> None:
    settle_environment()
    # ZeRO-2 allocates its reduce buckets in the backward: far over a 64 MiB cap
    strategy = {"zero_stage": 2, "gradient_checkpointing": True}
    oom = run_probe(single(strategy=strategy, memory_cap_bytes=64 * MiB))
    assert oom.outcome == "oom", oom.message
    assert oom.failed_phase == "backward"
    assert "ProbeOOM" in oom.message and "over the cap" in oom.message
    assert [p.name for p in oom.phases] == []  # it failed in the warm-up step

    result = run_probe(single(strategy=strategy, layers=2))
    assert_ok(result, PHASES["sft"], layers=2)
    assert result.extra["gradient_checkpointing"] is True


def test_oom_while_building_engines_names_setup() -> None:
    settle_environment()
    result = run_probe(single(memory_cap_bytes=50_000))  # less than the tiny model's weights
    assert (result.outcome, result.failed_phase) == ("oom", "setup")
    assert result.phases == () and result.layers == 3


def test_error_from_a_broken_model_then_ppo_runs_clean() -> None:
    settle_environment()
    broken = run_probe(single(config={**LLAMA, "hidden_act": "no_such_activation"}))
    assert broken.outcome == "error"
    assert broken.failed_phase == "setup"
    assert broken.message.startswith("KeyError") and "no_such_activation" in broken.message
    assert broken.fingerprint is not None and broken.layers == 3

    result = run_probe(rlhf("ppo", {"zero_stage": 2, "gradient_checkpointing": True}, {"zero_stage": 2}))
    assert_ok(result, PHASES["ppo"], layers=2)
    assert set(result.extra["engines"]) == {"actor", "critic", "reference", "reward"}
    assert result.extra["hybrid_engine"] == "on"  # OPT: no inference containers, native generate
    assert result.extra["empty_cache_calls"] == 2 * 2  # after-inference: generation and scoring, two steps


def test_timeout_kills_the_child_then_dpo_runs_clean() -> None:
    settle_environment()
    slow = run_probe(single(timeout_s=2.0, steps=100_000))  # far more steps than 2 s hold, on any machine
    assert slow.outcome == "timeout"
    assert slow.failed_phase in ("startup", "setup", *PHASES["sft"])
    assert "timed out after 2 s" in slow.message
    assert slow.wall_s < 600  # ended by the timeout, not by the probe's end (generous: a busy 2-core machine)
    pid = slow.extra["child_pid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # neither the child nor anything of its process group is left
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    result = run_probe(single("dpo", {"zero_stage": 1, "lora_rank": 4, "empty_cache": "after-inference"}))
    assert_ok(result, PHASES["dpo"], layers=3)
    assert result.extra["dpo_reference"] == "policy without LoRA"
    assert result.extra["lora_layers"] == 3 * 7


def test_grpo_with_a_llama_actor_runs_without_the_hybrid_engine_on_cpu() -> None:
    settle_environment()
    llama = rlhf("grpo", {"zero_stage": 3, "lora_rank": 2}, None, hybrid_engine=True)
    llama.workload["hf_configs"]["model"] = llama.workload["hf_configs"]["ref_model"] = LLAMA
    result = run_probe(llama)
    assert_ok(result, PHASES["grpo"], layers=3)
    assert result.extra["hybrid_engine"].startswith("refused on the CPU accelerator")
    assert result.extra["experience_sequences"] == 4 and result.extra["training_micro_steps"] == 2

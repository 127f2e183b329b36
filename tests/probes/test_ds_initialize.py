"""Integration: the rendered configs start real DeepSpeed engines and train a tiny causal LM on CPU.

Each case runs in a fresh Python process (this file, run as a module: ``script_cases``, which forks it from the
preloaded starter, where torch, DeepSpeed and transformers are imported and none of them has run) so that no
DeepSpeed state (process group, ZeRO-3 hooks, accelerator choice, compiled-op handles) leaks between cases. The child
sets ``DS_ACCELERATOR=cpu`` before importing deepspeed, joins a one-rank gloo group
(RANK=0, WORLD_SIZE=1, a free MASTER_PORT), builds the tiny Llama of ``tiny_models`` from its config
with random weights, passes ``render_ds_config(...)`` unchanged to ``deepspeed.initialize`` and takes
three optimizer steps (forward with labels, ``engine.backward``, ``engine.step``). It prints one
``MEMPLAN_RESULT <json>`` line; the test asserts on it.

bf16 is the main dtype here, with one fp16 and one fp32 case. DeepSpeed's CPU accelerator always runs
bf16 and fp32, but fp16 only where oneDNN has fp16 kernels for the processor
(``get_accelerator().is_fp16_supported()``): a case whose dtype the accelerator refuses is skipped with
that reason (``probes.measure.cpu_support``), and the fp16 path keeps two checks that run on every processor:
DeepSpeed's own parser accepts the rendered fp16 config, and the fp16 memory arithmetic holds. NVMe
offload is not run: it needs DeepSpeed's ``async_io`` op (libaio), which cannot be built on a CPU-only
box without it.

The first run on a machine compiles DeepSpeed's CPU ops (fused_adam, cpu_adam, shm comm: a few minutes,
cached in the venv's op folder); later runs take about 1-6 CPU s per case on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import pytest
from script_cases import report, run_script_case

OPTIMIZER_STEPS = 3
MICRO_BATCH = 2
SEQ_LEN = 16
CASE_TIMEOUT_S = 900  # generous: the first case on a fresh machine compiles DeepSpeed's CPU ops

# One engine of each kind (the accuracy probes of test_cost_model_accuracy.py run the other ZeRO stages,
# accumulation and offload combinations through the same rendered configs)
CASES: dict[str, dict[str, Any]] = {
    "z0-bf16": {"zero_stage": 0, "dtype": "bf16"},
    "z3-bf16-ckpt": {"zero_stage": 3, "dtype": "bf16", "gradient_checkpointing": True},
    "z2-bf16-opt_cpu-ckpt": {
        "zero_stage": 2,
        "dtype": "bf16",
        "offload_optimizer": "cpu",
        "gradient_checkpointing": True,
    },
    "z3-bf16-opt_cpu-par_cpu-ckpt": {
        "zero_stage": 3,
        "dtype": "bf16",
        "offload_optimizer": "cpu",
        "offload_param": "cpu",
        "gradient_checkpointing": True,
    },
    "z2-fp16-opt_cpu": {"zero_stage": 2, "dtype": "fp16", "offload_optimizer": "cpu"},
    "z0-fp32": {"zero_stage": 0, "dtype": "fp32"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_rendered_config_trains_tiny_model(name: str) -> None:
    case = CASES[name]
    _skip_unless_cpu_runs(case["dtype"])
    result = run_script_case(__file__, name, case, CASE_TIMEOUT_S)

    stage, dtype = case["zero_stage"], case["dtype"]
    grad_accum = case.get("grad_accum", 1)
    assert result["param_count"] == result["spec_total_params"]
    assert all(math.isfinite(loss) for loss in result["losses"]), result["losses"]
    assert len(result["losses"]) == OPTIMIZER_STEPS * grad_accum
    assert result["zero_stage"] == stage
    assert result["train_batch_size"] == MICRO_BATCH * grad_accum
    assert result["gradient_accumulation_steps"] == grad_accum
    assert result["bf16"] == (dtype == "bf16") and result["fp16"] == (dtype == "fp16")
    assert result["param_dtype"] == {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}[dtype]
    assert result["global_steps"] == OPTIMIZER_STEPS
    assert result["skipped_steps"] < OPTIMIZER_STEPS  # fp16 may skip an overflow step, never all
    assert result["gradient_checkpointing"] == case.get("gradient_checkpointing", False)
    assert result["offload_optimizer"] == case.get("offload_optimizer", "none")
    assert result["offload_param"] == case.get("offload_param", "none")
    if case.get("offload_optimizer", "none") == "cpu":
        assert result["inner_optimizer"] == "DeepSpeedCPUAdam"

    # Parameters moved: the full (gathered, for ZeRO-3) model weights, and the fp32 master copies where
    # DeepSpeed exposes them per parameter (ZeRO 1-3). In 16-bit, weights sitting at exactly 1.0 (the
    # RMSNorm scales) can round back after a 1e-5 step, so there most, not all, tensors must change.
    tensors = result["tensor_count"]
    if dtype == "fp32":
        assert result["weights_changed"] == tensors
    else:
        assert result["weights_changed"] >= tensors // 2
    if stage > 0:
        assert result["master_changed"] == tensors


def _skip_unless_cpu_runs(dtype: str) -> None:
    from probes.measure.cpu_support import cpu_dtype_unsupported_reason

    reason = cpu_dtype_unsupported_reason(dtype)
    if reason is not None:
        pytest.skip(reason)


def _fp16_case() -> tuple[Any, Any, Any]:
    from tiny_models import make_hardware, make_strategy, make_workload, tiny_llama_spec

    case = CASES["z2-fp16-opt_cpu"]
    strategy = make_strategy(
        zero_stage=case["zero_stage"], offload_optimizer=case["offload_optimizer"], micro_batch=MICRO_BATCH
    )
    return (
        strategy,
        make_workload(tiny_llama_spec(), dtype="fp16", seq_len=SEQ_LEN, global_batch=MICRO_BATCH),
        make_hardware(),
    )


def test_fp16_case_config_passes_deepspeed_validation_on_any_cpu(parse: Any) -> None:
    """The config the fp16 engine case would start, parsed by DeepSpeed itself (runs on every processor)."""
    from launch.ds_config import render_ds_config

    strategy, workload, hardware = _fp16_case()
    ds = parse(render_ds_config(strategy, workload, hardware), 1)
    assert ds.float16_config.enabled and not ds.bfloat16_config.enabled
    assert ds.float16_config.loss_scale == 0  # dynamic loss scaling, as the engine case would train
    assert ds.zero_optimization_stage == 2
    assert str(ds.zero_config.offload_optimizer.device) == "cpu"


def test_fp16_memory_arithmetic_on_any_cpu() -> None:
    """fp16 keeps 2-byte weights beside fp32 master, m and v, like bf16: the same bytes, half of fp32's weights."""
    from dataclasses import replace

    from search import DEFAULT_COEFFICIENTS, predict

    strategy, fp16, hardware = _fp16_case()
    params = fp16.model.total_params
    predicted = {
        dtype: predict(replace(fp16, dtype=dtype), strategy, hardware, DEFAULT_COEFFICIENTS)
        for dtype in ("fp16", "bf16", "fp32")
    }
    assert predicted["fp16"].breakdown["parameters"] == 2 * params
    assert predicted["fp32"].breakdown["parameters"] == 4 * params
    assert predicted["fp16"].breakdown == predicted["bf16"].breakdown
    assert predicted["fp16"].host_bytes == predicted["bf16"].host_bytes >= 12 * params  # offloaded fp32 states


# --------------------------------------------------------------------------------------------------
# The child process: one case, one engine.


def _weights(engine: Any, stage: int) -> list[Any]:
    """Full copies of every parameter as fp32 tensors, gathered from the partitions under ZeRO-3."""
    import deepspeed

    params = list(engine.module.parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return [p.detach().float().clone() for p in params]
    return [p.detach().float().clone() for p in params]


def _masters(engine: Any) -> list[Any]:
    """The optimizer's fp32 master copy of each parameter (None where DeepSpeed keeps none per param)."""
    from deepspeed.utils import safe_get_full_fp32_param

    masters = []
    for param in engine.module.parameters():
        master = safe_get_full_fp32_param(param)
        masters.append(None if master is None else master.detach().clone())
    return masters


def _count_changed(before: list[Any], after: list[Any]) -> int:
    import torch

    return sum(
        1 for a, b in zip(before, after, strict=True) if a is not None and b is not None and not torch.equal(a, b)
    )


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Initialize DeepSpeed from the rendered config, train a few steps, report what happened."""
    os.environ["DS_ACCELERATOR"] = "cpu"  # before deepspeed is imported
    import deepspeed
    import torch
    from tiny_models import build_tiny_model, make_hardware, make_strategy, make_workload, tiny_llama_spec

    from launch.ds_config import render_ds_config

    deepspeed.init_distributed(dist_backend="gloo")
    stage, grad_accum = case["zero_stage"], case.get("grad_accum", 1)
    strategy = make_strategy(
        zero_stage=stage,
        offload_optimizer=case.get("offload_optimizer", "none"),
        offload_param=case.get("offload_param", "none"),
        gradient_checkpointing=case.get("gradient_checkpointing", False),
        micro_batch=MICRO_BATCH,
        grad_accum=grad_accum,
    )
    spec = tiny_llama_spec()
    workload = make_workload(spec, dtype=case["dtype"], seq_len=SEQ_LEN, global_batch=MICRO_BATCH * grad_accum)
    config = render_ds_config(strategy, workload, make_hardware())

    torch.manual_seed(0)
    model = build_tiny_model(spec)
    param_count = sum(p.numel() for p in model.parameters())
    if strategy.gradient_checkpointing:
        # transformers 5 renamed gradient_checkpointing_enable (now a deprecated alias).
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config
    )
    engine.train()

    weights_before, masters_before = _weights(engine, stage), _masters(engine)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(OPTIMIZER_STEPS * grad_accum):
        ids = torch.randint(0, spec.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=generator)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach().float()))
    weights_after, masters_after = _weights(engine, stage), _masters(engine)

    zero = engine._config.zero_config
    return {
        "param_count": param_count,
        "spec_total_params": spec.total_params,
        "losses": losses,
        "zero_stage": int(engine.zero_optimization_stage()),
        "train_batch_size": engine.train_batch_size(),
        "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
        "bf16": bool(engine.bfloat16_enabled()),
        "fp16": bool(engine.fp16_enabled()),
        "param_dtype": str(next(engine.module.parameters()).dtype),
        "global_steps": engine.global_steps,
        "skipped_steps": engine.skipped_steps,
        "gradient_checkpointing": bool(getattr(engine.module, "is_gradient_checkpointing", False)),
        "offload_optimizer": str(zero.offload_optimizer.device) if zero.offload_optimizer else "none",
        "offload_param": str(zero.offload_param.device) if zero.offload_param else "none",
        "optimizer": type(optimizer).__name__,
        "inner_optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__,
        "tensor_count": len(weights_before),
        "weights_changed": _count_changed(weights_before, weights_after),
        "master_changed": _count_changed(masters_before, masters_after),
    }


if __name__ == "__main__":
    report(run_case(json.loads(sys.argv[1])))

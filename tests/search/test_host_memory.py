"""Host memory per node by part (search.model.host): each part from DeepSpeed's own allocations, the parts
summing to ``host_bytes``, the per-GPU parts times the GPUs per node, loading against steady.

The expected bytes are written out from the rules (DeepSpeed's buffers, ``runtime/zero/stage_1_and_2.py`` and
``stage3.py``), not read back from the output: T trainable parameters, N ranks, d = 2 bytes (bf16).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from search import DEFAULT_COEFFICIENTS, predict
from search.model.shapes import largest_trainable_tensor, resident_params, trainable_params
from search.prediction import Prediction
from store.ds_defaults import ZERO3_SUB_GROUP_SIZE
from store.gpus import generic_gpu
from store.models import get_model
from store.records import FrozenModelStrategy, Hardware, RLHFStrategy, Strategy, TrainedModelStrategy, Workload

GiB = 2**30
D = 2  # bf16
SLACK = DEFAULT_COEFFICIENTS.host_buffer_factor - 1.0  # DeepSpeed's estimators: additional_buffer_factor 1.5
NVME_PARAM_BUFFER_BYTES = 5 * 100_000_000 * D  # ZeRO-Infinity's default parameter buffers (5 x 1e8 elements)


def _hw(gpus: int = 1, nodes: int = 1) -> Hardware:
    spec = generic_gpu(80 * GiB)
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=gpus, nodes=nodes, cpu_memory_bytes=4096 * GiB)


def _sft(model: str = "opt-1.3b", batch: int = 8) -> Workload:
    return Workload(kind="sft", model=get_model(model), seq_len=256, global_batch=batch)


def _single(hw: Hardware, zero: int, optimizer: str, param: str, grad_accum: int = 1, model: str = "opt-1.3b"):
    strategy = Strategy(
        zero_stage=zero, offload_optimizer=optimizer, offload_param=param, micro_batch=1, grad_accum=grad_accum
    )
    return predict(_sft(model, hw.world_size * grad_accum), strategy, hw)


def _consistent(p: Prediction) -> None:
    assert sum(p.host_breakdown.values()) == p.host_bytes
    assert p.host_phases[p.host_peak_phase] == p.host_bytes == max(p.host_phases.values())
    assert all(value > 0 for value in p.host_breakdown.values())
    assert p.to_dict()["host_breakdown"] == p.host_breakdown


def _with_slack(per_gpu: dict[str, int], gpus: int, states: int, pinned: int) -> dict[str, int]:
    """Per-GPU parts times the GPUs, plus the estimators' slack beyond the pinned buffers (never negative)."""
    parts = {name: value * gpus for name, value in per_gpu.items() if value}
    slack = int(gpus * max(0.0, SLACK * states - pinned))
    return parts | ({"buffer_slack": slack} if slack else {})


@pytest.mark.parametrize("gpus", [1, 4])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_zero2_cpu_offload_parts(gpus: int, grad_accum: int) -> None:
    model = get_model("opt-1.3b")
    t, n = model.total_params, gpus  # tied embeddings: every parameter trains
    largest = model.vocab_size * model.hidden_size  # the embedding is the largest parameter
    p = _single(_hw(gpus), 2, "cpu", "none", grad_accum)
    states = 16 * t // n  # fp32 master, its gradient, Adam m and v: the pinned weights_partition and its .grad
    # param_buffer_of_bit16_for_cpu_offload_groups, temp_grad_buffer_for_cpu_offload (largest_param_numel),
    # accumulated_grads_in_cpu with accumulation
    pinned = D * t // n + D * largest + (D * t // n if grad_accum > 1 else 0)
    expected = _with_slack({"offloaded_optimizer_states": states, "pinned_buffers": pinned}, gpus, states, pinned)
    assert p.host_breakdown == expected
    assert p.host_peak_phase == "steady"
    assert p.host_phases["loading"] == gpus * D * t  # every local rank loads the whole 16-bit model first
    _consistent(p)


@pytest.mark.parametrize(
    ("model_name", "optimizer", "param"),
    [
        ("opt-1.3b", "cpu", "cpu"),
        ("opt-1.3b", "nvme", "nvme"),
        ("opt-1.3b", "nvme", "none"),
        ("llama-3-8b", "nvme", "none"),
    ],
)
def test_zero3_offload_parts(model_name: str, optimizer: str, param: str) -> None:
    model = get_model(model_name)
    t, n = trainable_params(model, 0, lm_head=True), 1
    resident = resident_params(model, 0, lm_head=True)
    p = _single(_hw(), 3, optimizer, param, model=model_name)
    fp32 = 16 * t // n
    sub_group = 16 * min(t // n, ZERO3_SUB_GROUP_SIZE)  # one optimizer sub-group swapped through host memory
    per_gpu = {
        "offloaded_optimizer_states": fp32 if optimizer == "cpu" else 0,
        "offloaded_parameters": D * resident // n if param == "cpu" else 0,
        "nvme_staging": (sub_group if optimizer == "nvme" else 0) + (NVME_PARAM_BUFFER_BYTES if param == "nvme" else 0),
        "pinned_buffers": D * t // n,  # grad_partitions_flat_buffer, on the host whenever the optimizer is offloaded
    }
    states = sum(per_gpu.values()) - per_gpu["pinned_buffers"]
    assert p.host_breakdown == _with_slack(per_gpu, 1, states, per_gpu["pinned_buffers"])
    assert p.host_phases["loading"] == D * resident  # zero.Init: the rank's partition (N = 1: all of it)
    _consistent(p)
    if model_name == "llama-3-8b":
        # DeepSpeed's 16-bit gradient partition on the host outgrows the estimators' 1.5 x the swap buffers
        assert p.host_bytes == states + D * t > DEFAULT_COEFFICIENTS.host_buffer_factor * states


@pytest.mark.parametrize(
    ("zero", "gpus", "framework"), [(0, 1, "deepspeed"), (2, 2, "deepspeed"), (3, 4, "deepspeed"), (3, 4, "hf")]
)
def test_without_offload_loading_sets_host_memory(zero: int, gpus: int, framework: str) -> None:
    """Each rank loads its 16-bit copy of the model before deepspeed.initialize; a ZeRO-3 program that builds it
    under zero.Init (the HF Trainer: store.model_build) loads only its partition (issue 42)."""
    model = get_model("opt-1.3b")
    strategy = Strategy(zero_stage=zero, micro_batch=1)
    p = predict(replace(_sft("opt-1.3b", gpus), framework=framework), strategy, _hw(gpus))
    copy = D * resident_params(model, 0, lm_head=True)
    loading = gpus * copy // (gpus if framework == "hf" else 1)
    assert p.host_breakdown == {"model_loading": loading}
    assert p.host_peak_phase == "loading"
    assert p.host_phases == {"steady": 0, "loading": loading}
    assert any(note.startswith("model build:") for note in p.notes) == (zero == 3)
    _consistent(p)


@pytest.mark.parametrize(("zero", "optimizer", "param"), [(2, "cpu", "none"), (3, "cpu", "cpu"), (3, "nvme", "none")])
def test_parts_per_node_scale_with_gpus_per_node(zero: int, optimizer: str, param: str) -> None:
    """The same 8 ranks as 1 node of 8 GPUs, 2 of 4 or 8 of 1: per-GPU parts alike, times the GPUs per node."""
    by_gpus = {gpus: _single(_hw(gpus, 8 // gpus), zero, optimizer, param) for gpus in (1, 4, 8)}
    one = by_gpus[1].host_breakdown
    for gpus, p in by_gpus.items():
        _consistent(p)
        assert set(p.host_breakdown) == set(one)
        for name, value in p.host_breakdown.items():
            assert value == pytest.approx(gpus * one[name], abs=gpus), name  # the fractional slack rounds down
        assert p.host_phases["loading"] == pytest.approx(gpus * by_gpus[1].host_phases["loading"], abs=gpus)


def _ppo(batch: int = 8) -> Workload:
    model = get_model("opt-1.3b")
    return Workload(kind="ppo", model=model, seq_len=512, global_batch=batch, prompt_len=256, gen_len=256)


def test_rlhf_parts_offloaded_actor_critic_frozen_models_and_ema() -> None:
    gpus = n = 2
    model = get_model("opt-1.3b")
    strategy = RLHFStrategy(
        actor=TrainedModelStrategy(3, "cpu", "cpu"),
        critic=TrainedModelStrategy(2, "cpu"),
        reference=FrozenModelStrategy(3, "cpu"),
        reward=FrozenModelStrategy(3, "cpu"),
        ema=True,
        hybrid_engine=False,
        generation_batch=4,
        micro_batch=4,
    )
    p = predict(_ppo(), strategy, _hw(gpus))
    actor_t, actor_res = trainable_params(model, 0, lm_head=True), resident_params(model, 0, lm_head=True)
    critic_t = trainable_params(model, 0, lm_head=False)  # a scalar value head instead of the LM head
    critic_largest = largest_trainable_tensor(model, 0, lm_head=False)
    reward_res = resident_params(model, 0, lm_head=False)
    actor_states, critic_states = 16 * actor_t // n, 16 * critic_t // n
    actor_pinned = D * actor_t // n  # ZeRO-3 grad_partitions_flat_buffer
    critic_pinned = D * critic_t // n + D * critic_largest  # ZeRO-2: 16-bit partition, temp_grad_buffer
    actor_params = D * actor_res // n  # ZeRO-3's 16-bit partition with offload_param cpu
    # the estimators' factor is on all offloaded states, the parameters included
    slack = SLACK * (actor_states + actor_params) - actor_pinned + SLACK * critic_states - critic_pinned
    assert p.host_breakdown == {
        "offloaded_optimizer_states": gpus * (actor_states + critic_states),
        "offloaded_parameters": gpus * actor_params,
        "pinned_buffers": gpus * (actor_pinned + critic_pinned),
        "buffer_slack": int(gpus * slack),
        "frozen_models": gpus * (D * actor_res // n + D * reward_res // n),  # reference (LM head) and reward
        "ema": gpus * (D * actor_res // n),  # a 16-bit copy placed like the actor: on the host with its params
    }
    # models load one at a time: the largest one's 16-bit copy per rank (the critic, whole under ZeRO-2)
    assert p.host_phases["loading"] == gpus * D * resident_params(model, 0, lm_head=False)
    assert p.host_peak_phase == "steady"
    _consistent(p)


def test_rlhf_without_offload_is_the_loading_peak() -> None:
    strategy = RLHFStrategy(hybrid_engine=False, generation_batch=4, micro_batch=4)
    p = predict(_ppo(), strategy, _hw(2))
    model = get_model("opt-1.3b")
    assert p.host_breakdown == {
        "model_loading": 2 * D * max(resident_params(model, 0, lm_head=h) for h in (True, False))
    }
    _consistent(p)

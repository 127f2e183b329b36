"""Behaviour of the analytic cost model: the published activation formula, and the directions in
which each knob must move memory and time (arXiv 2410.15651, ZeRO and ZeRO-Offload papers)."""

from __future__ import annotations

import dataclasses

import pytest

from search import DEFAULT_COEFFICIENTS, predict
from search.coefficients import describe_coefficients
from search.model.activations import layer_activation_bytes
from search.step.assemble import gpu_budget_bytes
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

GiB = 2**30


def _hw(gpus: int = 1, gpu: str = "A100-80G", host_gib: int = 512) -> Hardware:
    spec = get_gpu(gpu)
    return Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=gpus, cpu_memory_bytes=host_gib * GiB)


def _w(model: str = "opt-1.3b", kind: str = "sft", batch: int = 8, seq: int = 512, **kw) -> Workload:
    return Workload(kind=kind, model=get_model(model), seq_len=seq, global_batch=batch, **kw)


def formula_model(name: str):
    """The catalog model without its traced activation terms: what the formulas alone say."""
    return dataclasses.replace(get_model(name), activation_terms={})


def test_layer_activations_follow_korthikanti_for_gpt_blocks() -> None:
    """sbh(34 + 5as/h) bytes per layer: fp16 GPT block, eager attention with dropout, fp16 softmax."""
    model = formula_model("gpt2-medium")
    coef = DEFAULT_COEFFICIENTS.with_(eager_softmax_bytes=2)
    s, b, h, a = 1024, 4, model.hidden_size, model.num_heads
    expected = s * b * h * (34 + 5 * a * s / h)
    assert layer_activation_bytes(model, b, s, "fp16", "eager", coef) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("traced", [False, True], ids=["formula", "traced"])
def test_sdpa_drops_the_quadratic_attention_term(traced: bool) -> None:
    model = get_model("gpt2-medium") if traced else formula_model("gpt2-medium")
    eager = [layer_activation_bytes(model, 1, s, "bf16", "eager", DEFAULT_COEFFICIENTS) for s in (512, 1024)]
    sdpa = [layer_activation_bytes(model, 1, s, "bf16", "sdpa", DEFAULT_COEFFICIENTS) for s in (512, 1024)]
    assert sdpa[1] == pytest.approx(2 * sdpa[0], rel=1e-4)  # linear in sequence length (flash's RNG seeds aside)
    assert eager[1] > 2 * eager[0]  # quadratic term present


def test_budget_leaves_margin_and_cuda_context() -> None:
    hw = Hardware(gpu=get_gpu("A10"), gpu_memory_bytes=24 * GiB, safety_margin=0.1)
    expected = 24 * GiB * 0.9 - DEFAULT_COEFFICIENTS.cuda_context_bytes
    assert gpu_budget_bytes(hw, DEFAULT_COEFFICIENTS) == int(expected)


def test_logits_term_is_b_s_vocab_times_fp32_loss_bytes() -> None:
    """The loss backward holds the fp32 log-softmax and two fp32 gradients (logits_peak_bytes); the bf16
    logits are alive beside them only where the loop holds the model output through the backward (DPO
    here; not sft, whose HF/TRL loops keep only the loss: the H100 records' 2 bytes per logit)."""
    model = formula_model("llama-3.2-1b")
    elements = 2 * 1024 * model.vocab_size
    strategy = Strategy(zero_stage=1, offload_optimizer="cpu", micro_batch=2, grad_accum=1)
    sft = predict(Workload(kind="sft", model=model, seq_len=1024, global_batch=2), strategy, _hw())
    assert sft.peak_phase == "backward"
    assert sft.breakdown["logits"] == int(DEFAULT_COEFFICIENTS.logits_peak_bytes * elements)
    dpo_workload = Workload(kind="dpo", model=model, seq_len=1024, global_batch=2)
    dpo = predict(dpo_workload, strategy.with_(micro_batch=1), _hw())
    assert dpo.breakdown["logits"] == int((DEFAULT_COEFFICIENTS.logits_peak_bytes + 2) * elements)


def test_reward_model_has_no_vocabulary_logits() -> None:
    p = predict(_w(kind="reward"), Strategy(micro_batch=8), _hw())
    assert all(phase.name != "reference_forward" for phase in p.phases)
    assert p.breakdown["logits"] == 0


def test_pairs_double_the_sequences() -> None:
    offloaded = Strategy(zero_stage=1, offload_optimizer="cpu", micro_batch=4, grad_accum=2)
    sft = predict(_w(kind="sft"), offloaded, _hw())
    reward = predict(_w(kind="reward"), offloaded, _hw())
    assert sft.peak_phase == reward.peak_phase == "backward"
    assert reward.breakdown["activations"] > 1.8 * sft.breakdown["activations"]


def _phase_allocated(p, name: str) -> int:
    return next(phase.peak_allocated_bytes for phase in p.phases if phase.name == name)


def test_checkpointing_trades_memory_for_time() -> None:
    """Checkpointing lowers the activation phases. (On one GPU the ZeRO-2 optimizer step of opt-1.3b, with
    its flattened 16-bit partition and fp32 copy, can be the step's peak, which checkpointing cannot lower.)"""
    base = Strategy(zero_stage=2, micro_batch=8)
    off = predict(_w(), base, _hw())
    on = predict(_w(), base.with_(gradient_checkpointing=True), _hw())
    for name in ("forward", "backward"):
        assert _phase_allocated(on, name) < _phase_allocated(off, name)
    assert on.peak_allocated_bytes <= off.peak_allocated_bytes
    assert on.step_time_s > off.step_time_s


def test_optimizer_offload_moves_states_to_host_and_costs_time() -> None:
    base = Strategy(zero_stage=2, micro_batch=8)
    gpu = predict(_w(), base, _hw())
    cpu = predict(_w(), base.with_(offload_optimizer="cpu"), _hw())
    assert cpu.peak_allocated_bytes < gpu.peak_allocated_bytes
    assert cpu.host_bytes > gpu.host_bytes
    assert cpu.step_time_s > gpu.step_time_s


def test_zero_stages_lower_memory_as_they_partition_more_over_8_gpus() -> None:
    peaks = [
        predict(
            _w("llama-3.1-8b", batch=16), Strategy(zero_stage=z, micro_batch=1, grad_accum=2), _hw(gpus=8)
        ).peak_allocated_bytes
        for z in (0, 1, 2, 3)
    ]
    assert peaks[0] > peaks[1] > peaks[2] > peaks[3]


def test_expandable_segments_and_empty_cache_cut_fragmentation() -> None:
    base = Strategy(zero_stage=3, micro_batch=8)
    default = predict(_w(), base, _hw())
    expandable = predict(_w(), base.with_(allocator="expandable-segments"), _hw())
    emptied = predict(_w(), base.with_(empty_cache="every-step"), _hw())
    assert expandable.breakdown["fragmentation"] < default.breakdown["fragmentation"]
    # the caching allocator returns nothing until empty_cache: without it the forward finds the previous
    # step's optimizer-step reservation; after an every-step call it reserves only its own need
    phase = {ph.name: ph.peak_reserved_bytes for ph in default.phases}
    emptied_phase = {ph.name: ph.peak_reserved_bytes for ph in emptied.phases}
    assert emptied_phase["forward"] < phase["forward"] == phase["optimizer_step"]
    # (not the whole step's peak: blocks kept for the run, the cuBLAS workspaces made inside the first step,
    # pin their segments through every empty_cache, and the next step's requests land around them)
    assert emptied.step_time_s > default.step_time_s
    assert expandable.peak_allocated_bytes == default.peak_allocated_bytes


def test_dpo_reference_costs_a_model_copy_unless_lora_disables_adapters() -> None:
    full = predict(_w(kind="dpo"), Strategy(micro_batch=4, grad_accum=2), _hw())
    lora = predict(_w(kind="dpo"), Strategy(micro_batch=4, grad_accum=2, lora_rank=16), _hw())
    assert full.breakdown["reference_model"] == 2 * get_model("opt-1.3b").total_params
    assert lora.breakdown["reference_model"] == 0
    assert any(phase.name == "reference_forward" for phase in full.phases)


def test_lora_trains_far_fewer_states() -> None:
    full = predict(_w(), Strategy(micro_batch=8), _hw())
    lora = predict(_w(), Strategy(micro_batch=8, lora_rank=16), _hw())
    assert lora.breakdown["optimizer_states"] < full.breakdown["optimizer_states"] / 50


def test_more_data_parallel_gpus_add_communication_time() -> None:
    one = predict(_w(batch=8), Strategy(zero_stage=2, micro_batch=8), _hw(gpus=1))
    eight = predict(_w(batch=64), Strategy(zero_stage=2, micro_batch=8), _hw(gpus=8))
    assert one.time_breakdown["communication"] == 0
    assert eight.time_breakdown["communication"] > 0


def test_peak_reserved_is_at_least_peak_allocated_everywhere() -> None:
    for z in (0, 1, 2, 3):
        for alloc in ("default", "expandable-segments"):
            p = predict(_w(kind="dpo"), Strategy(zero_stage=z, micro_batch=2, grad_accum=4, allocator=alloc), _hw())
            for phase in p.phases:
                assert phase.peak_reserved_bytes >= phase.peak_allocated_bytes
            assert sum(p.breakdown.values()) == p.peak_reserved_bytes


def test_every_coefficient_has_unit_reason_and_positive_default() -> None:
    rows = describe_coefficients()
    assert len(rows) == len(dataclasses.fields(DEFAULT_COEFFICIENTS))
    for row in rows:
        assert row["unit"] and len(row["reason"]) > 15 and row["default"] > 0, row["name"]

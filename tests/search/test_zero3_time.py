"""ZeRO-3's step time from its own mechanism (``search.model.zero3_time``): the terms exist only under ZeRO-3,
follow the model's modules and tensors (depth, checkpointing, offload), and make ZeRO-3 slower than ZeRO-2 on
one GPU, where DeepSpeed's hooks are ZeRO-3's whole difference. Pinned to the counts, never to a measured time."""

from __future__ import annotations

import pytest

from search import DEFAULT_COEFFICIENTS
from search.model.placement import trained_placement
from search.model.training_time import TrainingSeconds, training_time
from search.model.zero3_time import hooked_modules, modules_per_layer, zero3_passes, zero3_rates
from store.gpus import get_gpu
from store.models import get_model, with_layers
from store.records import Hardware, ModelSpec, TrainedModelStrategy

ZERO3_TERMS = ("zero3_module_hooks", "zero3_grad_hooks")


def _seconds(
    model: ModelSpec, stage: int, *, ckpt: bool = True, offload: str = "none", gpu: str = "H100-80G", mb: int = 8
) -> TrainingSeconds:
    spec = get_gpu(gpu)
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes)
    layout = TrainedModelStrategy(zero_stage=stage, offload_optimizer=offload, gradient_checkpointing=ckpt)
    placement = trained_placement(model, True, layout, "bf16", 1, 1, DEFAULT_COEFFICIENTS)
    return training_time(placement, mb, 1, 1024, "bf16", hardware, DEFAULT_COEFFICIENTS)


def test_the_traced_opt_layer_has_the_modules_the_formula_counts() -> None:
    """The counts are per module of the traced OPT layer; the formula that carries them to other families gives
    the OPT layer the same number."""
    assert modules_per_layer(get_model("opt-1.3b")) == zero3_rates().modules_per_layer
    assert modules_per_layer(get_model("llama-3.2-1b")) == 13  # and mlp, gate/up/down, act_fn


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_the_terms_vanish_below_stage_3(stage: int) -> None:
    terms = _seconds(get_model("opt-1.3b"), stage).terms
    assert not any(name.startswith("zero3_") for name in terms)


@pytest.mark.parametrize("offload", ["none", "cpu"])
@pytest.mark.parametrize("name", ["opt-1.3b", "opt-2.7b", "llama-3.2-1b"])
def test_zero3_is_slower_than_zero2_on_one_gpu(name: str, offload: str) -> None:
    model = get_model(name)
    zero2, zero3 = _seconds(model, 2, offload=offload), _seconds(model, 3, offload=offload)
    assert zero3.total > zero2.total


def test_the_step_names_the_new_terms() -> None:
    """opt-1.3b at 8 x 1024 tokens: ZeRO-3's passes are host-bound, so the step's terms name its hooks."""
    terms = _seconds(get_model("opt-1.3b"), 3).terms
    for term in (*ZERO3_TERMS, "zero3_recompute_hooks"):
        assert terms[term] > 0
    assert max(terms, key=lambda name: terms[name]) == "zero3_module_hooks"


def test_the_host_terms_grow_with_depth_as_the_counts_do() -> None:
    """Both passes' hook seconds are (modules outside the layers + layers x modules per layer) x a cost per call,
    and the gradient hooks are the trainable tensors' count times theirs: linear in depth."""
    base = get_model("opt-1.3b")
    passes = {}
    for layers in (4, 8, 16):
        model = with_layers(base, layers)
        passes[layers] = zero3_passes(
            model,
            "bf16",
            get_gpu("H100-80G"),
            DEFAULT_COEFFICIENTS,
            lora_rank=0,
            lm_head=True,
            checkpointing=True,
            offload_optimizer=False,
            trainable=1,
        )
    for clock in ("zero3_module_hooks", "zero3_grad_hooks", "zero3_recompute_hooks"):
        values = [passes[n].backward.host[clock] for n in (4, 8, 16)]
        assert values[2] - values[1] == pytest.approx(2 * (values[1] - values[0]), rel=1e-9)
    forward = [passes[n].forward.host["zero3_module_hooks"] for n in (4, 8, 16)]
    assert forward[2] - forward[1] == pytest.approx(2 * (forward[1] - forward[0]), rel=1e-9)
    rates = zero3_rates()
    per_call = rates.per_call("pre_forward", False) + rates.per_call("post_forward", False)
    per_call += rates.per_call("forward_wrapper", False)
    modules = hooked_modules(with_layers(base, 4))
    fixed = sum(rates.per_step(name, False) for name in ("pre_forward", "post_forward", "forward_wrapper"))
    expected = (modules * rates.forward_calls_per_module * per_call + fixed) * DEFAULT_COEFFICIENTS.host_s_per_kernel
    assert forward[0] == pytest.approx(expected, rel=1e-12)


def test_checkpointing_adds_the_recompute_hooks_and_offload_costs_more_per_gradient() -> None:
    model = get_model("opt-1.3b")
    plain, ckpt = _seconds(model, 3, ckpt=False), _seconds(model, 3, ckpt=True)
    assert "zero3_recompute_hooks" not in plain.terms and ckpt.terms["zero3_recompute_hooks"] > 0
    assert ckpt.total > plain.total
    args = (model, "bf16", get_gpu("H100-80G"), DEFAULT_COEFFICIENTS)
    kwargs = {"lora_rank": 0, "lm_head": True, "checkpointing": False, "trainable": 1}
    on_gpu = zero3_passes(*args, offload_optimizer=False, **kwargs)
    offloaded = zero3_passes(*args, offload_optimizer=True, **kwargs)
    assert offloaded.backward.host["zero3_grad_hooks"] > on_gpu.backward.host["zero3_grad_hooks"]


def test_the_hooks_are_priced_by_the_calibrated_host_rate() -> None:
    """No ZeRO-3 constant: the host terms scale with ``host_s_per_kernel`` and nothing else of the host."""
    model = get_model("opt-1.3b")
    args = (model, "bf16", get_gpu("H100-80G"))
    kwargs = {"lora_rank": 0, "lm_head": True, "checkpointing": True, "offload_optimizer": False, "trainable": 1}
    base = zero3_passes(*args, DEFAULT_COEFFICIENTS, **kwargs)
    doubled = zero3_passes(
        *args, DEFAULT_COEFFICIENTS.with_(host_s_per_kernel=2 * DEFAULT_COEFFICIENTS.host_s_per_kernel), **kwargs
    )
    for name, value in base.backward.host.items():
        assert doubled.backward.host[name] == pytest.approx(2 * value, rel=1e-12)


def test_zero3_offload_uploads_from_pageable_memory_and_zero2_from_its_pinned_buffer() -> None:
    """stage3.py's step casts the fp32 master into a new host tensor and uploads it from pageable memory; it also
    unscales the fp32 gradient on the host. stage_1_and_2.py casts into a pinned buffer made once and uploads it at
    the link's rate. Each term is its bytes over its rate: 16-bit bytes per parameter over the pageable rate, 8 bytes
    (fp32 read and write) over host memory, fp32 read + 16-bit write over host memory plus the new pages' first
    touch."""
    coef = DEFAULT_COEFFICIENTS
    model = get_model("opt-1.3b")
    zero3 = _seconds(model, 3, offload="cpu").terms
    zero2 = _seconds(model, 2, offload="cpu").terms
    params = trained_placement(model, True, TrainedModelStrategy(zero_stage=3), "bf16", 1, 1, coef).trainable
    assert zero3["zero3_param_upload"] == pytest.approx(2 * params / (coef.pageable_copy_gbps * 1e9))
    assert zero3["zero3_unscale"] == pytest.approx(8 * params / (coef.host_memory_gbps * 1e9))
    conversion = 6 * params / (coef.host_memory_gbps * 1e9) + 2 * params / (coef.host_first_touch_gbps * 1e9)
    assert zero3["zero3_param_conversion"] == pytest.approx(conversion)
    assert not any(name.startswith("zero3_") for name in zero2)
    pinned = get_gpu("H100-80G").pcie_gbps * get_gpu("H100-80G").pcie_efficiency * 1e9
    assert zero2["pcie"] == pytest.approx((4 + 2) * params / pinned)  # fp32 gradients down, 16-bit partition up
    assert zero3["zero3_param_upload"] > 5 * 2 * params / pinned  # the pageable upload is no DMA at the link's rate

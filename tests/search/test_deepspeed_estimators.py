"""The cost model's model-state bytes against DeepSpeed's own estimators, wherever those apply.

DeepSpeed's ``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
count parameters, gradients and optimizer states (no activations, buffers or fragments) for a
mixed-precision Adam run. Our ``model_states`` must give the same GPU bytes at the optimizer step,
the moment every state is live, and the same host bytes where the host term is the offloaded states.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from search.model.shapes import largest_module_params  # noqa: E402
from search.model.states import model_states  # noqa: E402
from store.ds_defaults import ZERO3_SUB_GROUP_SIZE  # noqa: E402
from store.models import get_model  # noqa: E402

zero2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
zero3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

MODELS = ("opt-1.3b", "llama-3.1-8b", "qwen2.5-14b")
LAYOUTS = ((1, 1), (8, 1), (8, 4))  # (GPUs per node, nodes)


def _states(model_name: str, stage: int, offload_optimizer: str, offload_param: str, gpus: int, nodes: int):
    model = get_model(model_name)
    return model, model_states(
        model=model,
        trainable=model.total_params,
        frozen=0,
        dtype="bf16",
        zero_stage=stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        world_size=gpus * nodes,
        grad_accum=1,
    )


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize(("gpus", "nodes"), LAYOUTS)
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_gpu_bytes_equal_deepspeed_estimator(model_name: str, gpus: int, nodes: int, offload: bool) -> None:
    model, states = _states(model_name, 2, "cpu" if offload else "none", "none", gpus, nodes)
    _, ds_gpu = zero2.estimate_zero2_model_states_mem_needs(
        model.total_params, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload
    )
    ours = states.gpu_total + states.step_transient
    assert abs(ours - ds_gpu) <= 8, (ours, ds_gpu)  # integer division of 2 + 2 + 4 + 12 bytes per param


@pytest.mark.parametrize("model_name", MODELS)
def test_zero2_offload_host_bytes_equal_deepspeed_estimator_on_one_gpu(model_name: str) -> None:
    model, states = _states(model_name, 2, "cpu", "none", 1, 1)
    ds_cpu, _ = zero2.estimate_zero2_model_states_mem_needs(model.total_params, cpu_offload=True)
    from search.coefficients import DEFAULT_COEFFICIENTS

    assert DEFAULT_COEFFICIENTS.host_buffer_factor * states.host == pytest.approx(ds_cpu, rel=1e-9)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize(("gpus", "nodes"), LAYOUTS)
@pytest.mark.parametrize(("offload_optimizer", "offload_param"), [("cpu", "cpu"), ("cpu", "none")])
def test_zero3_offload_gpu_bytes_equal_deepspeed_estimator(
    model_name: str, gpus: int, nodes: int, offload_optimizer: str, offload_param: str
) -> None:
    model, states = _states(model_name, 3, offload_optimizer, offload_param, gpus, nodes)
    _, ds_gpu, largest = zero3.estimate_zero3_model_states_mem_needs(
        model.total_params,
        largest_module_params(model),
        num_gpus_per_node=gpus,
        num_nodes=nodes,
        cpu_offload=True,
        cpu_offload_params=offload_param == "cpu",
    )
    assert states.zero3_gathered == largest
    assert abs(states.gpu_total + states.step_transient - ds_gpu) <= 2, (states.gpu_total, ds_gpu)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize(("gpus", "nodes"), LAYOUTS)
def test_zero3_without_offload_differs_from_estimator_by_the_fp32_gradient(
    model_name: str, gpus: int, nodes: int
) -> None:
    """DeepSpeed's estimator counts 18 bytes/param/N for ZeRO-3 without offload: 16 for what stage3.py
    holds between steps (16-bit params and grads, fp32 master, m, v) plus 2 for an fp32 gradient. The
    code creates that gradient (4 bytes, with a flattened 16-bit copy) one sub-group of at most
    sub_group_size elements at a time, during the step only. So: estimator = steady + 2P/N exactly,
    and our step peak adds at most 6 bytes per partition element, capped by the sub-group."""
    model, states = _states(model_name, 3, "none", "none", gpus, nodes)
    n = gpus * nodes
    _, ds_gpu, _ = zero3.estimate_zero3_model_states_mem_needs(
        model.total_params,
        largest_module_params(model),
        num_gpus_per_node=gpus,
        num_nodes=nodes,
        cpu_offload=False,
        cpu_offload_params=False,
    )
    steady = states.gpu_total
    assert abs(ds_gpu - (steady + 2 * model.total_params // n)) <= 4
    assert 0 < states.step_transient <= 6 * min(model.total_params // n, ZERO3_SUB_GROUP_SIZE)


def test_largest_module_matches_deepspeed_walk_of_a_real_model() -> None:
    """DeepSpeed's model_to_params walks modules; our shape formula must find the same largest one."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    for name in ("opt-350m", "gpt2", "qwen2.5-0.5b"):
        spec = get_model(name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec.hf_config))
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
        assert largest_module_params(spec) == largest, name

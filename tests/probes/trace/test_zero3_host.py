"""ZeRO-3's host work counted on a real engine (``probes.trace.zero3_host``), pinned against DeepSpeed's code.

A real ZeRO-3 engine (CPU accelerator, gloo, one rank) trains the tiny OPT at one and two layers, in one child
process (DeepSpeed's process group and module hooks stay out of the test process). After the fetch trace is
complete, one step's counts must follow the structure DeepSpeed's code gives them:

- ``parameter_offload.py _register_deepspeed_module`` hooks every module, so the forward's pre-hook runs once per
  module the forward calls, and ``PreBackwardFunctionForModule`` on every module's outputs runs the backward's
  pre-hook as often;
- each module hook calls the coordinator once: fetches = pre-hooks, releases = post-hooks;
- ``stage3.py create_reduce_and_remove_grad_hooks`` puts one hook on every trainable parameter;
- non-reentrant checkpointing recomputes every submodule of each layer inside the backward;
- each count grows by the same amount per layer, so two depths give it at any depth.
The committed counts (``store/zero3_host_counts.json``, which the cost model reads) must be what the code does
today.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from script_cases import report, run_script_case

from probes.trace.zero3_host import COUNTS_PATH, WIDTH


def _called_modules(layers: int) -> tuple[int, int]:
    """(modules the plain model's forward calls, modules of one decoder layer), read with torch's own hooks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("opt", num_hidden_layers=layers, dropout=0.0, **WIDTH)
    model = AutoModelForCausalLM.from_config(config)
    called: set[str] = set()
    for name, module in model.named_modules():
        module.register_forward_pre_hook(lambda _m, _a, name=name: called.add(name))
    batch = torch.randint(3, WIDTH["vocab_size"], (2, 8))
    model(input_ids=batch, labels=batch)
    return len(called), len(list(model.model.decoder.layers[0].modules()))


CHILD_TIMEOUT_S = 600


def count_all(_case: dict[str, Any]) -> dict[str, Any]:
    """In the child: both configurations at both depths, as ``python -m probes.trace.zero3_host --counts-only
    [--checkpointing] 1 2`` counts one of them (one process, so its imports are paid once)."""
    from probes.trace.zero3_host import _start, count_case

    _start()
    return {
        "cases": [
            count_case(depth, checkpointing, False, timed=False) for checkpointing in (False, True) for depth in (1, 2)
        ]
    }


@pytest.fixture(scope="module")
def counted() -> dict[bool, dict[int, dict[str, Any]]]:
    """The counts by gradient checkpointing, then by depth (1 and 2 layers), from one fresh one-rank process
    (forked from the probes' preloaded starter: ``script_cases.run_script_case``)."""
    cases = run_script_case(__file__, "zero3-host-counts", {}, CHILD_TIMEOUT_S)["cases"]
    out: dict[bool, dict[int, dict[str, Any]]] = {False: {}, True: {}}
    for case in cases:
        out[case["gradient_checkpointing"]][case["layers"]] = case
    assert {flag: sorted(by_depth) for flag, by_depth in out.items()} == {False: [1, 2], True: [1, 2]}
    return out


@pytest.fixture(scope="module")
def plain(counted: dict[bool, dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    return counted[False]


@pytest.fixture(scope="module")
def checkpointed(counted: dict[bool, dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    return counted[True]


@pytest.mark.slow
def test_hook_calls_follow_the_modules_and_parameters(plain: dict[int, dict[str, Any]]) -> None:
    for layers, case in plain.items():
        calls = case["calls"]
        called, _ = _called_modules(layers)
        assert case["trace_complete"]
        assert calls["pre_forward"] == calls["post_forward"] == called
        assert calls["pre_backward"] == called
        assert calls["post_backward"] <= calls["pre_backward"]  # only modules whose positional inputs need grad
        assert calls["fetch"] == calls["pre_forward"] + calls["pre_backward"]
        assert calls["release"] == calls["post_forward"] + calls["post_backward"]
        assert calls["grad_hook"] == case["structure"]["param_tensors"]
        assert calls["step"] == 1


@pytest.mark.slow
def test_the_recompute_calls_each_layers_submodules_again(
    plain: dict[int, dict[str, Any]], checkpointed: dict[int, dict[str, Any]]
) -> None:
    for layers in (1, 2):
        _, per_layer = _called_modules(layers)
        extra = checkpointed[layers]["calls"]["pre_forward"] - plain[layers]["calls"]["pre_forward"]
        assert extra == layers * (per_layer - 1)
        assert checkpointed[layers]["calls"]["pre_backward"] == plain[layers]["calls"]["pre_backward"]
        assert checkpointed[layers]["calls"]["grad_hook"] == plain[layers]["calls"]["grad_hook"]


@pytest.mark.slow
def test_counts_are_linear_in_depth_and_the_committed_rates_are_todays(
    plain: dict[int, dict[str, Any]], checkpointed: dict[int, dict[str, Any]]
) -> None:
    rates = json.loads(COUNTS_PATH.read_text(encoding="utf-8"))["rates"]
    _, per_layer = _called_modules(1)
    one, two = plain[1], plain[2]
    assert two["structure"]["modules"] - one["structure"]["modules"] == per_layer == rates["modules_per_layer"]
    assert one["structure"]["modules"] - per_layer == rates["modules_outside_layers"]
    tensors = two["structure"]["param_tensors"] - one["structure"]["param_tensors"]
    assert tensors == rates["param_tensors_per_layer"]
    step = {k: two["calls"][k] - one["calls"][k] for k in one["calls"]}
    assert step["pre_forward"] / per_layer == rates["forward_calls_per_module"]
    assert step["pre_backward"] / per_layer == rates["backward_pre_calls_per_module"]
    assert step["post_backward"] / per_layer == rates["backward_post_calls_per_module"]
    assert step["grad_hook"] / tensors == rates["grad_hooks_per_tensor"]
    assert step["grad_reduce"] / tensors == rates["grad_reduces_per_tensor"]
    recompute = (checkpointed[2]["calls"]["pre_forward"] - checkpointed[1]["calls"]["pre_forward"]) - step[
        "pre_forward"
    ]
    assert recompute / per_layer == rates["recompute_calls_per_module"]
    # the committed four-depth rates extrapolate to these depths exactly
    for case in (one, two):
        layers = case["layers"]
        assert case["calls"]["pre_forward"] == (
            case["structure"]["modules"] - 2  # the ModuleList of layers and OPTForCausalLM.model are never called
        )
        assert case["calls"]["grad_hook"] == layers * tensors + (one["structure"]["param_tensors"] - tensors)


def test_every_case_of_the_committed_counts_completed_its_trace() -> None:
    data = json.loads(COUNTS_PATH.read_text(encoding="utf-8"))
    assert {(c["layers"], c["gradient_checkpointing"], c["offload_optimizer"]) for c in data["cases"]} == {
        (layers, ckpt, off) for layers in (2, 4) for ckpt in (False, True) for off in ("none", "cpu")
    }
    assert all(c["trace_complete"] for c in data["cases"])
    hooks = ("pre_forward", "post_forward", "pre_backward", "post_backward", "grad_hook", "forward_wrapper")
    for kind in ("op_equivalents", "op_equivalents_offload"):
        assert all(data["rates"][kind][name] > 0 for name in hooks)
        assert all(value >= 0 for value in data["rates"][f"fixed_{kind}"].values())


if __name__ == "__main__":
    report(count_all(json.loads(sys.argv[1])))

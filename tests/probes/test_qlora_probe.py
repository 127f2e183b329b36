"""QLoRA probes (issue 32 item 3): bitsandbytes' own layers in memmplan's probe, on DeepSpeed's CPU accelerator.

bitsandbytes 0.50 quantizes and runs its 4-bit and 8-bit layers on the CPU too, so a probe here measures the
quantized model's live tensor bytes (the CPU backend's dispatch-level tracker) and holds the cost model to them.
"""

from __future__ import annotations

from typing import Any

import pytest
from one_starter import settle_environment
from tiny_models import tiny_llama_hf_config

from search import DEFAULT_COEFFICIENTS, predict
from search.model.shapes import linear_shapes
from store.measurements import ProbeRequest, ProbeResult
from store.quantization import nf4_bytes
from store.records import Hardware, Strategy, Workload

pytestmark = pytest.mark.slow
LLAMA = {"model_type": "llama", **tiny_llama_hf_config()}
WORKLOAD: dict[str, Any] = {"kind": "sft", "model": "tiny", "seq_len": 16, "global_batch": 2, "dtype": "fp32"}
WORKLOAD.update(attn_impl="sdpa", hf_configs={"model": LLAMA})
HARDWARE = {"gpu": "generic-24G", "gpu_memory_bytes": 24 * 2**30, "gpus": 1, "nodes": 1}


def _probe(strategy: dict[str, Any]) -> ProbeResult:
    pytest.importorskip("bitsandbytes", reason="the frameworks extra installs bitsandbytes")
    from probes import run_probe

    settle_environment()
    request = ProbeRequest(WORKLOAD, strategy, HARDWARE, device="cpu", steps=3, timeout_s=1800.0)
    result = run_probe(request)
    assert result.outcome == "ok", f"{result.message}\n{result.extra.get('traceback', '')}"
    return result


def _predicted(strategy: dict[str, Any]) -> int:
    """The cost model's figure as the CPU backend measures it (planner.probing.device: no CUDA context, cuBLAS
    workspace or caching allocator; host-resident states are live tensors there)."""
    from planner.probing.device import device_coefficients, device_prediction
    from probes.model.build import plan_from_request

    plan = plan_from_request(ProbeRequest(WORKLOAD, strategy, HARDWARE, device="cpu", steps=3))
    assert isinstance(plan.workload, Workload) and isinstance(plan.strategy, Strategy)
    assert isinstance(plan.hardware, Hardware)
    coef = device_coefficients("cpu", DEFAULT_COEFFICIENTS)
    return device_prediction(predict(plan.workload, plan.strategy, plan.hardware, coef), "cpu").peak_allocated_bytes


@pytest.mark.parametrize(
    "layout",
    [
        {"zero_stage": 2, "gradient_checkpointing": True},
        {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "gradient_checkpointing": True},
    ],
    ids=["zero2", "zero3-offload"],
)
def test_a_4bit_base_holds_what_bitsandbytes_holds_and_the_model_predicts_it(layout: dict[str, Any]) -> None:
    """The probe swaps each block linear for bitsandbytes' Linear4bit (quantized as transformers loads it); with the
    base on the device its measured bytes fall below the 16-bit LoRA's by about what the 4-bit codes save, and the
    prediction follows the measurement in both layouts."""
    lora = {**layout, "lora_rank": 4}
    qlora = {**lora, "quantization": "nf4"}
    probed = _probe(qlora)
    assert probed.extra["quantized_linears"] == 2 * 7  # q, k, v, o, gate, up, down in each layer; not lm_head
    if layout["zero_stage"] == 2:  # the whole base on the device: fp32 weights against their nf4 codes, less the
        # one weight bitsandbytes dequantizes at a time (F.dequantize_4bit in the backward; on the CPU the forward too)
        weights = [i * o for i, o in linear_shapes(_spec())] * 2
        saved = sum(4 * n - nf4_bytes(n) for n in weights) - 4 * max(weights)
        measured_lora = _probe(lora).peak_allocated_bytes
        assert measured_lora - probed.peak_allocated_bytes == pytest.approx(saved, rel=0.1)
    # under ZeRO-3 with offload the codes stay on the host: the prediction, which counts them there, holds it
    assert _predicted(qlora) == pytest.approx(probed.peak_allocated_bytes, rel=0.05)


def test_an_8bit_base_probes_too() -> None:
    probed = _probe({"zero_stage": 2, "lora_rank": 4, "quantization": "int8"})
    assert probed.extra["quantized_linears"] == 14 and probed.peak_allocated_bytes > 0


def _spec() -> Any:
    from probes.model.shape import spec_of_config

    return spec_of_config("tiny", LLAMA)

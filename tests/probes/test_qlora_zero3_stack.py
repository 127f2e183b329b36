"""PEFT's ZeRO-3 QLoRA recipe on the real stack (transformers, bitsandbytes, PEFT, DeepSpeed on the CPU accelerator):
what memplan's cost model and export claim about it (store.quantization, search.model.quantized), checked against
what the libraries do (tests/probes/qlora_zero3_child.py, run in its own process: ``script_cases``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from script_cases import run_script_case

from store.quantization import nf4_constants_bytes, nf4_stored_elements

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("bitsandbytes", reason="the frameworks extra installs bitsandbytes")
    pytest.importorskip("peft", reason="the frameworks extra installs peft")
    out = tmp_path_factory.mktemp("qlora_zero3")
    # generous: a busy 2-core machine; it takes seconds
    return run_script_case(
        str(ROOT / "tests/probes/qlora_zero3_child.py"), "qlora_zero3", {"out": str(out / "model")}, 1800
    )


def test_deepspeed_partitions_the_packed_codes_as_bf16_elements(ran: dict[str, Any]) -> None:
    """The cost model's ZeRO-3 QLoRA bytes: each 4-bit weight is ``(n + 1) // 4`` bf16 elements to DeepSpeed
    (search.model.quantized.quantized_weight_elements), its QuantState constants beside it."""
    assert ran["weights"]
    for weight in ran["weights"]:
        assert weight["storage_bytes"] == 2
        assert weight["ds_numel"] == nf4_stored_elements(weight["weights"], 2)
        assert weight["constants_bytes"] == nf4_constants_bytes(weight["weights"])


def test_transformers_loads_a_quantized_model_whole_and_refuses_a_device_map_under_zero3(ran: dict[str, Any]) -> None:
    """Why a ZeRO-3 QLoRA plan's init peaks at the whole 4-bit model, and why its host loading happens before the
    ZeRO-3 config exists (store.quantization.qlora_loading)."""
    assert not ran["built_partitioned_under_zero3"]
    assert "not compatible with passing a `device_map`" in ran["device_map_refused_under_zero3"]


def test_the_adapters_train_and_the_codes_stay(ran: dict[str, Any]) -> None:
    assert all(loss == loss and loss < 100 for loss in ran["losses"])  # finite
    assert ran["lora_changed"] and ran["codes_unchanged"]

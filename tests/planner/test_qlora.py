"""QLoRA as a strategy (issue 32 item 3): bitsandbytes' bytes, the JSON knob, refusals, the 70B plan, exports."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.probing.session import refuse_quantized_probe
from store.errors import InputError
from store.quantization import int8_bytes, nf4_bytes
from store.records import RLHFStrategy, Strategy, TrainedModelStrategy
from tests.planner.planner_helpers import assert_one_error_line, run_main

SFT_70B = ["--workload", "sft", "--model", "llama-3-70b", "--seq-len", "1024", "--batch", "1"]


def test_nf4_and_int8_bytes_follow_bitsandbytes_formulas() -> None:
    """bitsandbytes 0.50.1 _ops.py:232-236 (packed (n+1)//2 uint8, ceil(n/64) float32 absmax), functional.py:938-940
    (double quantization: uint8 absmax, float32 absmax per 256 blocks, one float32 offset), _ops.py:95-98 (int8
    codes plus one float32 scale per row)."""
    n = 4096 * 4096
    blocks = n // 64
    assert nf4_bytes(n, double_quant=False) == n // 2 + 4 * blocks  # 0.5 + 4/64 = 0.5625 bytes a weight
    assert nf4_bytes(n) == n // 2 + blocks + 4 * (blocks // 256) + 4  # 0.5 + 1/64 + 4/16384 bytes a weight
    assert nf4_bytes(65) == 33 + 4 * 2 - 8 + 2 + 4 + 4  # odd count, a partial block, one second-level block
    assert int8_bytes(11008, 4096) == 11008 * 4096 + 4 * 11008


def test_strategy_json_round_trip_and_label() -> None:
    q = Strategy(zero_stage=2, offload_optimizer="cpu", gradient_checkpointing=True, lora_rank=16, quantization="nf4")
    assert q.to_dict()["quantization"] == "nf4"
    assert Strategy.from_dict(q.to_dict()) == q
    assert "QLoRA nf4 r16" in q.describe()
    assert "quantization" not in Strategy(lora_rank=16).to_dict()  # older documents stay as they were
    block = TrainedModelStrategy(1, lora_rank=8, quantization="int8")
    assert block.to_dict()["quantization"] == "int8" and "QLoRA int8 r8" in block.describe()


@pytest.mark.parametrize(
    ("strategy", "fragment"),
    [
        ('{"zero_stage": 2, "lora_rank": 0, "quantization": "nf4"}', "set lora_rank > 0"),
        ('{"zero_stage": 3, "lora_rank": 16, "quantization": "int8"}', "zero_stage 3 is not planned"),
        ('{"zero_stage": 2, "lora_rank": 16, "quantization": "fp4"}', "quantization must be one of none, nf4, int8"),
    ],
)
def test_impossible_qlora_is_one_line_exit_2(strategy: str, fragment: str) -> None:
    result = run_main(["predict", *SFT_70B, "--gpu-mem", "48G", "--strategy", strategy])
    assert_one_error_line(result, fragment)


def test_rlhf_quantization_is_refused_with_a_reason() -> None:
    with pytest.raises(InputError, match="QLoRA is planned for single-model training"):
        RLHFStrategy(actor=TrainedModelStrategy(2, lora_rank=16, quantization="nf4"))


def test_nf4_base_weights_cost_a_third_of_bf16(tmp_path: Path) -> None:
    """llama-3.1-70b: NF4 block linears plus bf16 embeddings and head, against the whole model in bf16."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    base = '{"zero_stage": 2, "offload_optimizer": "cpu", "gradient_checkpointing": true, "lora_rank": 16'
    docs = {}
    for q in ("none", "nf4"):
        result = run_main(
            [
                "predict",
                *SFT_70B,
                "--gpu-mem",
                "48G",
                "--db",
                db,
                "--json",
                "--strategy",
                base + f', "quantization": "{q}"}}',
            ]
        )
        assert result.rc in (0, 1), result.err
        docs[q] = result.json()
    params = {q: d["predicted"]["breakdown"]["parameters"] for q, d in docs.items()}
    assert 35 * 2**30 < params["nf4"] < 39 * 2**30 < 130 * 2**30 < params["none"]
    assert docs["nf4"]["fits"] and not docs["none"]["fits"]
    # the backward's dequantization costs time: nf4 is slower than bf16 LoRA on the same layout
    assert docs["nf4"]["predicted"]["step_time_s"] > docs["none"]["predicted"]["step_time_s"]


def test_recommend_picks_qlora_for_70b_on_48g_and_says_what_24g_lacks(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    fits = run_main(["recommend", *SFT_70B, "--gpu-mem", "48G", "--db", db, "--json"])
    assert fits.rc == 0, fits.err
    assert fits.json()["strategy"]["quantization"] == "nf4"
    assert any("QLoRA" in line and "different recipe" in line for line in fits.json()["suggestions"])
    short = run_main(["recommend", *SFT_70B, "--gpu-mem", "24G", "--db", db])
    assert short.rc == 1
    assert "QLoRA nf4 r16" in short.out and "needs" in short.out


def test_trl_model_config_takes_the_qlora_keys() -> None:
    model_config = pytest.importorskip("trl.trainer.model_config")
    from launch.frameworks.trl import model_config as keys_of
    from store.models import get_model
    from store.records import Workload

    strategy = Strategy(zero_stage=2, lora_rank=16, quantization="nf4")
    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=512, global_batch=4)
    keys = keys_of(strategy, workload)
    assert keys["load_in_4bit"] is True and keys["bnb_4bit_quant_type"] == "nf4" and keys["use_bnb_nested_quant"]
    config = model_config.ModelConfig(model_name_or_path="facebook/opt-125m", **keys)
    assert config.load_in_4bit and config.use_bnb_nested_quant


def test_a_qlora_probe_without_bitsandbytes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A QLoRA probe loads bitsandbytes' layers (tests/probes/test_qlora_probe.py runs them); where bitsandbytes is
    not installed it is one line, never a 16-bit LoRA probed in its place."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    strategy = Strategy(zero_stage=2, lora_rank=16, quantization="nf4")
    with pytest.raises(InputError, match="bitsandbytes is not installed"):
        refuse_quantized_probe([strategy])
    refuse_quantized_probe([Strategy(lora_rank=16)])  # a 16-bit LoRA probes as before


def test_a_training_forward_dequantizes_past_the_fused_kernels_rows() -> None:
    """bitsandbytes' CUDA gemm_4bit runs its fused kernel for at most 1536 rows and otherwise dequantizes and calls
    F.linear (backends/cuda/ops.py): a training micro-batch's forward pays the dequantization as the backward does,
    and a checkpointed recompute once more; a short forward does not."""
    from search import DEFAULT_COEFFICIENTS
    from search.model.placement import trained_placement
    from search.model.quantized import GEMM_4BIT_CUSTOM_MAX_M, forward_dequantizes
    from search.model.training_time import training_time
    from store.gpus import get_gpu
    from store.models import get_model
    from store.records import Hardware

    assert GEMM_4BIT_CUSTOM_MAX_M == 1536
    assert forward_dequantizes("nf4", 2048) and not forward_dequantizes("nf4", 1536)
    assert not forward_dequantizes("int8", 8192)
    spec = get_gpu("A100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes)
    model = get_model("llama-3.1-8b")

    def seconds(ckpt: bool, seq_len: int) -> tuple[float, float, float]:
        layout = TrainedModelStrategy(2, gradient_checkpointing=ckpt, lora_rank=16, quantization="nf4")
        placed = trained_placement(model, True, layout, "bf16", 1, 1, DEFAULT_COEFFICIENTS)
        t = training_time(placed, 1, 1, seq_len, "bf16", hardware, DEFAULT_COEFFICIENTS)
        return t.forward, t.backward, t.terms["dequantize"]

    _, _, long_dequant = seconds(False, 2048)  # forward and backward dequantize
    _, _, short_dequant = seconds(False, 1024)  # the backward alone (the fused kernel's rows)
    _, _, ckpt_dequant = seconds(True, 2048)  # and the recompute
    assert short_dequant < long_dequant < ckpt_dequant
    assert long_dequant > 1.5 * short_dequant  # twice the bytes, on whichever clock each pass is bound


def test_qlora_is_the_fallback_only_where_no_16bit_plan_fits(tmp_path: Path) -> None:
    """4-bit base weights change what is trained: where a 16-bit LoRA plan fits (llama-2-7b on 24 GiB with 16 GiB of
    host), recommend keeps it even though QLoRA without checkpointing would be predicted faster."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    job = ["--model", "llama-2-7b", "--gpu-mem", "24G", "--cpu-mem", "16G", "--workload", "sft", "--db", db, "--json"]
    doc = run_main(["recommend", *job]).json()
    assert doc["fits"] and doc["strategy"]["lora_rank"] > 0
    assert doc["strategy"].get("quantization", "none") == "none"
    assert all(alt["strategy"].get("quantization", "none") == "none" for alt in doc["alternatives"])


def test_quantization_asked_for_plans_qlora_and_bad_values_are_one_line(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    job = ["--model", "llama-2-7b", "--gpu-mem", "24G", "--cpu-mem", "16G", "--workload", "sft", "--db", db]
    asked = run_main(["recommend", *job, "--quantization", "nf4", "--json"])
    assert asked.rc == 0, asked.err
    doc = asked.json()
    assert doc["strategy"]["quantization"] == "nf4" and doc["strategy"]["lora_rank"] == 16
    for bad, fragment in (
        (["--quantization", "q3"], "must be one of"),
        (["--quantization", "nf4", "--lora-rank", "0"], "needs LoRA"),
    ):
        result = run_main(["recommend", *job, *bad])
        assert_one_error_line(result, fragment)
    predicted = run_main(["predict", *job, "--zero", "2", "--lora-rank", "16", "--quantization", "nf4", "--json"])
    assert predicted.rc == 0, predicted.err
    assert predicted.json()["strategy"]["quantization"] == "nf4"

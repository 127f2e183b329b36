"""QLoRA under ZeRO-3 (issue 32 item 3): packed codes partitioned as compute-dtype elements, their constants whole
on every GPU, the whole 4-bit model loaded before DeepSpeed partitions it, and a 70B plan on one 24 GB GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from search import DEFAULT_COEFFICIENTS
from search.model.placement import trained_placement
from search.model.quantized import quant_constants_bytes, quantized_base_bytes
from search.model.shapes import linear_shapes
from store.errors import InputError
from store.models import get_model
from store.quantization import nf4_bytes, nf4_stored_elements
from store.records import Strategy, TrainedModelStrategy, Workload
from tests.planner.planner_helpers import run_main

SFT_70B = ["--workload", "sft", "--model", "llama-3-70b", "--seq-len", "1024", "--batch", "1"]
HOSTED = '{"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "gradient_checkpointing": true'


def test_stored_elements_follow_bitsandbytes_quant_storage() -> None:
    """bitsandbytes ``quantize_4bit`` packs ``(n + 1) // (itemsize * 2)`` storage elements (_ops.py): four 4-bit codes
    a bf16 element, eight a float32 one; the packed bytes are the same whatever the storage."""
    n = 8192 * 28672
    assert nf4_stored_elements(n, 2) == n // 4 and nf4_stored_elements(n, 4) == n // 8
    assert 2 * nf4_stored_elements(n, 2) == (n + 1) // 2


def test_zero3_partitions_the_codes_and_keeps_the_constants_whole() -> None:
    """Two GPUs hold half the packed codes and 16-bit rest each (DeepSpeed sees them as bf16 elements) and each the
    whole set of QuantState constants (absmax and the nested level: not parameters, never partitioned)."""
    model = get_model("llama-3.1-8b")
    coef = DEFAULT_COEFFICIENTS

    def placed(stage: int, world: int):  # type: ignore[no-untyped-def]
        layout = TrainedModelStrategy(stage, gradient_checkpointing=True, lora_rank=16, quantization="nf4")
        return trained_placement(model, True, layout, "bf16", world, 1, coef)

    whole = placed(2, 2)
    split = placed(3, 2)
    constants = model.num_layers * sum(nf4_bytes(i * o) - (i * o + 1) // 2 for i, o in linear_shapes(model))
    assert quant_constants_bytes(model, "nf4") == constants > 0
    adapters = 2 * whole.trainable
    # ZeRO-2 holds the codes, constants and 16-bit rest whole; ZeRO-3 half of codes and rest, without constants
    assert whole.states.parameters == quantized_base_bytes(model, "nf4", "bf16") + adapters
    assert abs(2 * split.states.parameters - (whole.states.parameters - constants)) <= 2 * 2 * 64
    # the constants sit beside ZeRO-3's buffers, on every GPU
    assert split.work.resident - whole.work.resident >= constants - 2**20 or split.work.resident > constants


def test_int8_under_zero3_is_refused_and_nf4_is_not() -> None:
    with pytest.raises(InputError, match="int8 with zero_stage 3 is not planned.*bnb_4bit_quant_storage"):
        Strategy(zero_stage=3, lora_rank=16, quantization="int8")
    Strategy(zero_stage=3, offload_optimizer="cpu", offload_param="cpu", lora_rank=16, quantization="nf4")


def test_70b_qlora_fits_one_24g_gpu_with_its_weights_on_the_host(tmp_path: Path) -> None:
    """The issue's done-when: 70B with nf4 weights, ZeRO-3 with parameters and optimizer states on the host, on one
    24 GB GPU; the host holds the 4-bit model (about 37 GiB), a third of the 16-bit one."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    job = [*SFT_70B, "--gpu-mem", "24G", "--cpu-mem", "64G", "--db", db, "--json"]
    hosted = run_main(["predict", *job, "--strategy", HOSTED + ', "lora_rank": 16, "quantization": "nf4"}'])
    assert hosted.rc == 0, hosted.err
    doc = hosted.json()
    assert doc["fits"]
    assert doc["predicted"]["peak_reserved_bytes"] < 12 * 2**30  # a gathered layer or two, the head, activations
    assert 34 * 2**30 < doc["predicted"]["host_bytes"] <= 64 * 2**30
    assert "device_map" in doc["outside_settings"]["quantization"]  # loaded on the host, as the note says
    sixteen = run_main(["predict", *job, "--strategy", HOSTED + ', "lora_rank": 16}'])
    assert not sixteen.json()["fits"]  # the 16-bit weights need three times the host memory
    assert sixteen.json()["predicted"]["host_bytes"] > 3 * doc["predicted"]["host_bytes"]
    # recommend falls back to it where no 16-bit plan fits this host
    chosen = run_main(["recommend", *job])
    assert chosen.rc == 0, chosen.err
    strategy = chosen.json()["strategy"]
    assert strategy["quantization"] == "nf4" and strategy["zero_stage"] == 3 and strategy["offload_param"] == "cpu"


def test_zero3_qlora_loads_the_whole_4bit_model_on_each_gpu_first(tmp_path: Path) -> None:
    """transformers 5.23 builds a quantized model without zero.Init and bitsandbytes' loader puts it on the GPU: the
    engines' init peaks at the whole 4-bit model, so 70B without parameter offload runs out of two 24 GB GPUs while
    loading, though its partitioned step would fit."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    strategy = '{"zero_stage": 3, "gradient_checkpointing": true, "lora_rank": 16, "quantization": "nf4"}'
    job = [*SFT_70B[:-2], "--batch", "2", "--gpus", "2", "--cpu-mem", "512G", "--db", db, "--json"]
    roomy = run_main(["predict", *job, "--gpu-mem", "80G", "--strategy", strategy]).json()
    replay = roomy["allocator_replay"]
    whole = quantized_base_bytes(get_model("llama-3.1-70b"), "nf4", "bf16")
    assert replay["init_peak_reserved_bytes"] >= whole > replay["after_init_reserved_bytes"]
    assert replay["init_peak_reserved_bytes"] > roomy["predicted"]["peak_reserved_bytes"]
    short = run_main(["predict", *job, "--gpu-mem", "24G", "--strategy", strategy])
    assert not short.json()["fits"] and short.json()["allocator_replay"]["oom_phase"] == "setup"


def test_peft_zero3_qlora_70b_on_two_40g_gpus_matches_the_published_peak() -> None:
    """PEFT's DeepSpeed guide (docs/source/accelerate/deepspeed.md, "Use PEFT QLoRA and DeepSpeed with ZeRO3"):
    Llama-2-70B, 2 GPUs, ZeRO-3 without offload, nf4 with nested quantization stored in bf16, LoRA r8 on all
    linears, seq 2048, per-device batch 2, accumulation 2, checkpointing, flash attention: 36.6 GB per GPU. The
    largest moment is the load, the whole 4-bit model on each GPU (the guide does not say GB or GiB: read as GB)."""
    from search import predict
    from search.single.predict import checked_step
    from search.step.replayed import replay_step
    from store.gpus import get_gpu
    from store.records import Hardware

    spec = get_gpu("A100-40G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=2, cpu_memory_bytes=512 * 2**30)
    workload = Workload(
        kind="sft", model=get_model("llama-2-70b"), seq_len=2048, global_batch=8, attn_impl="flash_attention_2"
    )
    strategy = Strategy(3, gradient_checkpointing=True, lora_rank=8, micro_batch=2, grad_accum=2, quantization="nf4")
    assert predict(workload, strategy, hardware, DEFAULT_COEFFICIENTS).fits
    step = checked_step(workload, strategy, hardware, DEFAULT_COEFFICIENTS)
    replayed = replay_step(step, strategy.empty_cache, strategy.allocator, DEFAULT_COEFFICIENTS)
    assert replayed.init_peak_reserved == pytest.approx(36.6e9, rel=0.06)


def test_exports_carry_the_storage_and_trl_refuses_host_loading() -> None:
    from launch.frameworks.hf import setup_notes
    from launch.frameworks.trl import model_config as trl_keys
    from store.records import Hardware

    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=512, global_batch=4)
    hosted = Strategy(3, "cpu", "cpu", True, lora_rank=16, quantization="nf4")
    on_gpu = Strategy(3, gradient_checkpointing=True, lora_rank=16, quantization="nf4")
    from store.gpus import get_gpu

    spec = get_gpu("A100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes)
    notes = " ".join(setup_notes(hosted, hardware, "bf16"))
    assert "bnb_4bit_quant_storage=torch.bfloat16" in notes and 'device_map={"": "cpu"}' in notes
    assert "quant_state.to('cuda')" in notes
    assert "device_map" not in " ".join(setup_notes(on_gpu, hardware, "bf16"))
    keys = trl_keys(on_gpu, workload)
    model_config = pytest.importorskip("trl.trainer.model_config")
    get_quantization_config = pytest.importorskip("trl").get_quantization_config
    config = model_config.ModelConfig(model_name_or_path="facebook/opt-125m", **keys)
    assert str(get_quantization_config(config).bnb_4bit_quant_storage) == "torch.bfloat16"
    with pytest.raises(InputError, match="TRL loads the 4-bit model onto the GPU"):
        trl_keys(hosted, workload)


def test_check_of_a_qlora_plans_export_needs_no_quantization_again(tmp_path: Path) -> None:
    """The export's settings file carries the plan's quantization (the model is loaded quantized, outside
    DeepSpeed's keys): ``check`` of its config predicts the QLoRA plan, not a 16-bit LoRA on the same layout."""
    db = f"sqlite:///{tmp_path / 'p.db'}"
    job = [*SFT_70B, "--gpu-mem", "24G", "--cpu-mem", "64G"]
    planned = run_main(["recommend", *job, "--quantization", "nf4", "--db", db, "--json"])
    assert planned.rc == 0, planned.err
    plan = planned.json()
    path = tmp_path / "ds_config.json"
    assert run_main(["export", plan["plan_id"], "-o", str(path), "--db", db]).rc == 0
    checked = run_main(["check", str(path), *job, "--db", db, "--json"])
    assert checked.rc == 0, checked.err
    assert checked.json()["report"]["strategy"]["quantization"] == "nf4"
    assert checked.json()["report"]["predicted"] == plan["predicted"]
    contradicted = run_main(["check", str(path), *job, "--db", db, "--quantization", "none"])
    assert contradicted.rc == 2 and "ds_config.memplan.json" in contradicted.err

"""TRL QLoRA: the ``trl sft --config`` YAML of an nf4 plan gives ``BitsAndBytesConfig`` the plan's compute dtype.

TRL 1.16's ``get_quantization_config`` (trl/trainer/utils.py) sets ``bnb_4bit_compute_dtype=model_args.dtype``,
the top-level ``dtype`` of ``ModelConfig`` (default ``"float32"``); the dtype under ``model_init_kwargs`` never
reaches it. The YAML is read by TRL's own parser, as ``trl sft --config`` (trl/scripts/sft.py) reads it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.frameworks.trl import render
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload


@pytest.mark.parametrize(("dtype", "torch_name"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_the_nf4_yaml_reaches_bitsandbytes_with_the_plans_compute_dtype(
    tmp_path: Path, dtype: str, torch_name: str
) -> None:
    trl = pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=512, global_batch=4, dtype=dtype)
    spec = get_gpu("A100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes)
    strategy = Strategy(2, gradient_checkpointing=True, lora_rank=16, quantization="nf4")
    rendered = render(strategy, workload, hardware, {"ds_config": "ds_config.json"})
    config_path = tmp_path / "trl_config.yaml"
    config_path.write_text(rendered.files["yaml"])
    # trl/scripts/sft.py parses (ScriptArguments, SFTConfig, ModelConfig) from the one YAML; the ModelConfig part
    # alone here (SFTConfig's own keys, left over, are tests/launch/test_framework_runs.py's: building it needs a
    # bf16 device and DeepSpeed's process group)
    parser = trl.TrlParser((trl.ModelConfig,))
    argv = ["--config", str(config_path), "--model_name_or_path", "unused"]
    (model_args, leftover) = parser.parse_args_and_config(argv, return_remaining_strings=True)
    assert model_args.load_in_4bit and model_args.lora_r == 16, leftover
    quantization = trl.get_quantization_config(model_args)
    assert quantization is not None and quantization.load_in_4bit
    assert quantization.bnb_4bit_compute_dtype == getattr(torch, torch_name)


def test_a_16bit_lora_yaml_sets_no_model_dtype() -> None:
    """Only a quantized plan needs ModelConfig's dtype; the model itself loads with model_init_kwargs' dtype."""
    from launch.frameworks.trl import model_config

    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=512, global_batch=4)
    assert "dtype" not in model_config(Strategy(2, lora_rank=16), workload)

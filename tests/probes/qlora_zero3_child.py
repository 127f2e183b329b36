"""Child of tests/probes/test_qlora_zero3_stack.py: PEFT's ZeRO-3 QLoRA recipe on the real stack, on the CPU.

A tiny Llama with random weights is saved to ``OUT`` (no download), loaded back 4-bit by transformers and
bitsandbytes (nf4, double quantization, codes stored in bf16), given LoRA adapters by PEFT and trained two steps by
DeepSpeed's ZeRO-3 engine with parameters and optimizer states offloaded, on DeepSpeed's CPU accelerator. It reports
one JSON object of what each library did (``script_cases.report``); the test holds memplan's cost model to it. Run in
its own process (``script_cases.run_script_case``: forked from the preloaded starter): it initializes
torch.distributed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch


def main(out: str) -> dict[str, Any]:
    import bitsandbytes as bnb
    import deepspeed
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    from tests.tiny_models import tiny_family_config

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**tiny_family_config("llama"))).to(torch.bfloat16).save_pretrained(out)
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
    }
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    # the host loading a plan with parameter offload exports: before any ZeRO-3 config is active
    model = AutoModelForCausalLM.from_pretrained(
        out, quantization_config=quantization, dtype=torch.bfloat16, device_map={"": "cpu"}
    )
    hf_config = HfDeepSpeedConfig(ds_config)  # noqa: F841  (what the Trainer makes from TrainingArguments)
    try:  # with one active, transformers refuses a device map
        AutoModelForCausalLM.from_pretrained(out, quantization_config=quantization, device_map={"": "cpu"})
        refused = ""
    except ValueError as error:
        refused = str(error)
    whole = AutoModelForCausalLM.from_pretrained(out, quantization_config=quantization, dtype=torch.bfloat16)
    built_partitioned = any(hasattr(p, "ds_id") for p in whole.parameters())
    del whole
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    trained = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=ds_config)
    weights = []
    for m in linears:
        state = m.weight.quant_state
        constants = state.absmax.numel() * state.absmax.element_size()
        if state.nested:
            constants += state.state2.absmax.numel() * state.state2.absmax.element_size() + state.offset.numel() * 4
        weights.append(
            {
                "weights": m.in_features * m.out_features,
                "ds_numel": int(m.weight.ds_numel),
                "storage_bytes": m.weight.element_size(),
                "constants_bytes": int(constants),
            }
        )
    lora = [p for n, p in engine.module.named_parameters() if "lora_B" in n]
    codes = linears[0].weight.ds_tensor.clone()
    before = lora[0].ds_tensor.clone()
    ids = torch.randint(0, 512, (1, 32))
    losses = []
    for _ in range(2):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return {
        "device_map_refused_under_zero3": refused,
        "built_partitioned_under_zero3": built_partitioned,
        "weights": weights,
        "losses": losses,
        "lora_changed": not torch.equal(before, lora[0].ds_tensor),
        # bitwise: packed codes read as bf16 hold NaN patterns, which never compare equal
        "codes_unchanged": torch.equal(codes.view(torch.int16), linears[0].weight.ds_tensor.view(torch.int16)),
    }


if __name__ == "__main__":
    from script_cases import report

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    report(main(json.loads(sys.argv[1])["out"]))

"""Each ``planner export --format`` file run through the framework's own code (the ``frameworks`` extra).

- accelerate 1.15: the exported YAML through ``accelerate launch``'s own parsing (``load_config_from_file``,
  ``_validate_launch_command``, ``prepare_deepspeed_cmd_env``), then ``Accelerator.prepare`` with
  ``DummyOptim`` on a tiny Llama and one optimizer step: the engine holds the plan's ZeRO stage, micro-batch,
  accumulation, precision and offload.
- transformers 5.23: the exported ``TrainingArguments`` keywords and DeepSpeed config in a ``Trainer`` that takes
  one step on the tiny Llama, with no deprecation warning.
- TRL 1.16: the exported YAML through ``TrlParser`` as ``trl sft|dpo|grpo --config`` reads it: the plan's LoRA
  reaches ``ModelConfig`` (and ``get_peft_config``), checkpointing and precision reach the config class.

The DeepSpeed cases run as this file in a fresh one-rank process on the CPU accelerator (``script_cases``: forked
from the preloaded starter), as ``test_ds_initialize`` does. Without the extra (``pip install -e .[frameworks]``)
they skip, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from script_cases import report, run_script_case

CASE_TIMEOUT_S = 600
MICRO_BATCH, GRAD_ACCUM, SEQ_LEN = 2, 2, 16


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[frameworks]'")


def _single_plan(**changes: Any) -> tuple[Any, Any, Any]:
    from tiny_models import make_hardware, make_strategy, make_workload

    strategy = make_strategy(micro_batch=MICRO_BATCH, grad_accum=GRAD_ACCUM, **changes)
    return strategy, make_workload(seq_len=SEQ_LEN, global_batch=MICRO_BATCH * GRAD_ACCUM), make_hardware()


def _export(fmt: str, plan: tuple[Any, Any, Any], folder: Path, name: str) -> dict[str, str]:
    """Write the format's files for ``plan`` under ``folder``; role -> path."""
    from launch import frameworks

    paths = frameworks.file_layout(fmt, str(folder / name))
    rendered = frameworks.render(fmt, *plan, paths)
    for role, text in rendered.files.items():
        Path(paths[role]).write_text(text)
    return paths


def _skip_unless_bf16_runs() -> None:
    from probes.measure.cpu_support import cpu_dtype_unsupported_reason

    reason = cpu_dtype_unsupported_reason("bf16")
    if reason is not None:
        pytest.skip(reason)


# --- accelerate -------------------------------------------------------------------------------------


def test_accelerate_export_prepares_and_steps_as_planned(tmp_path: Path) -> None:
    """Issue 31, 1 and 2: DummyOptim no longer stops prepare() on "auto" betas/eps, and bf16 stays bf16 (one
    process of ~10 CPU s, forked from the preloaded starter: ZeRO-3, optimizer offload and checkpointing in one
    plan)."""
    _need("accelerate", "deepspeed")
    layout = {"zero_stage": 3, "offload_optimizer": "cpu", "gradient_checkpointing": True}
    _skip_unless_bf16_runs()
    paths = _export("accelerate", _single_plan(**layout), tmp_path, "acc.yaml")
    result = run_script_case(__file__, "accelerate", {"kind": "accelerate", **paths}, CASE_TIMEOUT_S)
    assert result["error"] is None, result["error"]
    assert result["zero_stage"] == layout["zero_stage"]
    assert result["micro_batch"] == MICRO_BATCH and result["grad_accum"] == GRAD_ACCUM
    assert result["bf16"] is True and result["param_dtype"] == "torch.bfloat16"
    assert result["offload_optimizer"] == layout.get("offload_optimizer", "none")
    assert result["checkpointing"] == layout.get("gradient_checkpointing", False)
    assert result["global_steps"] == 1


def _accelerate_case(case: dict[str, Any]) -> dict[str, Any]:
    """The child: accelerate launch's own environment from the YAML, then prepare() and one optimizer step."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    load_config_from_file(case["config"])  # accelerate's own reader of the YAML
    args = launch_command_parser().parse_args(["--config_file", case["config"], "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)  # as accelerate's launch_command sets it
    _, env = prepare_deepspeed_cmd_env(args)
    os.environ.update({k: v for k, v in env.items() if k.startswith("ACCELERATE_")})

    import torch
    from accelerate import Accelerator
    from accelerate.utils import DummyOptim
    from tiny_models import build_tiny_model

    accelerator = Accelerator(gradient_accumulation_steps=GRAD_ACCUM)  # as the export's notes prescribe
    model = build_tiny_model()
    notes = Path(case["config"]).read_text()
    if "activation_checkpointing_enable" in notes:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    data = torch.randint(0, model.config.vocab_size, (MICRO_BATCH * GRAD_ACCUM, SEQ_LEN))
    loader = torch.utils.data.DataLoader(data, batch_size=MICRO_BATCH)
    try:
        model, optimizer, loader = accelerator.prepare(model, DummyOptim(model.parameters(), lr=1e-5), loader)
    except ValueError as err:
        return {"error": str(err)}
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    engine = accelerator.deepspeed_engine_wrapped.engine
    zero = engine.config["zero_optimization"]
    return {
        "error": None,
        "zero_stage": engine.zero_optimization_stage(),
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "grad_accum": engine.gradient_accumulation_steps(),
        "bf16": engine.bfloat16_enabled(),
        "param_dtype": str(next(engine.module.parameters()).dtype),
        "offload_optimizer": zero.get("offload_optimizer", {}).get("device", "none"),
        "checkpointing": bool(getattr(engine.module, "is_activation_checkpointing", False)),
        "global_steps": engine.global_steps,
    }


# --- transformers' Trainer ----------------------------------------------------------------------------


def test_hf_export_trains_one_trainer_step(tmp_path: Path) -> None:
    """The TrainingArguments keywords and the "auto" config in a Trainer: one step at the plan's settings, and no
    deprecated name (transformers 5.23: gradient_checkpointing -> activation_checkpointing)."""
    _need("accelerate", "deepspeed")
    _skip_unless_bf16_runs()
    paths = _export("hf", _single_plan(zero_stage=2, gradient_checkpointing=True), tmp_path, "hf.json")
    result = run_script_case(__file__, "hf", {"kind": "hf", "out": str(tmp_path / "out"), **paths}, CASE_TIMEOUT_S)
    assert result["deprecated"] == [], result["deprecated"]
    assert result["zero_stage"] == 2 and result["micro_batch"] == MICRO_BATCH
    assert result["grad_accum"] == GRAD_ACCUM and result["bf16"] is True
    assert result["checkpointing"] is True and result["global_step"] == 1


def _hf_case(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from tiny_models import build_tiny_model
    from transformers import Trainer, TrainingArguments

    namespace: dict[str, Any] = {}
    source = Path(case["training_args"]).read_text().replace("args = TrainingArguments(**training_kwargs)", "")
    exec(compile(source, case["training_args"], "exec"), namespace)
    kwargs = {**namespace["training_kwargs"], "output_dir": case["out"], "max_steps": 1, "report_to": "none"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = TrainingArguments(**kwargs)
    data = torch.randint(0, 128, (MICRO_BATCH * GRAD_ACCUM, SEQ_LEN))
    rows = [{"input_ids": row, "labels": row} for row in data]
    trainer = Trainer(model=build_tiny_model(), args=args, train_dataset=rows)
    trainer.train()
    engine = trainer.model_wrapped
    return {
        "deprecated": [str(w.message) for w in caught if "deprecated" in str(w.message)],
        "zero_stage": engine.zero_optimization_stage(),
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "grad_accum": engine.gradient_accumulation_steps(),
        "bf16": engine.bfloat16_enabled(),
        "checkpointing": bool(getattr(engine.module, "is_activation_checkpointing", False)),
        "global_step": trainer.state.global_step,
    }


# --- TRL ----------------------------------------------------------------------------------------------


def test_trl_yaml_carries_lora_and_checkpointing(tmp_path: Path) -> None:
    """Issue 31, 7: ``trl sft|dpo --config`` reads the plan's LoRA (ModelConfig) and checkpointing."""
    _need("trl", "peft", "accelerate")
    from dataclasses import replace

    strategy, workload, hardware = _single_plan(zero_stage=2, lora_rank=16)
    cases = {
        kind: _export("trl", (strategy, replace(workload, kind=kind), hardware), tmp_path, f"{kind}.py")
        for kind in ("sft", "dpo")
    }
    results = run_script_case(__file__, "trl", {"kind": "trl", "exports": cases}, CASE_TIMEOUT_S)
    for kind, result in results.items():
        paths = cases[kind]
        assert result["use_peft"] is True and result["lora_r"] == 16, kind
        assert result["peft_r"] == 16 and result["peft_targets"] == "all-linear", kind
        assert result["checkpointing"] is False, kind  # TRL's own default (True) does not override the plan
        assert result["bf16"] is True and result["micro_batch"] == MICRO_BATCH, kind
        assert result["grad_accum"] == GRAD_ACCUM and result["max_length"] == SEQ_LEN, kind
        assert result["deepspeed"] == paths["ds_config"], kind
        assert result["model_init_kwargs"] == {"dtype": "bfloat16", "attn_implementation": "sdpa"}, kind
        assert result["deprecated"] == [], (kind, result["deprecated"])


def _trl_case(case: dict[str, Any]) -> dict[str, Any]:
    from trl import DPOConfig, ModelConfig, ScriptArguments, SFTConfig, TrlParser, get_peft_config

    results = {}
    for kind, paths in case["exports"].items():
        config_class = {"sft": SFTConfig, "dpo": DPOConfig}[kind]
        parser = TrlParser((ScriptArguments, config_class, ModelConfig))  # as trl/scripts/sft.py, dpo.py build it
        argv = ["--config", paths["yaml"], "--dataset_name", "unused", "--model_name_or_path", "unused"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, config, model_args = parser.parse_args_and_config(argv, fail_with_unknown_args=True)
        peft = get_peft_config(model_args)
        results[kind] = {
            "use_peft": model_args.use_peft,
            "lora_r": model_args.lora_r,
            "peft_r": peft.r if peft is not None else None,
            "peft_targets": peft.target_modules if peft is not None else None,
            "checkpointing": config.activation_checkpointing,
            "bf16": config.bf16,
            "micro_batch": config.per_device_train_batch_size,
            "grad_accum": config.gradient_accumulation_steps,
            "deepspeed": config.deepspeed,
            "max_length": config.max_length,
            "model_init_kwargs": config.model_init_kwargs,
            "deprecated": [str(w.message) for w in caught if "deprecated" in str(w.message)],
        }
    return results


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """The child's entry: one case by its ``kind``.

    The CPU stands in for a bf16 GPU: ``TrainingArguments._validate_args`` refuses bf16 without one unless
    ``use_cpu``, which would also turn DeepSpeed off (accelerate's ``AcceleratorState``), so its check is told
    the device runs bf16 (DeepSpeed's CPU accelerator does)."""
    import transformers.training_args

    transformers.training_args.is_torch_bf16_gpu_available = lambda: True
    if case["kind"] in ("accelerate", "hf"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    return {"accelerate": _accelerate_case, "hf": _hf_case, "trl": _trl_case}[case["kind"]](case)


if __name__ == "__main__":
    report(run_case(json.loads(sys.argv[1])))

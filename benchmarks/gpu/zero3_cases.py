"""Writes the cases of the 2026-11-26 device session: ZeRO-3 with and without CPU optimizer offload beside
ZeRO-2 on the same GPU (issue 34), and the program case that ``planner probe -- CMD`` runs (issue 33).

The cases are in the shape ``../shared/gpu/measure_sft.py`` reads (``name``, ``hf_config``, ``seq_len``,
``ds_config``, ``grad_ckpt``, ``lora_rank``, ``steps``, ``timeout``). DeepSpeed's stage 3 records its
parameter-fetch trace over the first step and uses it from the second on, so each ZeRO case runs 6 steps and
the steady step is the median of steps 3-6 (``measure_sft.py`` keeps every step's time).

Usage: python benchmarks/gpu/zero3_cases.py OUTDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from store.models import get_model


def _hf_config(model: str) -> dict[str, Any]:
    spec = get_model(model)
    return {"model_type": spec.model_type, **spec.hf_config}


def _ds_config(stage: int, micro_batch: int, offload: bool) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch,
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-05, "weight_decay": 0.0}},
        "zero_optimization": zero,
    }


def _case(name: str, model: str, stage: int, offload: bool, micro_batch: int = 8, seq_len: int = 1024) -> dict:
    return {
        "name": name,
        "model": model,
        "hf_config": _hf_config(model),
        "seq_len": seq_len,
        "ds_config": _ds_config(stage, micro_batch, offload),
        "grad_ckpt": True,
        "lora_rank": 0,
        "steps": 6,
        "timeout": 240 if offload else 150,
    }


def zero_cases() -> list[dict]:
    """In the order they run: a cut-off session keeps the first."""
    return [
        _case("opt13_z3ck_mb8_s1024", "opt-1.3b", 3, offload=False),
        _case("opt13_z3ckoff_mb8_s1024", "opt-1.3b", 3, offload=True),
        _case("opt13_z2ck_mb8_s1024", "opt-1.3b", 2, offload=False),
        _case("opt27_z3ck_mb8_s1024", "opt-2.7b", 3, offload=False),
        _case("opt27_z2ck_mb8_s1024", "opt-2.7b", 2, offload=False),
        _case("opt27_z3ckoff_mb8_s1024", "opt-2.7b", 3, offload=True),
    ]


def program_case() -> list[dict]:
    """The user's program that ``planner probe -- CMD`` runs: DeepSpeed's defaults, no checkpointing of its own."""
    case = _case("program_opt13_mb8_s1024", "opt-1.3b", 2, offload=False)
    case["grad_ckpt"] = False
    case["steps"] = 8
    return [case]


def program_strategies() -> list[dict]:
    """The two strategies both planner probes ran (memplan's loop, then the program): the plan of the job on an
    H200 (ZeRO-0, mb 8) and ZeRO-3 with checkpointing, which the hook applies to a program that has none."""
    common = {"offload_optimizer": "none", "offload_param": "none", "lora_rank": 0, "micro_batch": 8, "grad_accum": 1}
    common |= {"empty_cache": "never", "allocator": "default"}
    return [
        {"zero_stage": 0, "gradient_checkpointing": False, **common},
        {"zero_stage": 3, "gradient_checkpointing": True, **common},
    ]


def main(outdir: str) -> None:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "zero_cases.json").write_text(json.dumps(zero_cases(), indent=1))
    (out / "program_case.json").write_text(json.dumps(program_case(), indent=1))
    (out / "program_strategies.json").write_text(json.dumps(program_strategies(), indent=1))


if __name__ == "__main__":
    main(sys.argv[1])

"""Before/after of the framework mechanisms of issue 31's leftovers: one plan per mechanism, predicted with the
mechanism on (today's code) and off (patched to memplan's own loop's behaviour), each in its own process.

``python benchmarks/framework_mechanisms.py`` prints a row per case: its command line, peak allocated and
reserved GiB and step seconds, before and after. Patching is the only difference between the two columns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

CASES: dict[str, dict[str, Any]] = {
    "trl-dpo-dropout": {
        "job": {
            "model": "gpt2-large",
            "workload": "dpo",
            "framework": "trl",
            "gpu_mem": "80G",
            "gpu": "H100-80G",
            "seq_len": 1024,
            "batch": 4,
            "attn_impl": "sdpa",
        },
        "strategy": {"zero_stage": 2, "micro_batch": 4, "grad_accum": 1},
        "off": [("search.single.predict", "workload_as_run", "lambda w: w")],
    },
    "openrlhf-frozen-prefetch": {
        "job": {
            "model": "llama-3.1-8b",
            "workload": "ppo",
            "framework": "openrlhf",
            "gpu_mem": "80G",
            "gpu": "H100-80G",
            "gpus": 8,
            "prompt_len": 512,
            "gen_len": 512,
            "batch": 64,
        },
        "strategy": {
            "actor": {"zero_stage": 3, "gradient_checkpointing": True},
            "critic": {"zero_stage": 3, "gradient_checkpointing": True},
            "reference": {"zero_stage": 3},
            "reward": {"zero_stage": 3},
            "hybrid_engine": False,
            "generation_batch": 8,
            "micro_batch": 4,
            "grad_accum": 2,
            "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.3},
        },
        "off": [("search.rlhf.models", "framework_frozen_buckets", "lambda framework, hidden: None")],
    },
    "verl-rollout": {
        "job": {
            "model": "qwen2.5-1.5b",
            "workload": "grpo",
            "framework": "verl",
            "gpu_mem": "80G",
            "gpu": "H100-80G",
            "gpus": 8,
            "prompt_len": 512,
            "gen_len": 1024,
            "batch": 512,
            "samples_per_prompt": 8,
        },
        "strategy": {
            "actor": {"zero_stage": 3, "gradient_checkpointing": True},
            "reference": {"zero_stage": 3},
            "reward": {"zero_stage": 3},
            "hybrid_engine": False,
            "generation_batch": 4,
            "micro_batch": 8,
            "grad_accum": 64,
            "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.5, "sleep_level": 1},
        },
        "off": [
            ("search.rlhf.engine", "framework_engine_batch", "lambda framework, engine: None"),
            ("search.rlhf.engine_step", "framework_sleep_level", "lambda framework, level, rank: level"),
        ],
    },
}


def run_one(name: str, mechanism: bool) -> dict[str, Any]:
    """One case's prediction in this process (``mechanism`` False: the patches of its ``off`` list first)."""
    import importlib

    from planner import predict

    case = CASES[name]
    if not mechanism:
        for module, attribute, source in case["off"]:
            setattr(importlib.import_module(module), attribute, eval(source))  # noqa: S307 - fixed strings above
    job = dict(case["job"])
    report = predict(job.pop("model"), case["strategy"], calibration="none", **job)
    p = report.model_dump()["predicted"]
    return {
        "peak_allocated_gib": round(p["peak_allocated_bytes"] / 2**30, 2),
        "peak_reserved_gib": round(p["peak_reserved_bytes"] / 2**30, 2),
        "step_time_s": round(p["step_time_s"], 3),
    }


def main() -> int:
    """Each case before and after, each in a fresh process."""
    if len(sys.argv) == 3:
        print(json.dumps(run_one(sys.argv[1], sys.argv[2] == "on")))
        return 0
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for name, case in CASES.items():
        row = {"case": name, "job": case["job"], "strategy": case["strategy"]}
        for label, flag in (("before", "off"), ("after", "on")):
            out = subprocess.run([sys.executable, __file__, name, flag], capture_output=True, text=True, env=env)
            row[label] = json.loads(out.stdout) if out.returncode == 0 else out.stderr.strip().splitlines()[-1:]
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

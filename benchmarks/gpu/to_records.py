"""Turns one device session's outputs into a records file of ``tests/data/gpu/`` (``about``, ``sft``, ``probes``).

``sft`` rows come from ``measure_sft.py``'s per-case JSON files with the case that produced them (the shape of
``tests/data/gpu/h100-2026-11-23.json``): the steady step is the median of the steps after the warm-up ones
(one warm-up step; two under ZeRO-3, which records its parameter-fetch trace over the first step and settles
from the third). Parameter counts of a ZeRO-3 row are the model's, not the rank's partition that the loop
counted after ``deepspeed.initialize``. ``probes`` are ``planner probes --db DB --json`` as printed.

Usage: python benchmarks/gpu/to_records.py CASES.json RUNS_DIR DEVICE.json [--probes PROBES.json] -o OUT.json
DEVICE.json holds the device fingerprint object of the session (name, total_memory_bytes, compute_capability,
driver, cuda, torch, deepspeed, transformers, peft, host).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from store.models import get_model


def _warmup_steps(case: dict[str, Any]) -> int:
    return 2 if case["ds_config"].get("zero_optimization", {}).get("stage", 0) == 3 else 1


def sft_row(case: dict[str, Any], run: dict[str, Any], device: dict[str, Any]) -> dict[str, Any]:
    """One records row of a measured case."""
    steps = run["step_s"]
    steady = steps[_warmup_steps(case) :] or steps[-1:]
    spec = get_model(case["model"])
    zero3 = case["ds_config"].get("zero_optimization", {}).get("stage", 0) == 3
    return {
        "id": case["name"],
        "source": "user-style training loop (measure_sft.py)",
        "device": device,
        "workload": {
            "kind": "sft",
            "model": case["model"],
            "hf_config": case["hf_config"],
            "seq_len": case["seq_len"],
            "dtype": "bf16",
            "attn_impl": case.get("attn", "sdpa"),
            "labels": "input_ids (HF loss)",
        },
        "ds_config": case["ds_config"],
        "gradient_checkpointing": bool(case.get("grad_ckpt")),
        "lora": {"rank": case["lora_rank"], "target_modules": "all-linear"} if case.get("lora_rank") else None,
        "empty_cache": case.get("empty_cache", "never"),
        "allocator": case.get("allocator", "default"),
        "measured": {
            "peak_allocated_bytes": run["peak_allocated_all"],
            "peak_reserved_bytes": run["peak_reserved_all"],
            "steady_peak_allocated_bytes": run["peak_allocated_steady"],
            "steady_peak_reserved_bytes": run["peak_reserved_steady"],
            "after_init_allocated_bytes": run["after_init_allocated"],
            "after_init_reserved_bytes": run["after_init_reserved"],
            "step_time_s_median": statistics.median(steady),
            "step_time_s": steps,
            "host_peak_rss_bytes": run["host_peak_rss"],
            "params": spec.total_params if zero3 else run["n_params"],
            "trainable_params": spec.total_params if zero3 else run["n_trainable"],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases")
    parser.add_argument("runs")
    parser.add_argument("device")
    parser.add_argument("--probes")
    parser.add_argument("--about", default="")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args()
    device = json.loads(Path(args.device).read_text())
    rows = []
    for case in json.loads(Path(args.cases).read_text()):
        path = Path(args.runs) / f"{case['name']}.json"
        if path.exists():
            run = json.loads(path.read_text())
            if run.get("outcome") == "ok":
                rows.append(sft_row(case, run, device))
    probes = json.loads(Path(args.probes).read_text()) if args.probes else []
    document = {"about": args.about, "sft": rows, "probes": probes}
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    print(f"{args.out}: {len(rows)} sft rows, {len(probes)} probes")


if __name__ == "__main__":
    main()

"""Predicted against measured for the shared H100 SFT records (`../shared/gpu/h100-2026-11-23.json`).

Each record's exact ds_config goes through the public `planner.check` with the record's model, sequence
length, checkpointing and LoRA rank on an H100-80G; prints the relative error (predicted / measured - 1) of
peak allocated, peak reserved and step time.

    .venv/bin/python benchmarks/shared_gpu_records.py [--records ../shared/gpu/h100-2026-11-23.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import check  # noqa: E402

DEFAULT_RECORDS = Path(__file__).resolve().parents[2] / "shared" / "gpu" / "h100-2026-11-23.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=DEFAULT_RECORDS)
    args = parser.parse_args()
    if not args.records.is_file():
        print(f"no records at {args.records}", file=sys.stderr)
        return 2
    rows = json.loads(args.records.read_text())["sft"]
    print("| record | peak allocated | peak reserved | step time |")
    print("|---|---|---|---|")
    for row in rows:
        workload, measured = row["workload"], row["measured"]
        lora = (row.get("lora") or {}).get("rank", 0)
        result = check(
            row["ds_config"], workload["model"], gpu="H100-80G", workload="sft", seq_len=workload["seq_len"],
            attn_impl=workload["attn_impl"], gradient_checkpointing=row["gradient_checkpointing"], lora_rank=lora,
            cpu_mem="128G",
        )  # fmt: skip
        predicted = result.report.predicted
        errors = (
            predicted.peak_allocated_bytes / measured["peak_allocated_bytes"] - 1,
            predicted.peak_reserved_bytes / measured["peak_reserved_bytes"] - 1,
            predicted.step_time_s / measured["step_time_s_median"] - 1,
        )
        print(f"| {row['id']} | " + " | ".join(f"{e:+.1%}" for e in errors) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

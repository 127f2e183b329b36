"""Validate the cost model on a GPU: a fixed matrix of probes, predicted against measured.

Matrix: OPT-125m, OPT-350m, OPT-1.3b; sft and ppo; ZeRO 0-3; optimizer offload; gradient
checkpointing; empty_cache never / after-inference. Each probe runs in its own process through
`planner.probe` (real DeepSpeed engines from the exported configs). Writes `gpu_validate.csv` and
`gpu_validate.md` (with the device fingerprint) to --out (default benchmarks/results/).

Usage (on a machine with a CUDA GPU):
    DS_ACCELERATOR=cuda .venv/bin/python benchmarks/gpu_validate.py --out "$OUT" [--steps 4] [--models opt-125m]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

MODELS = ("opt-125m", "opt-350m", "opt-1.3b")
FIELDS = (
    "model", "workload", "strategy", "outcome", "failed_phase",
    "meas_alloc_gib", "pred_alloc_gib", "err_alloc", "meas_reserved_gib", "pred_reserved_gib", "err_reserved",
    "meas_step_s", "pred_step_s", "err_step", "probe_id",
)  # fmt: skip


def sft_strategies() -> list[dict[str, Any]]:
    out = []
    for stage in (0, 1, 2, 3):
        for ckpt in (False, True):
            out.append({"zero_stage": stage, "gradient_checkpointing": ckpt, "micro_batch": 4, "grad_accum": 1})
    for stage in (2, 3):
        out.append({"zero_stage": stage, "offload_optimizer": "cpu", "micro_batch": 4, "grad_accum": 1})
    return out


def ppo_strategies() -> list[dict[str, Any]]:
    out = []
    for stage in (0, 1, 2, 3):
        for empty_cache in ("never", "after-inference"):
            block = {"zero_stage": stage, "gradient_checkpointing": True}
            frozen = {"zero_stage": 3 if stage == 3 else 0, "offload": "none"}
            out.append({
                "actor": block, "critic": block, "reference": frozen, "reward": frozen, "hybrid_engine": True,
                "generation_batch": 4, "micro_batch": 4, "grad_accum": 1, "empty_cache": empty_cache,
            })  # fmt: skip
    offloaded = {"zero_stage": 2, "offload_optimizer": "cpu", "gradient_checkpointing": True}
    out.append({
        "actor": offloaded, "critic": offloaded, "reference": {"zero_stage": 0, "offload": "none"},
        "reward": {"zero_stage": 0, "offload": "none"}, "hybrid_engine": True, "generation_batch": 4,
        "micro_batch": 4, "grad_accum": 1, "empty_cache": "never",
    })  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--workloads", nargs="*", default=["sft", "ppo"])
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    from planner import probe
    from planner.render import console

    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    fingerprint: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "validate.db")
        for model in args.models:
            for workload in args.workloads:
                strategies = sft_strategies() if workload == "sft" else ppo_strategies()
                file = Path(tmp) / f"{model}-{workload}.json"
                file.write_text(json.dumps(strategies))
                job: dict[str, Any] = {"workload": workload, "batch": 4, "cpu_mem": "64G", **_local_gpu()}
                if workload == "sft":
                    job["seq_len"] = 512
                else:
                    job.update(prompt_len=256, gen_len=256)
                console.print(f"probing {model} {workload}: {len(strategies)} strategies")
                report = probe(
                    model, strategies=str(file), steps=args.steps, layers=None, timeout_s=args.timeout,
                    device="cuda", db=db, **job,
                )  # fmt: skip
                fingerprint = fingerprint or report.fingerprint
                for row in report.rows:
                    rows.append(_csv_row(model, workload, row))
    _write(args.out, rows, fingerprint)
    return 0


def _local_gpu() -> dict[str, Any]:
    """The catalog GPU matching this device (for its rates) with the device's own total memory."""
    import torch

    props = torch.cuda.get_device_properties(0)
    name = props.name.upper()
    job: dict[str, Any] = {"gpu_mem": int(props.total_memory)}
    for candidate, marker in (("H200", "H200"), ("H100-80G", "H100"), ("A100-80G", "A100"), ("L40S", "L40S")):
        if marker in name:
            job["gpu"] = candidate
            break
    return job


def _csv_row(model: str, workload: str, row: Any) -> dict[str, Any]:
    m, p, e = row.measured or {}, row.predicted, row.errors
    gib = 2**30
    return {
        "model": model, "workload": workload, "strategy": row.label, "outcome": row.outcome,
        "failed_phase": row.failed_phase or "",
        "meas_alloc_gib": round(m["peak_allocated_bytes"] / gib, 3) if m else "",
        "pred_alloc_gib": round(p["peak_allocated_bytes"] / gib, 3),
        "err_alloc": _fmt(e.get("peak_allocated")),
        "meas_reserved_gib": round(m["peak_reserved_bytes"] / gib, 3) if m else "",
        "pred_reserved_gib": round(p["peak_reserved_bytes"] / gib, 3),
        "err_reserved": _fmt(e.get("peak_reserved")),
        "meas_step_s": round(m["step_time_s"], 4) if m else "", "pred_step_s": round(p["step_time_s"], 4),
        "err_step": _fmt(e.get("step_time")), "probe_id": row.probe_id,
    }  # fmt: skip


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.1f}%"


def _write(out: Path, rows: list[dict[str, Any]], fingerprint: dict[str, Any] | None) -> None:
    with (out / "gpu_validate.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# Cost model against GPU probes", "", f"Device: `{json.dumps(fingerprint)}`", ""]
    lines.append("| " + " | ".join(FIELDS) + " |")
    lines.append("|" + "---|" * len(FIELDS))
    lines += ["| " + " | ".join(str(r[f]) for f in FIELDS) + " |" for r in rows]
    (out / "gpu_validate.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'gpu_validate.csv'} and {out / 'gpu_validate.md'} ({len(rows)} probes)")


if __name__ == "__main__":
    sys.exit(main())

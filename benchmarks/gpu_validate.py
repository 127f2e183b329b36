"""Validate the cost model on a GPU: a fixed matrix of probes, predicted against measured.

Matrix: OPT-125m, OPT-350m, OPT-1.3b; sft and ppo; ZeRO 0-3; optimizer offload; gradient
checkpointing; empty_cache never / after-inference. Each probe runs in its own process through
`planner.probe` (real DeepSpeed engines from the exported configs). Writes `gpu_validate.csv` and
`gpu_validate.md` (with the device fingerprint) to --out (default benchmarks/results/).

Usage (on a machine with a CUDA GPU):
    DS_ACCELERATOR=cuda .venv/bin/python benchmarks/gpu_validate.py --out "$OUT" [--steps 4] [--models opt-125m]

Dry run of the script itself on DeepSpeed's CPU accelerator (tiny cut models; CPU figures, not GPU ones):
    .venv/bin/python benchmarks/gpu_validate.py --device cpu --layers 2 --models opt-125m --out /tmp/validate
"""

from __future__ import annotations

import argparse
import csv
import io
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
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of this script")
    parser.add_argument("--layers", default=None, help="cut every model to K layers (default: the whole model)")
    args = parser.parse_args()

    from planner import probe
    from planner.render import console

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_validate: no CUDA device here (use --device cpu for a dry run)", file=sys.stderr)
            return 2

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
                hardware = _local_gpu() if args.device == "cuda" else {"gpu": "H100-80G"}
                job: dict[str, Any] = {"workload": workload, "batch": 4, "cpu_mem": "64G", **hardware}
                if workload == "sft":
                    job["seq_len"] = 512
                else:
                    job.update(prompt_len=256, gen_len=256)
                console.print(f"probing {model} {workload}: {len(strategies)} strategies")
                report = probe(
                    model, strategies=str(file), steps=args.steps, layers=args.layers, timeout_s=args.timeout,
                    device=args.device, db=db, **job,
                )  # fmt: skip
                fingerprint = fingerprint or report.fingerprint
                for row in report.rows:
                    rows.append(_csv_row(model, workload, row))
    _write(args.out, rows, fingerprint, args.device)
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


def _write(out: Path, rows: list[dict[str, Any]], fingerprint: dict[str, Any] | None, device: str) -> None:
    from planner.files import write_text_atomic

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(out / "gpu_validate.csv", buffer.getvalue(), force=True)
    title = "# Cost model against GPU probes" if device == "cuda" else "# Dry run on the CPU backend (not GPU figures)"
    lines = [title, "", f"Device: `{json.dumps(fingerprint)}`", ""]
    lines.append("| " + " | ".join(FIELDS) + " |")
    lines.append("|" + "---|" * len(FIELDS))
    lines += ["| " + " | ".join(str(r[f]) for f in FIELDS) + " |" for r in rows]
    write_text_atomic(out / "gpu_validate.md", "\n".join(lines) + "\n", force=True)
    print(f"wrote {out / 'gpu_validate.csv'} and {out / 'gpu_validate.md'} ({len(rows)} probes)")


if __name__ == "__main__":
    sys.exit(main())

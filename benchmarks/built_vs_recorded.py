"""The allocation stream the cost model builds against the one a real CPU probe records, at a real model's
hidden size: one sft strategy of a catalog model cut to a few decoder layers, probed on DeepSpeed's CPU
accelerator (the tracker records every allocation and free), and the stream built from the cost model's
bytes for the same cut job; both replayed through the port of torch's caching allocator on one stream (the
CPU accelerator makes no side streams). Per phase of the measured step: peak allocated and peak reserved.

This is how the built stream's missing tensors were found (``benchmarks/results/replay_vs_records.md``): at
opt-1.3b's hidden size, 4 layers, ZeRO-2, 4 x 512 tokens, the recorded stream reserved 25% more than the
built one until DeepSpeed's gradient tensors were made as its code makes them. Minutes per run on 2 cores.

Usage: DS_ACCELERATOR=cpu .venv/bin/python benchmarks/built_vs_recorded.py --model opt-1.3b --layers 4 \\
           --zero 2 --micro-batch 4 --seq-len 512 [--grad-ckpt]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GiB = 2**30
PHASES = ("forward", "backward", "optimizer_step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="opt-1.3b", help="catalog model (weights are random)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers kept")
    parser.add_argument("--zero", type=int, default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--grad-ckpt", action="store_true")
    args = parser.parse_args()

    from planner import probe, probe_stream
    from planner.job.cut import cut_workload
    from planner.planning.predicting import job_spec, resolve
    from search import DEFAULT_COEFFICIENTS, cpu_backend_coefficients, replay_memory
    from search.allocator import replay
    from store.records import Strategy

    job = {"workload": "sft", "batch": args.micro_batch, "seq_len": args.seq_len, "gpu_mem": "80G", "cpu_mem": "64G"}
    strategy = {
        "zero_stage": args.zero,
        "micro_batch": args.micro_batch,
        "grad_accum": 1,
        "empty_cache": "never",
        "gradient_checkpointing": args.grad_ckpt,
    }
    with tempfile.TemporaryDirectory() as folder:
        strategies = Path(folder) / "strategies.json"
        strategies.write_text(json.dumps([strategy]))
        db = str(Path(folder) / "plans.db")
        report = probe(
            args.model,
            device="cpu",
            strategies=str(strategies),
            steps=3,
            layers=str(args.layers),
            timeout_s=3600.0,
            db=db,
            **job,
        )
        # a small model is probed whole too (planner.probing.plan.depths_for): take the cut one
        (row,) = [r for r in report.rows if r.layers == args.layers]
        if row.outcome != "ok":
            print(f"probe {row.outcome}: {row.message}", file=sys.stderr)
            return 1
        stream = probe_stream(row.probe_id, db=db)
    assert stream is not None
    recorded = {w.name: (w.peak_allocated, w.peak_reserved) for w in replay(stream.on_one_stream()).phases}
    resolved = resolve(job_spec(args.model, dict(job)))
    workload = cut_workload(resolved.workload, args.layers)
    coef = cpu_backend_coefficients(DEFAULT_COEFFICIENTS)
    built_replay = replay_memory(workload, Strategy.from_dict(strategy), resolved.hardware, coef, streams=False)
    built = dict(zip(built_replay.phase_names, ((p.allocated, p.reserved) for p in built_replay.phases), strict=True))
    print(
        f"{args.model}, {args.layers} layers, ZeRO-{args.zero}, {args.micro_batch} x {args.seq_len} tokens"
        f"{', checkpointed' if args.grad_ckpt else ''} (GiB)"
    )
    print("| phase | recorded allocated | built allocated | recorded reserved | built reserved | reserved |")
    print("|---|---|---|---|---|---|")
    for name in PHASES:
        (ra, rr), (ba, br) = recorded[name], built[name]
        print(f"| {name} | {ra / GiB:.3f} | {ba / GiB:.3f} | {rr / GiB:.3f} | {br / GiB:.3f} | {br / rr - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

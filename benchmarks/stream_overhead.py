"""What recording the allocation stream costs a CPU probe: the same tiny probe with and without it.

A tiny Llama (2 layers, hidden 64, vocabulary 256) runs as an sft probe on DeepSpeed's CPU accelerator,
ZeRO-2, micro-batch 2, 32 tokens, 4 steps, alternately with ``MEMPLAN_RECORD_STREAM=1`` and ``=0``
(pairs, so that load from other work lands on both alike). Reports the medians of the probe's wall time
(``result.wall_s``: the child process from start to report) and of its measured step time, the
median of the pairwise wall-time differences, and the stream's size. Each probe runs in its own process,
as ``planner probe`` runs it.

Usage: DS_ACCELERATOR=cpu .venv/bin/python benchmarks/stream_overhead.py [--pairs 8]
Prints a Markdown table; exit 0 when the wall-time overhead is under 5 % (the bar for recording by default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}  # fmt: skip
STRATEGY = {"zero_stage": 2, "micro_batch": 2, "grad_accum": 1}
BAR = 0.05


def run_once(folder: Path, db: str, record: bool) -> dict[str, Any]:
    """One probe with recording on or off; its wall time, step time and stream size."""
    from planner import probe, probes

    os.environ["MEMPLAN_RECORD_STREAM"] = "1" if record else "0"
    strategies = folder / "strategies.json"
    strategies.write_text(json.dumps([STRATEGY]))
    probe(
        str(folder),
        workload="sft",
        batch=2,
        seq_len=32,
        gpu_mem="24G",
        cpu_mem="64G",
        device="cpu",
        strategies=str(strategies),
        steps=4,
        layers=None,
        db=db,
        force=True,
    )
    result = probes(db=db, limit=1)[0].result
    stream = (result.extra.get("artifacts") or {}).get("alloc-stream", {})
    return {
        "wall_s": result.wall_s,
        "step_s": result.extra["step_time_s"]["median"],
        "events": stream.get("events", 0),
        "bytes": stream.get("bytes", 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="probe pairs (recording on, off) to run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memplan-stream-overhead-") as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
        db = str(folder / "probes.db")
        runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for _ in range(args.pairs):
            for record in (True, False):
                runs[record].append(run_once(folder, db, record))
    wall = {record: statistics.median(r["wall_s"] for r in rows) for record, rows in runs.items()}
    step = {record: statistics.median(r["step_s"] for r in rows) for record, rows in runs.items()}
    paired = statistics.median(on["wall_s"] - off["wall_s"] for on, off in zip(runs[True], runs[False], strict=True))
    overhead = paired / wall[False]
    print("| recording | probe wall s (median) | measured step s (median) | stream events | stream bytes |")
    print("|---|---|---|---|---|")
    for record in (True, False):
        first = runs[record][0]
        cells = [f"{wall[record]:.3f}", f"{step[record]:.4f}", first["events"], first["bytes"]]
        print(f"| {'on' if record else 'off'} | " + " | ".join(str(cell) for cell in cells) + " |")
    print(f"\nwall-time overhead (median of {args.pairs} paired differences): {paired:+.3f} s = {overhead:+.1%}")
    print(f"step-time overhead (medians): {step[True] / step[False] - 1:+.1%}")
    return 0 if overhead < BAR else 1


if __name__ == "__main__":
    raise SystemExit(main())

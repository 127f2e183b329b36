"""Where ZeRO-3 competes: the fastest fitting plan of each memory family, per job, as the cost model ranks them.

    .venv/bin/python benchmarks/zero3_ranking.py [--json OUT.json] [--markdown]

For each job (3B-13B on one 24-80 GB GPU; 8B-70B on 8 GPUs of one node), every family below is predicted
over micro-batches 1-16 (gradient accumulation filling the global batch), with and without gradient
checkpointing where the family allows, and its fastest fitting strategy kept:

- ``zero2+ckpt``: ZeRO-2, checkpointing, nothing offloaded
- ``zero2+offload``: ZeRO-2, optimizer states on the CPU
- ``zero3``: ZeRO-3, nothing offloaded
- ``zero3+offload``: ZeRO-3, optimizer states (and, as a second choice, parameters) on the CPU

The families are then ranked by predicted step time (the same global batch, so step time is throughput). Run it
at two commits to see how a change of the time model moved the rankings (benchmarks/results/zero3_ranking.md).
Predictions only: nothing runs on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.job.inputs import JobSpec, resolve  # noqa: E402
from search import DEFAULT_COEFFICIENTS, predict  # noqa: E402
from store.records import Strategy  # noqa: E402


@dataclass(frozen=True)
class Job:
    model: str
    gpu: str
    gpus: int
    batch: int
    seq_len: int
    cpu_mem: str | None = None  # None: the host of the GPU's typical node (store.nodes)

    def label(self) -> str:
        host = f", host {self.cpu_mem}" if self.cpu_mem else ""
        return f"{self.model} sft, {self.gpus} x {self.gpu}{host}, batch {self.batch} x {self.seq_len}"


JOBS = (
    Job("opt-2.7b", "RTX-4090", 1, 8, 1024, "128G"),
    Job("opt-2.7b", "H100-80G", 1, 8, 1024, "256G"),
    Job("llama-3.2-3b", "A6000", 1, 8, 1024, "128G"),
    Job("qwen2.5-7b", "A100-80G", 1, 8, 1024, "256G"),
    Job("llama-2-13b", "H100-80G", 1, 8, 1024, "512G"),
    Job("llama-3.1-8b", "A100-40G", 8, 64, 2048),
    Job("llama-3.1-8b", "A100-80G", 8, 64, 2048),
    Job("qwen2.5-14b", "H100-80G", 8, 64, 2048),
    Job("llama-3.1-70b", "H100-80G", 8, 64, 2048),
)

FAMILIES: dict[str, tuple[dict[str, Any], ...]] = {
    "zero2+ckpt": ({"zero_stage": 2, "gradient_checkpointing": True},),
    "zero2+offload": (
        {"zero_stage": 2, "offload_optimizer": "cpu", "gradient_checkpointing": False},
        {"zero_stage": 2, "offload_optimizer": "cpu", "gradient_checkpointing": True},
    ),
    "zero3": (
        {"zero_stage": 3, "gradient_checkpointing": False},
        {"zero_stage": 3, "gradient_checkpointing": True},
    ),
    "zero3+offload": (
        {"zero_stage": 3, "offload_optimizer": "cpu", "gradient_checkpointing": False},
        {"zero_stage": 3, "offload_optimizer": "cpu", "gradient_checkpointing": True},
        {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "gradient_checkpointing": True},
    ),
}
MICRO_BATCHES = (1, 2, 4, 8, 16)


def _best(job: Job, family: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    resolved = resolve(
        JobSpec(
            model=job.model,
            workload="sft",
            gpu=job.gpu,
            gpus=job.gpus,
            batch=job.batch,
            seq_len=job.seq_len,
            cpu_mem=job.cpu_mem,
        )
    )
    best: dict[str, Any] | None = None
    for knobs in family:
        for mb in MICRO_BATCHES:
            if job.batch % (mb * job.gpus):
                continue
            strategy = Strategy(micro_batch=mb, grad_accum=job.batch // (mb * job.gpus), **knobs)
            prediction = predict(resolved.workload, strategy, resolved.hardware, DEFAULT_COEFFICIENTS)
            if not prediction.fits:
                continue
            if best is None or prediction.step_time_s < best["step_s"]:
                best = {
                    "strategy": strategy.describe(),
                    "step_s": prediction.step_time_s,
                    "peak_reserved_gib": prediction.peak_reserved_bytes / 2**30,
                }
    return best


def rank(job: Job) -> list[tuple[str, dict[str, Any] | None]]:
    """The families' fastest fitting strategies, fastest first; a family with none fitting last."""
    found = [(name, _best(job, family)) for name, family in FAMILIES.items()]
    return sorted(found, key=lambda item: item[1]["step_s"] if item[1] else float("inf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rankings here")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    document = []
    header = "| rank | family | strategy | step s | peak reserved GiB |\n|---|---|---|---|---|"
    for job in JOBS:
        ranking = rank(job)
        document.append({"job": job.label(), "ranking": [{"family": n, **(b or {"fits": False})} for n, b in ranking]})
        print(f"\n**{job.label()}**\n\n{header}" if args.markdown else f"\n{job.label()}")
        for index, (name, best) in enumerate(ranking, 1):
            if best is None:
                print(
                    f"| {index} | {name} | nothing fits | | |"
                    if args.markdown
                    else f"  {index}. {name:14s} nothing fits"
                )
                continue
            step, peak, strategy = best["step_s"], best["peak_reserved_gib"], best["strategy"]
            if args.markdown:
                print(f"| {index} | {name} | {strategy} | {step:.3f} | {peak:.1f} |")
            else:
                print(f"  {index}. {name:14s} {step:8.3f} s  {peak:6.1f} GiB  {strategy}")
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()

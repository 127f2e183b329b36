"""When nothing fits: which change of the job would (LoRA, more GPUs, more host memory, shorter sequences)."""

from __future__ import annotations

from dataclasses import replace

from planner.inputs import ResolvedJob
from search import Coefficients
from search import search as run_search
from store.sizes import format_bytes

MAX_GPUS_PER_NODE = 8


def what_would_fit(job: ResolvedJob, coef: Coefficients, *, include_lora: bool = True) -> list[str]:
    """Readable lines, one per change that makes a full fine-tune (or, first, LoRA) fit."""
    workload, hardware = job.workload, job.hardware
    lines: list[str] = []

    def fits(w=workload, h=hardware, ranks=(0,)) -> str | None:
        try:
            best = run_search(w, h, coef, lora_ranks=ranks).best
        except ValueError:  # the batch does not split over the new GPU count
            return None
        return None if best is None else best.strategy.describe()

    for rank in (16, 64) if include_lora else ():
        found = fits(ranks=(rank,))
        if found:
            lines.append(f"LoRA rank {rank} fits: {found} (--lora-rank {rank})")
            break
    gpus = hardware.gpus
    while gpus < MAX_GPUS_PER_NODE:
        gpus *= 2
        more = replace(hardware, gpus=gpus)
        batch = workload.global_batch
        if batch % more.world_size:
            batch = more.world_size * -(-batch // more.world_size)
        found = fits(w=replace(workload, global_batch=batch), h=more)
        if found:
            lines.append(f"{gpus} GPUs per node fit: {found} (--gpus {gpus} --batch {batch})")
            break
    bigger_host = replace(hardware, cpu_memory_bytes=hardware.cpu_memory_bytes * 4)
    found = fits(h=bigger_host)
    if found:
        lines.append(f"{format_bytes(bigger_host.cpu_memory_bytes)} of host memory fits: {found} (--cpu-mem)")
    if workload.seq_len >= 256:
        shorter = replace(workload, seq_len=workload.seq_len // 2)
        found = fits(w=shorter)
        if found:
            lines.append(f"sequences of {shorter.seq_len} tokens fit: {found} (--seq-len {shorter.seq_len})")
    if not lines:
        lines.append("none of LoRA, up to 8 GPUs per node, 4x host memory or half the sequence length would fit")
    return lines

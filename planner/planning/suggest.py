"""When nothing fits: which change of the job would (LoRA, more GPUs, more host memory, shorter sequences)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from planner.job.inputs import ResolvedJob
from search import Candidate, Coefficients, SearchResult
from search import predict as predict_strategy
from search import search as run_search
from store.records import Hardware, Strategy, Workload
from store.sizes import format_bytes

MAX_GPUS_PER_NODE = 8
LORA_RANKS = (16, 64)


def what_would_fit(
    job: ResolvedJob,
    coef: Coefficients,
    *,
    include_lora: bool = True,
    searched: Mapping[tuple[int, ...], SearchResult] | None = None,
) -> list[str]:
    """Readable lines, one per change that makes a full fine-tune (or, first, LoRA) fit.

    ``searched`` holds searches of this very job that the caller already ran, by LoRA ranks (``recommend``'s
    LoRA fallback): they are not run again. The changes are weighed with DeepSpeed's own generation for RLHF
    (a vLLM/SGLang rollout's dozens of knob variants per point would make each of these searches seconds long):
    a change found this way fits with an engine rollout too where the engine can sleep. Each search is quick
    (:func:`search.search`): once a plan fits, the points the screen rejects are not replayed; the plan shown
    fits by the replay, the fastest among the points the screen lets fit.
    """
    workload, hardware = job.workload, job.hardware
    lines: list[str] = []

    def best_fit(w: Workload = workload, h: Hardware = hardware, ranks: tuple[int, ...] = (0,)) -> Candidate | None:
        try:
            hybrid = ("hybrid-engine",)
            return run_search(
                w, h, coef, lora_ranks=ranks, rollouts=hybrid, closest=False, alternatives=0, quick=True
            ).best
        except ValueError:  # the batch does not split over the new GPU count
            return None

    def fits(w: Workload = workload, h: Hardware = hardware, ranks: tuple[int, ...] = (0,)) -> str | None:
        best = best_fit(w, h, ranks)
        return None if best is None else best.strategy.describe()

    for rank in LORA_RANKS if include_lora else ():
        known = (searched or {}).get((rank,))
        found = (known.best.strategy.describe() if known.best else None) if known else fits(ranks=(rank,))
        if found:
            lines.append(f"LoRA rank {rank} fits: {found} (--lora-rank {rank})")
            break
    else:
        if include_lora and not workload.is_rlhf:
            lines.append(qlora_needs(workload, hardware, coef))
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
    roomy = best_fit(h=replace(hardware, cpu_memory_bytes=hardware.cpu_memory_bytes * 4))
    if roomy is not None:  # said with what it needs, not the 4x searched: the job's host memory may be assumed
        needed, has = roomy.prediction.host_bytes, format_bytes(hardware.cpu_memory_bytes)
        lines.append(
            f"{format_bytes(needed)} of host memory per node fits (the job has {has}): "
            f"{roomy.strategy.describe()} (--cpu-mem {-(-needed // 2**30)}G)"
        )
    if workload.seq_len >= 256:
        shorter, flags = _half_length(workload)
        found = fits(w=shorter)
        if found:
            lines.append(f"sequences of {shorter.seq_len} tokens fit: {found} ({flags})")
    if not lines:
        lines.append("none of LoRA, up to 8 GPUs per node, 4x host memory or half the sequence length would fit")
    return lines


def qlora_needs(workload: Workload, hardware: Hardware, coef: Coefficients) -> str:
    """What QLoRA's leanest layouts need (NF4 base, rank-16 adapters, checkpointing, micro-batch 1): ZeRO-2 with the
    adapters' optimizer states on the CPU keeps the whole 4-bit model on every GPU (more GPUs do not lower it);
    ZeRO-3 with parameters and optimizer states on the host keeps a gathered layer or two on the GPU and the 4-bit
    model in host memory (every local rank loads it whole: ``store.quantization.qlora_loading``)."""
    rank = LORA_RANKS[0]
    accum = workload.global_batch // hardware.world_size or 1
    on_gpu = Strategy(2, "cpu", gradient_checkpointing=True, lora_rank=rank, grad_accum=accum, quantization="nf4")
    on_host = Strategy(3, "cpu", "cpu", True, lora_rank=rank, grad_accum=accum, quantization="nf4")
    gpu_needs = predict_strategy(workload, on_gpu, hardware, coef).peak_reserved_bytes
    hosted = predict_strategy(workload, on_host, hardware, coef)
    line = (
        f"QLoRA nf4 r{rank} ({on_gpu.describe()}) needs {format_bytes(gpu_needs)} of GPU memory plus the CUDA context "
        "and margin (ZeRO-0/1/2 keep the whole 4-bit model on every GPU, so more GPUs do not lower it)"
    )
    if hosted.peak_reserved_bytes < gpu_needs:
        host = hosted.host_bytes
        line += (
            f"; with the 4-bit weights on the host ({on_host.describe()}) it needs "
            f"{format_bytes(hosted.peak_reserved_bytes)} of GPU memory and {format_bytes(host)} of host memory per "
            f"node (--quantization nf4 --cpu-mem {-(-host // 2**30)}G)"
        )
    return line


def _half_length(workload: Workload) -> tuple[Workload, str]:
    """The workload with half the tokens per sequence, and the flags that ask for it.

    RLHF sequences are a prompt and a generation (``--prompt-len``, ``--gen-len``): both are halved.
    """
    if workload.is_rlhf and workload.prompt_len is not None and workload.gen_len is not None:
        prompt, gen = max(1, workload.prompt_len // 2), max(1, workload.gen_len // 2)
        shorter = replace(workload, prompt_len=prompt, gen_len=gen, seq_len=prompt + gen)
        return shorter, f"--prompt-len {prompt} --gen-len {gen}"
    shorter = replace(workload, seq_len=workload.seq_len // 2)
    return shorter, f"--seq-len {shorter.seq_len}"

"""Every number of the cost model that is not physics: a name, a unit, a default and a reason.

Probes calibrate these (a later fit replaces the defaults); nothing else in ``search`` hides a constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


def _coef(default: float, unit: str, reason: str) -> Any:
    return field(default=default, metadata={"unit": unit, "reason": reason})


@dataclass(frozen=True)
class Coefficients:
    """Tunable constants of the memory and time model (defaults from the literature and DeepSpeed)."""

    # --- memory outside tensors -------------------------------------------------------------------
    cuda_context_bytes: float = _coef(
        512 * 2**20, "bytes", "CUDA context, kernels and NCCL/cuBLAS handles before any tensor (300-600 MB)"
    )
    cublas_workspace_bytes: float = _coef(
        32 * 2**20, "bytes", "cuBLAS workspace that torch allocates through the caching allocator"
    )
    host_buffer_factor: float = _coef(
        1.5,
        "multiplier",
        "DeepSpeed's additional_buffer_factor in its estimators: offloaded states x this is their host memory "
        "with pinned buffers, unless DeepSpeed's own host buffers come to more (search.model.host)",
    )
    # --- activations ------------------------------------------------------------------------------
    eager_softmax_bytes: float = _coef(
        4, "bytes/element", "HF eager attention keeps the softmax output in fp32 for its backward"
    )
    rmsnorm_extra_bytes: float = _coef(
        4, "bytes/element", "HF RMSNorm upcasts its input to fp32 and autograd keeps that copy"
    )
    logits_peak_bytes: float = _coef(
        12,
        "bytes/element of b*s*vocab",
        "ForCausalLMLoss: fp32 log-softmax output plus its incoming and outgoing fp32 gradients",
    )
    backward_working_layers: float = _coef(
        0.15,
        "layers",
        "activation gradients of the layer being differentiated, live beside the saved ones; CPU probes of a "
        "tiny Llama (recompute, mb 2-8, sdpa and eager) measured 0.08-0.14 of a layer's activations (was 1.0)",
    )
    # --- the search's screen: fragments (reserved minus allocated) before the allocator replay decides -------
    frag_within_step: float = _coef(
        0.06, "fraction of transient bytes", "block splitting and 2 MiB rounding within one step"
    )
    frag_carried: float = _coef(
        0.10,
        "fraction of transient bytes",
        "fragments left by earlier phases/steps that empty_cache would release (arXiv 2410.15651)",
    )
    frag_zero3_factor: float = _coef(
        1.3, "multiplier", "ZeRO-3 gathers and frees parameters of many sizes: more fragments (2410.15651)"
    )
    frag_checkpointing_factor: float = _coef(
        1.1, "multiplier", "recompute interleaves short-lived activations with saved ones (2410.15651)"
    )
    frag_offload_factor: float = _coef(0.9, "multiplier", "offload moves states off the GPU heap")
    frag_expandable_factor: float = _coef(
        0.25, "multiplier", "expandable segments map pages into one segment instead of splitting blocks"
    )
    reserved_spread: float = _coef(
        0.08,
        "fraction of peak reserved",
        "the spread the search's screen keeps before a plan's kind is known (a plan's own prediction keeps the "
        "spread its nearest measured records give, search.spread.measured), and any plan's where no records "
        "table is shipped: the same ZeRO-2 step reserved 29.62 GiB under planner probe and 32.07 GiB in a "
        "user-style loop (DeepSpeed's defaults), 27.03 GiB allocated in both",
    )
    reserved_spread_margin: float = _coef(
        0.02,
        "fraction of peak reserved",
        "kept beyond the largest under-prediction of the records a plan's spread rests on (search.spread): a "
        "few runs per kind do not bound the next one; an assumption, not measured (the H200 records moved "
        "0.0% in reserved between two programs of one step, the step time 10% between two runs)",
    )
    program_reserved_factor: float = _coef(
        1.0,
        "multiplier of peak reserved",
        "the user's program's peak reserved over memplan's own probe of the same strategy (recommend --program, "
        "planner.planning.program_spread; never below 1), applied on top of the records' spread: a plan keeps "
        "(1 + spread) x this - 1 of its peak reserved free; 1 when none is measured",
    )
    # --- time (search.model.roofline; the GPU's own rates and efficiencies are in its catalog entry) ---------
    host_s_per_kernel: float = _coef(
        4e-5,
        "s per kernel",
        "host time to issue one kernel from eager PyTorch under transformers and DeepSpeed (Python, dispatcher, "
        "launch): the host CPU's figure, not the GPU's; measured on the H100 host of the shared records, HF decode "
        "18.6 ms per token over 24 OPT layers of ~18 kernels plus ~30 per generate step. Other GPUs get the same "
        "figure, i.e. a host as fast as that one (an older host, such as a V100 server's, is assumed, not derived: "
        "docs/gpus.md); planner calibrate fits it on your own machine",
    )
    host_s_per_tensor_op: float = _coef(
        1e-5,
        "s per kernel",
        "a bare tensor expression in the training loop's own Python (PPO's advantage loop, loss arithmetic): the "
        "dispatcher and cudaLaunchKernel (torch.profiler on the H100 host: 7.9 us of self CPU per launch)",
    )
    checkpoint_forward_overhead: float = _coef(
        0.5,
        "x the forward's host time",
        "torch's non-reentrant checkpoint around each HF decoder layer (RNG stash, saved-tensor pack hooks, "
        "determinism metadata) in the forward: benchmarks/checkpoint_overhead.py, 0.38-0.73 over OPT and Llama",
    )
    checkpoint_backward_overhead: float = _coef(
        0.85,
        "x the forward's host time",
        "the same in the backward beyond the recompute itself (unpack hooks, RNG fork and restore, recompute "
        "frames): benchmarks/checkpoint_overhead.py, 0.54-1.23 over OPT and Llama",
    )
    ds_hook_kernels_per_grad: float = _coef(
        3,
        "kernel-equivalents per gradient tensor per backward",
        "DeepSpeed's per-gradient hook (stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads: "
        "bucket bookkeeping, stream record, one copy_), counted in host kernel times",
    )
    ds_step_kernels_per_tensor: float = _coef(
        6,
        "kernels per trainable tensor per optimizer step",
        "DeepSpeed's step walks every gradient: two isfinite, amax, amin, an fp64 norm and its upcast "
        "(torch.profiler on the H100: 779 isfinite, 388 amax/amin, 389 norms per step over 388 tensors)",
    )
    comm_overlap: float = _coef(0.5, "fraction", "share of ZeRO collectives hidden behind compute")
    network_efficiency: float = _coef(0.7, "fraction", "achieved fraction of link bandwidth in collectives")
    gpu_adam_bytes_per_param: float = _coef(
        40,
        "bytes/param",
        "fused Adam reads and writes fp32 master, m, v, reads the fp32 gradient and writes the 16-bit copy (32), "
        "plus the gradient's flattening and upcast (8)",
    )
    cpu_adam_bytes_per_param: float = _coef(
        30,
        "bytes/param",
        "DeepSpeedCPUAdam streams fp32 param, grad, m, v in and param, m, v out, and writes the 16-bit copy",
    )
    host_memory_gbps: float = _coef(
        100, "GB/s per node", "host DRAM bandwidth that CPU Adam's streaming reaches on a GPU server's share"
    )
    host_first_touch_gbps: float = _coef(
        12.6,
        "GB/s per node",
        "a new pageable host tensor's first write: the kernel zeroes each page it faults in (measured on the H200 "
        "host, 16 cores: fp32->bf16 into a new tensor 313 ms, into a touched one 104 ms, 2.6 GB; "
        "benchmarks/gpu/host_link.py, benchmarks/results/host_link.md); an assumption for other hosts",
    )
    pageable_copy_gbps: float = _coef(
        6.6,
        "GB/s per GPU",
        "host-to-device copy from pageable memory: the driver stages it through its own pinned buffers with a "
        "host memcpy (measured on the H200 host: 6.64 GB/s against 55.2 pinned, benchmarks/gpu/host_link.py); "
        "an assumption for other hosts",
    )
    nvme_gbps: float = _coef(3.0, "GB/s per node", "sustained NVMe read/write of a single data-centre SSD")
    empty_cache_call_s: float = _coef(0.003, "s per call", "synchronize plus cudaFree of the cached segments")
    empty_cache_realloc_s_per_gib: float = _coef(
        0.004, "s per GiB", "cudaMalloc of the released segments when the next phase needs them again"
    )
    cuda_malloc_s: float = _coef(
        5e-4,
        "s per segment",
        "cudaMalloc of a new segment by the caching allocator (driver call and page mapping, 0.1-1 ms)",
    )
    cuda_free_s: float = _coef(
        2e-4, "s per segment", "cudaFree of a cached segment (it synchronizes the device; tens of us to 1 ms)"
    )
    step_overhead_s: float = _coef(0.002, "s per micro-batch", "the training loop's Python and data")
    # --- RLHF (search.rlhf) -------------------------------------------------------------------------
    frag_inference_carried: float = _coef(
        0.5,
        "fraction of an inference phase's transient bytes",
        "freed KV cache, logits and gathered weights stay cached in blocks training cannot reuse (2410.15651)",
    )
    hybrid_engine_workspace_hidden: float = _coef(
        10,
        "hidden-size vectors per token of the generation batch",
        "DeepSpeed inference workspace beside its KV cache (inference_context.h GenWorkSpace: 10 x hidden)",
    )
    # --- rollout engines: vLLM and SGLang (search.rollout) ------------------------------------------------
    rollout_non_torch_bytes: float = _coef(
        256 * 2**20,
        "bytes per GPU",
        "memory outside torch's allocator that an engine's first forward adds (lazily loaded kernels, attention "
        "backend workspaces): vLLM v1's 'non-torch forward increase memory' logged 0.02-0.61 GiB at tp=1",
    )
    rollout_tp_comm_bytes: float = _coef(
        1.79 * 2**30,
        "bytes per GPU",
        "NCCL and custom all-reduce buffers of a tensor-parallel group: vLLM's non-torch memory of "
        "Llama-3-8B on an H100 grew from 1.79 to 3.58 GiB going from tp=1 to tp=2 (vllm PR 10511)",
    )
    rollout_graph_bytes_per_capture: float = _coef(
        6 * 2**20,
        "bytes per captured CUDA graph",
        "graph objects and their share of the pool beyond the largest graph: vLLM counts at least 1 MiB a graph "
        "(gpu_model_runner.profile_cudagraph_memory); 35 graphs of Llama-3.2-1B took 0.21 GiB (vllm PR 11349)",
    )
    rollout_sampler_fp32_copies: float = _coef(
        2,
        "fp32 tensors of rows x vocabulary",
        "vLLM's sampler beside the fp32 logits: the softmax probabilities and random_sample's exponential noise "
        "(v1/sample/ops/topk_topp_sampler.py forward_native, random_sample)",
    )

    # --- rollout engines (search.rollout): assumed orders of magnitude until a probe calibrates them ---------
    engine_step_host_s: float = _coef(
        1.5e-3,
        "s per decoding step",
        "a vLLM/SGLang engine's own host work per decoding step (scheduler, input preparation, sampling, "
        "detokenizing) at a few hundred running sequences; with CUDA graphs the step's kernels cost one replay",
    )
    engine_all_reduce_s: float = _coef(
        1e-5,
        "s per all-reduce",
        "a decoding step's small tensor-parallel all-reduce inside a node (vLLM's custom all-reduce over NVLink: "
        "about 10 us); two per layer",
    )
    engine_sync_s_per_tensor: float = _coef(
        1e-4,
        "s per weight tensor",
        "the weight sync's host work per tensor: a gather context, an IPC handle or NCCL broadcast call, and the "
        "engine's load_weights copy",
    )
    engine_sleep_wake_s: float = _coef(
        0.3,
        "s per sleep and wake",
        "releasing the engine's KV cache to the driver at sleep and mapping it again at wake (vLLM's CuMemAllocator "
        "unmap/map, prefix-cache reset), beyond any weight copies",
    )

    def with_(self, **changes: float) -> Coefficients:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> Coefficients:
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in known})


def describe_coefficients() -> list[dict[str, Any]]:
    """Name, unit, default and reason of every coefficient (for ``planner explain``)."""
    return [
        {"name": f.name, "default": f.default, "unit": f.metadata["unit"], "reason": f.metadata["reason"]}
        for f in fields(Coefficients)
    ]


DEFAULT_COEFFICIENTS = Coefficients()

"""A single-model step's host memory per node (:mod:`search.model.host`) and the notes on how its program
builds the model: offloaded states with DeepSpeed's pinned buffers, or, when larger, every local rank loading its
copy of the model before ``deepspeed.initialize``.
"""

from __future__ import annotations

from search.coefficients import Coefficients
from search.model.host import LOADING, STEADY, HostMemory, per_node, trained_host
from search.model.placement import TrainedPlacement
from search.model.quantized import quant_constants_bytes
from store.model_build import build_note, builds_partitioned
from store.records import DTYPE_BYTES, Hardware, Strategy, Workload


def host_memory(
    workload: Workload, s: Strategy, placed: TrainedPlacement, hardware: Hardware, coef: Coefficients
) -> tuple[HostMemory, bool]:
    """Host memory per node, and whether a ZeRO-3 program builds its model partitioned (under zero.Init)."""
    model, d, n, states = workload.model, DTYPE_BYTES[workload.dtype], hardware.world_size, placed.states
    # host memory per node (search.model.host): offloaded states with DeepSpeed's pinned buffers and the
    # estimators' slack through training; or, when larger, every local rank loading its 16-bit copy of the
    # model before deepspeed.initialize (ZeRO-3 builds it partitioned under zero.Init).
    # ZeRO-3: each rank holds its partition only when the program builds under zero.Init (store.model_build)
    partitioned = s.zero_stage == 3 and builds_partitioned(
        workload.framework,
        model_bytes=d * placed.resident,
        device_bytes=hardware.gpu_memory_bytes,
        model_build=workload.model_build,
    )
    loading = hardware.gpus * d * placed.resident // (n if partitioned else 1)
    if s.quantization != "none":  # bitsandbytes quantizes each shard as it loads: the host holds the 4/8-bit copy
        # ZeRO-3 too: transformers loads a quantized model whole, without zero.Init (store.quantization.qlora_loading)
        whole = d * placed.resident + quant_constants_bytes(model, s.quantization) if s.zero_stage == 3 else None
        loading = hardware.gpus * (states.parameters if whole is None else whole)
    held = per_node(trained_host(placed, coef), hardware.gpus)
    host = HostMemory({STEADY: held, LOADING: {"model_loading": loading}})
    return host, partitioned


def build_notes(workload: Workload, s: Strategy, partitioned: bool) -> list[str]:
    """What the plan says beside its figures: how the program builds the model, a LoRA rank that is large."""
    model = workload.model
    notes = []
    if s.zero_stage == 3:  # the program's model build: what init allocates on the GPU and host (store.model_build)
        quantized = s.quantization != "none"
        notes.append(build_note(workload.framework, partitioned, quantized=quantized, model_build=workload.model_build))
    if s.lora_rank and s.lora_rank * 8 > model.hidden_size:
        notes.append(f"LoRA rank {s.lora_rank} is large for hidden size {model.hidden_size}")
    return notes

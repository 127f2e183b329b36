"""The Hardware record of a job: the GPU (catalog or ``--gpu-mem``), the node, the counts, host memory and
the network between nodes, each assumption said in the job's readings with where it comes from.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from planner.job.spec import DEFAULT_GPUS, JobSpec, positive_int
from store.errors import InputError
from store.gpus import GENERIC_PREFIX, generic_gpu, get_gpu
from store.nodes import NodeSpec, get_node, least_host_memory_ratio, reference_node
from store.records import Hardware
from store.sizes import describe_size, format_bytes, parse_size

# Host memory per node assumed for a probe on this machine where the OS does not say how much it has.
DEFAULT_CPU_MEM = 64 * 2**30
# One 200 Gb/s InfiniBand or RoCE link per node (GB/s, one direction): the network between nodes assumed only
# where nothing better is known (no --inter-node-gbps, no --node, no catalog node for the GPU), and what plans
# saved before the node catalog were made with.
FALLBACK_INTER_NODE_GBPS = 25.0
MAX_INTER_NODE_GBPS = 100_000.0  # GB/s per node: 800 Tb/s, beyond any node's NICs; larger is a typo


def host_memory_bytes() -> int | None:
    """Physical memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# No GPU or node has less memory than this: a smaller size is a unit left out (``gpu_mem=24`` for "24G").
MIN_MEMORY = 2**20


def memory_size(value: Any, flag: str) -> int:
    """Bytes of a GPU's or a node's memory: a size with a unit (``24G``) or an int of bytes (``store.sizes``).

    Below ``MIN_MEMORY`` (1 MiB) it is an InputError: a bare ``24`` would mean 24 bytes, never what was meant.
    """
    size = parse_size(value, flag)
    if size < MIN_MEMORY:
        text = " ".join(str(value).split())
        if isinstance(value, (int, float)) or text.isdigit():
            raise InputError(
                f"{flag} {text} would mean {text} bytes: write the unit, like {text}G ({text} GiB), "
                "or give the size in bytes"
            )
        raise InputError(f"{flag} {text} is less than 1 MiB: write the memory with its unit, like 24G")
    return size


def resolve_hardware(spec: JobSpec, readings: list[str], *, local: bool = False) -> Hardware:
    """The Hardware record of ``spec``: catalog GPU and/or ``--gpu-mem``, the node, counts, host memory and the
    network between nodes, each assumption said in ``readings`` with where it comes from.

    ``local``: the job runs on this machine (``planner probe`` and ``tune``), so its host memory is this
    machine's unless ``--cpu-mem`` says otherwise. Otherwise the target is another machine and the planning
    machine's memory never stands in for it: the host memory comes from ``--cpu-mem``, ``--node`` or the GPU's
    typical node (:func:`default_host_memory`)."""
    node = _node(spec, local)
    gpus = positive_int(spec.gpus if spec.gpus is not None else node.gpus_per_node if node else DEFAULT_GPUS, "--gpus")
    if node is not None and gpus > node.gpus_per_node:
        raise InputError(f"--gpus {gpus}: a {node.name} has {node.gpus_per_node} GPUs (give --nodes for more of them)")
    nodes = positive_int(spec.nodes, "--nodes")
    if not 0 <= spec.safety_margin < 0.5:
        raise InputError(f"--safety-margin must be between 0 and 0.5, not {spec.safety_margin}")
    if spec.gpu is None and spec.gpu_mem is None and node is None:
        raise InputError(
            "say which GPU: --gpu-mem 24G, --gpu NAME (for example --gpu A100-80G) or --node NAME "
            "(for example --node dgx-h100)"
        )
    gpu = get_gpu(spec.gpu) if spec.gpu is not None else get_gpu(node.gpu) if node is not None else None
    if node is not None:
        readings.append(f"node: {node.describe()}")
        overridden = [
            f"{flag} {value}"
            for flag, value in (("--gpu", spec.gpu), ("--gpus", spec.gpus), ("--cpu-mem", spec.cpu_mem))
            if value is not None
        ] + ([f"--inter-node-gbps {spec.inter_node_gbps}"] if spec.inter_node_gbps is not None else [])
        if overridden:
            readings.append(f"node: {', '.join(overridden)} given, in place of {node.name}'s")
        if gpu is not None and gpu.name == node.gpu and gpu.interconnect_gbps != node.intra_node_gbps:
            gpu = replace(gpu, interconnect_gbps=node.intra_node_gbps)
    if spec.gpu_mem is not None:
        memory = memory_size(spec.gpu_mem, "--gpu-mem")
        readings.append(f"GPU memory: {describe_size(spec.gpu_mem, memory)}")
        if gpu is None:
            gpu = generic_gpu(memory)
            readings.append(
                f"GPU rates: none given, so {gpu.name} is assumed to compute at an A100-80G's rates (the GPU "
                "catalog; pass --gpu NAME for yours)"
            )
    else:
        assert gpu is not None
        memory = gpu.memory_bytes
    cpu_memory = _host_memory(spec, node, gpu.name, memory, gpus, local, readings)
    inter_node = _inter_node_gbps(spec, node, gpu.name, nodes, readings)
    if gpus > 1:
        readings.append(
            f"GPU-to-GPU link in a node: {gpu.interconnect_gbps:g} GB/s per GPU, one direction "
            f"({_link_source(node, gpu.name)})"
        )
    if spec.nvme_path is not None and not spec.nvme_path.strip():
        raise InputError("--nvme-path must name a folder")
    return Hardware(
        gpu=gpu,
        gpu_memory_bytes=memory,
        gpus=gpus,
        nodes=nodes,
        cpu_memory_bytes=cpu_memory,
        nvme_path=spec.nvme_path,
        inter_node_gbps=inter_node,
        safety_margin=spec.safety_margin,
        node=node.name if node is not None else None,
    )


def _node(spec: JobSpec, local: bool) -> NodeSpec | None:
    if spec.node is None:
        return None
    if not isinstance(spec.node, str):
        raise InputError(f"--node must be a node's name, not {spec.node!r}"[:120])
    if local:
        raise InputError(
            "--node names a machine to plan for, but a probe runs on this one: give --gpus and --cpu-mem instead"
        )
    return get_node(spec.node)


def default_host_memory(gpu_name: str, gpu_memory: int, gpus: int) -> tuple[int, str]:
    """Host memory per node assumed for ``gpus`` GPUs of ``gpu_name`` on a machine that is not this one, and
    where that comes from: the host memory per GPU of the GPU's typical node (``store.nodes.REFERENCE_NODES``),
    else the least host memory per byte of GPU memory among the catalog's nodes (p4de.24xlarge's 1152 GiB for
    8 x 80 GB: 1.8 x), times the GPU's memory. Both are per GPU, so a job on part of a node is not promised the
    memory of the whole node."""
    typical = reference_node(gpu_name)
    if typical is not None:
        per_gpu = typical.host_memory_per_gpu_bytes
        how = (
            f"{format_bytes(per_gpu)}, the host memory per GPU of {typical.name}, {gpu_name}'s typical node "
            f"({typical.cited})"
        )
    else:
        ratio, least = least_host_memory_ratio()
        per_gpu = int(ratio * gpu_memory) // 2**20 * 2**20
        how = (
            f"{format_bytes(per_gpu)}, {ratio:g} x its {format_bytes(gpu_memory)} of GPU memory: the least ratio of "
            f"host to GPU memory among the node catalog's machines ({least.name}: {least.cited})"
        )
    return gpus * per_gpu, f"{gpus} GPU{'s' if gpus > 1 else ''} x {how}"


def _host_memory(
    spec: JobSpec, node: NodeSpec | None, gpu_name: str, gpu_memory: int, gpus: int, local: bool, readings: list[str]
) -> int:
    if spec.cpu_mem is not None:
        cpu_memory = memory_size(spec.cpu_mem, "--cpu-mem")
        readings.append(f"host memory per node, from --cpu-mem: {describe_size(spec.cpu_mem, cpu_memory)}")
        return cpu_memory
    if node is not None:
        readings.append(
            f"host memory per node: {format_bytes(node.host_memory_bytes)} ({node.name}: {node.cited}; "
            "pass --cpu-mem for another)"
        )
        return node.host_memory_bytes
    if local:
        here = host_memory_bytes()
        if here is None:
            readings.append(
                f"host memory per node: {format_bytes(DEFAULT_CPU_MEM)} (assumed: this machine does not say how "
                "much it has; pass --cpu-mem)"
            )
            return DEFAULT_CPU_MEM
        readings.append(
            f"host memory per node: {format_bytes(here)} (this machine's, where the probes run; pass --cpu-mem)"
        )
        return here
    cpu_memory, how = default_host_memory(gpu_name, gpu_memory, gpus)
    readings.append(
        f"host memory per node: {format_bytes(cpu_memory)} (assumed: {how}; not this machine's: it plans the "
        "job, it does not run it; pass --cpu-mem or --node)"
    )
    return cpu_memory


def _inter_node_gbps(spec: JobSpec, node: NodeSpec | None, gpu_name: str, nodes: int, readings: list[str]) -> float:
    """GB/s per node, one direction, between nodes: ``--inter-node-gbps``, else the node's, else the GPU's
    typical node's, else :data:`FALLBACK_INTER_NODE_GBPS`; said in ``readings`` when there are nodes to link."""
    given = spec.inter_node_gbps
    if given is not None:
        # compared before any conversion: nan and inf fail the bounds, and a 400-digit int never becomes a float
        if isinstance(given, bool) or not isinstance(given, (int, float)) or not 0 < given <= MAX_INTER_NODE_GBPS:
            shown = repr(given) if len(repr(given)) <= 24 else repr(given)[:21] + "..."
            raise InputError(
                f"--inter-node-gbps must be GB/s per node, above 0 and at most {MAX_INTER_NODE_GBPS:g}, not {shown}"
            )
        readings.append(f"between nodes: {given:g} GB/s per node, one direction (--inter-node-gbps)")
        return float(given)
    if node is not None:
        if node.inter_node_gbps is None:
            if nodes > 1:
                raise InputError(
                    f"--node {node.name} has no network to other nodes: give --inter-node-gbps for the link between "
                    f"the {nodes} nodes"
                )
            return FALLBACK_INTER_NODE_GBPS  # one node: nothing crosses a network
        if nodes > 1:
            readings.append(
                f"between nodes: {node.inter_node_gbps:g} GB/s per node, one direction ({node.name}: {node.cited}; "
                "pass --inter-node-gbps for another)"
            )
        return node.inter_node_gbps
    typical = reference_node(gpu_name)
    if typical is not None and typical.inter_node_gbps is not None:
        gbps, how = typical.inter_node_gbps, f"as in {typical.name}, {gpu_name}'s typical node ({typical.cited})"
    else:
        gbps = FALLBACK_INTER_NODE_GBPS
        how = f"one 200 Gb/s InfiniBand or RoCE link per node: the node catalog has no node of {gpu_name}"
    if nodes > 1:
        readings.append(
            f"between nodes: {gbps:g} GB/s per node, one direction (assumed: {how}; pass --inter-node-gbps or --node)"
        )
    return gbps


def _link_source(node: NodeSpec | None, gpu_name: str) -> str:
    if node is not None and node.gpu == gpu_name:
        return f"{node.name}'s {node.intra_node}: {node.cited}"
    if gpu_name.startswith(GENERIC_PREFIX):
        return "assumed: an A100's NVLink, the rates of a GPU known only by its memory; pass --gpu NAME"
    return f"{gpu_name} in the GPU catalog"

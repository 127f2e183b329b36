"""The node catalog: machines a job runs on, as their datasheets and instance specifications give them.

A node is part of the target, beside its GPU: its host memory holds offloaded states and every rank's copy of
the model while it loads, and its network carries the collectives between nodes. Each entry cites where its
numbers come from (``source``). Units follow the GPU catalog (``store.gpus``): bandwidths are GB/s (10^9 bytes
per second) in one direction; host memory is binary (a "2 TB" DGX holds 32 x 64 GB DIMMs, 2 TiB).

- ``intra_node_gbps``: what one GPU sends to the others of its node (NVLink through NVSwitch, or PCIe), one
  direction: half of NVIDIA's bidirectional "900 GB/s" for NVLink 4.
- ``inter_node_gbps``: what the node sends to the other nodes, all its compute NICs together, one direction:
  8 x 400 Gb/s ConnectX-7 = 3200 Gb/s = 400 GB/s. None for a machine with no fabric to other nodes.

When no node is named, ``reference_node`` gives a catalog GPU's typical node: NVIDIA's DGX for the data-center
GPUs it ships in, the workstation for the RTX 4090; other GPUs have none (``planner.job.inputs`` says what it
assumes then).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from store.errors import InputError
from store.gpus import get_gpu

GiB = 2**30


@dataclass(frozen=True)
class NodeSpec:
    """One machine of the catalog: its GPUs, host memory and links, and where each number comes from."""

    name: str
    gpu: str  # a GPU catalog name (store.gpus)
    gpus_per_node: int
    host_memory_bytes: int
    intra_node: str  # the GPU-to-GPU link inside the node, in words
    intra_node_gbps: float  # per GPU, one direction, GB/s
    inter_node_gbps: float | None  # per node, one direction, GB/s; None: no link to other nodes
    source: str  # the datasheet or instance specification the numbers come from
    aliases: tuple[str, ...] = ()

    @property
    def host_memory_per_gpu_bytes(self) -> int:
        return self.host_memory_bytes // self.gpus_per_node

    @property
    def cited(self) -> str:
        """The source's title: ``NVIDIA DGX H100 datasheet``."""
        return self.source.split(":", 1)[0]

    def describe(self) -> str:
        """``dgx-h100: 8 x H100-80G, 2.00 TiB host memory, ... (source)``: every number the plan takes from it."""
        whole_tib = self.host_memory_bytes % 2**40 == 0
        host_text = f"{self.host_memory_bytes // 2**40} TiB" if whole_tib else f"{self.host_memory_bytes // GiB} GiB"
        between = (
            f"{self.inter_node_gbps:g} GB/s per node between nodes"
            if self.inter_node_gbps is not None
            else "no link to other nodes"
        )
        return (
            f"{self.name}: {self.gpus_per_node} x {self.gpu}, {host_text} host memory, {self.intra_node} "
            f"{self.intra_node_gbps:g} GB/s per GPU, {between} (GB/s one direction; {self.source})"
        )


_NODES: tuple[NodeSpec, ...] = (
    NodeSpec(
        name="dgx-h100",
        gpu="H100-80G",
        gpus_per_node=8,
        host_memory_bytes=2048 * GiB,
        intra_node="NVLink 4 through NVSwitch",
        intra_node_gbps=450,
        inter_node_gbps=400,
        source="NVIDIA DGX H100 datasheet: 8x H100 SXM 80GB, 2TB system memory, 900 GB/s NVLink per GPU "
        "(bidirectional), 8x single-port ConnectX-7 400 Gb/s",
        aliases=("dgx-h100-80g", "hgx-h100", "dgxh100"),
    ),
    NodeSpec(
        name="dgx-h200",
        gpu="H200",
        gpus_per_node=8,
        host_memory_bytes=2048 * GiB,
        intra_node="NVLink 4 through NVSwitch",
        intra_node_gbps=450,
        inter_node_gbps=400,
        source="NVIDIA DGX H200 datasheet: 8x H200 141GB, 2TB system memory, 900 GB/s NVLink per GPU "
        "(bidirectional), 8x single-port ConnectX-7 400 Gb/s",
        aliases=("hgx-h200", "dgxh200"),
    ),
    NodeSpec(
        name="dgx-a100",
        gpu="A100-80G",
        gpus_per_node=8,
        host_memory_bytes=2048 * GiB,
        intra_node="NVLink 3 through NVSwitch",
        intra_node_gbps=300,
        inter_node_gbps=200,
        source="NVIDIA DGX A100 datasheet (DGX A100 640GB): 8x A100 80GB, 2TB system memory, 600 GB/s NVLink per "
        "GPU (bidirectional), 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand",
        aliases=("dgx-a100-640gb", "dgx-a100-80g", "hgx-a100"),
    ),
    NodeSpec(
        name="dgx-a100-320gb",
        gpu="A100-40G",
        gpus_per_node=8,
        host_memory_bytes=1024 * GiB,
        intra_node="NVLink 3 through NVSwitch",
        intra_node_gbps=300,
        inter_node_gbps=200,
        source="NVIDIA DGX A100 datasheet (DGX A100 320GB): 8x A100 40GB, 1TB system memory, 600 GB/s NVLink per "
        "GPU (bidirectional), 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand",
        aliases=("dgx-a100-40g",),
    ),
    NodeSpec(
        name="p5.48xlarge",
        gpu="H100-80G",
        gpus_per_node=8,
        host_memory_bytes=2048 * GiB,
        intra_node="NVLink 4 through NVSwitch",
        intra_node_gbps=450,
        inter_node_gbps=400,
        source="AWS EC2 P5 instance specifications: p5.48xlarge, 8x H100 80GB, 2 TiB memory, 900 GB/s NVSwitch, "
        "3200 Gbps EFA networking",
        aliases=("aws-p5", "p5"),
    ),
    NodeSpec(
        name="p4de.24xlarge",
        gpu="A100-80G",
        gpus_per_node=8,
        host_memory_bytes=1152 * GiB,
        intra_node="NVLink 3 through NVSwitch",
        intra_node_gbps=300,
        inter_node_gbps=50,
        source="AWS EC2 P4 instance specifications: p4de.24xlarge, 8x A100 80GB, 1152 GiB memory, 600 GB/s "
        "NVSwitch, 400 Gbps EFA networking",
        aliases=("aws-p4de", "p4de"),
    ),
    NodeSpec(
        name="p4d.24xlarge",
        gpu="A100-40G",
        gpus_per_node=8,
        host_memory_bytes=1152 * GiB,
        intra_node="NVLink 3 through NVSwitch",
        intra_node_gbps=300,
        inter_node_gbps=50,
        source="AWS EC2 P4 instance specifications: p4d.24xlarge, 8x A100 40GB, 1152 GiB memory, 600 GB/s "
        "NVSwitch, 400 Gbps EFA networking",
        aliases=("aws-p4d", "p4d"),
    ),
    NodeSpec(
        name="workstation-4090",
        gpu="RTX-4090",
        gpus_per_node=1,
        host_memory_bytes=128 * GiB,
        intra_node="PCIe 4.0 x16",
        intra_node_gbps=25,
        inter_node_gbps=None,
        source="a single-GPU workstation as assumed here: one GeForce RTX 4090 24GB (NVIDIA's specifications: "
        "PCIe 4.0 x16, no NVLink) and 128 GiB of DDR5 (4 x 32 GB), no network to other nodes",
        aliases=("workstation", "rtx-4090-workstation", "4090-workstation"),
    ),
)

# A catalog GPU's typical node, taken for the target's host memory and network when no node is named.
REFERENCE_NODES: dict[str, str] = {
    "H100-80G": "dgx-h100",
    "H200": "dgx-h200",
    "A100-80G": "dgx-a100",
    "A100-40G": "dgx-a100-320gb",
    "RTX-4090": "workstation-4090",
}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


_BY_KEY: dict[str, NodeSpec] = {}
for _node in _NODES:
    for _alias in (_node.name, *_node.aliases):
        _BY_KEY[_key(_alias)] = _node


def node_names() -> list[str]:
    """Catalog names, in catalog order."""
    return [node.name for node in _NODES]


def nodes() -> tuple[NodeSpec, ...]:
    """Every catalog node, in catalog order."""
    return _NODES


def get_node(name: str) -> NodeSpec:
    """The catalog node called ``name`` (case and ``-``/``_`` insensitive, aliases allowed); an unknown name is
    an InputError naming the closest ones."""
    found = _BY_KEY.get(_key(str(name)))
    if found is None:
        shown = str(name) if len(str(name)) <= 40 else str(name)[:37] + "..."
        close = difflib.get_close_matches(_key(str(name)), list(_BY_KEY), n=3, cutoff=0.4)
        names = sorted({_BY_KEY[c].name for c in close})
        hint = f"; did you mean {', '.join(names)}?" if names else ""
        raise InputError(f"unknown node {shown!r}{hint} Known: {', '.join(node_names())}")
    return found


def reference_node(gpu_name: str) -> NodeSpec | None:
    """The typical node of catalog GPU ``gpu_name`` (:data:`REFERENCE_NODES`), or None."""
    name = REFERENCE_NODES.get(gpu_name)
    return _BY_KEY[_key(name)] if name is not None else None


def least_host_memory_ratio() -> tuple[float, NodeSpec]:
    """The least host memory per byte of GPU memory among the catalog's nodes, and the node that has it."""

    def ratio(node: NodeSpec) -> float:
        return node.host_memory_bytes / (node.gpus_per_node * get_gpu(node.gpu).memory_bytes)

    node = min(_NODES, key=ratio)
    return ratio(node), node

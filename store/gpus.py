"""The GPU catalog: memory as torch reports it, dense tensor-core rates and bandwidths, and where each comes from.

Memory is ``torch.cuda.get_device_properties(i).total_memory`` as nvidia-smi lists it (MiB). Rates are
the vendors' dense figures (no sparsity); the time model applies achieved-fraction coefficients to
them. Bandwidths are GB/s (10^9 bytes per second), one direction.

Every entry carries its compute capability and, for every rate and achieved fraction, where the value comes
from (``GPUSpec.sources``): the vendor's datasheet or whitepaper by name, a mechanism (the PCIe generation's
line rate, the SM version's missing bf16 units), or the device it was set against. The achieved fractions are
per generation (:data:`GENERATIONS`): Hopper's were set against the H100 records; Volta's rest on published
V100 measurements; where nothing was measured or published for a generation the Hopper value is carried and
its source says so ("assumption"). docs/gpus.md lists them all.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from store.errors import InputError
from store.records import GPU_FRACTION_FIELDS, GPU_RATE_FIELDS, GPUSpec

MiB = 2**20

# The H100 records the Hopper fractions were set against (the time model's commit ef8dfc4, issue 15).
_H100_RECORDS = "the shared H100 records, tests/data/gpu/h100-2026-11-23.json"
_CARRIED = f"assumption: the Hopper value carried (set against {_H100_RECORDS}); nothing measured on this generation"
_PCIE_EFFICIENCY_GEN45 = (
    "assumption: the Hopper value carried (pinned copies' share of the catalog's host-link figure; the figure "
    "itself is already below the standard's line rate)"
)


@dataclass(frozen=True)
class Generation:
    """The achieved fractions of one GPU generation and where each comes from."""

    name: str
    matmul_efficiency: tuple[float, str]
    matmul_half_dim: tuple[float, str]
    hbm_efficiency: tuple[float, str]
    pcie_efficiency: tuple[float, str]
    kernel_floor_s: tuple[float, str]

    def fields(self) -> dict[str, tuple[float, str]]:
        """Field name -> (value, source) of every fraction."""
        return {name: getattr(self, name) for name in GPU_FRACTION_FIELDS}


HOPPER = Generation(
    "hopper",
    matmul_efficiency=(
        0.78,
        f"calibrated on H100-80G: a large cuBLAS bf16 GEMM reaches ~750 of 989 TF/s (set against {_H100_RECORDS})",
    ),
    matmul_half_dim=(64.0, f"calibrated on H100-80G (set against {_H100_RECORDS})"),
    hbm_efficiency=(0.8, f"calibrated on H100-80G: element-wise kernels' share of HBM3 (set against {_H100_RECORDS})"),
    pcie_efficiency=(
        0.8,
        f"calibrated on H100-80G: offload copies' share of the host link (set against {_H100_RECORDS})",
    ),
    kernel_floor_s=(3e-6, f"calibrated on H100-80G: the least device time of one kernel (set against {_H100_RECORDS})"),
)
# A100 predictions are kept as they were: its fractions stay Hopper's, each marked as carried.
AMPERE_DATACENTER = Generation(
    "ampere (A100)",
    matmul_efficiency=(0.78, _CARRIED),
    matmul_half_dim=(64.0, _CARRIED),
    hbm_efficiency=(0.8, _CARRIED),
    pcie_efficiency=(0.8, _PCIE_EFFICIENCY_GEN45),
    kernel_floor_s=(3e-6, _CARRIED),
)
AMPERE_GA10X = Generation(
    "ampere (GA10x workstation and consumer)",
    matmul_efficiency=(0.78, _CARRIED),
    matmul_half_dim=(64.0, _CARRIED),
    hbm_efficiency=(0.8, _CARRIED + " (GDDR6/GDDR6X, not HBM)"),
    pcie_efficiency=(0.8, _PCIE_EFFICIENCY_GEN45),
    kernel_floor_s=(3e-6, _CARRIED),
)
ADA = Generation(
    "ada lovelace",
    matmul_efficiency=(0.78, _CARRIED),
    matmul_half_dim=(64.0, _CARRIED),
    hbm_efficiency=(0.8, _CARRIED + " (GDDR6/GDDR6X, not HBM)"),
    pcie_efficiency=(0.8, _PCIE_EFFICIENCY_GEN45),
    kernel_floor_s=(3e-6, _CARRIED),
)
# PCIe 3.0 x16 (V100, T4): 8 GT/s x 16 lanes x 128b/130b = 15.75 GB/s per direction by the standard; pinned
# copies reach about 12-13 GB/s on it (TLP headers and flow control): 12.3 / 15.75.
_PCIE3_EFFICIENCY = (
    0.78,
    "mechanism: pinned copies over PCIe 3.0 x16 reach about 12.3 of the 15.75 GB/s line rate (TLP headers, "
    "flow control; CUDA bandwidthTest reports 12-13 GB/s on such hosts)",
)
VOLTA = Generation(
    "volta",
    matmul_efficiency=(
        0.66,
        "published: cuBLAS mixed-precision (fp16 in, fp32 accumulate) GEMM reaches 83 of the V100's 125 TF/s "
        "(Markidis et al. 2018, 'NVIDIA Tensor Core Programmability, Performance & Precision', arXiv 1803.04014)",
    ),
    matmul_half_dim=(64.0, _CARRIED + "; Volta's cuBLAS tiles are as wide as Hopper's (128 x 128 and up)"),
    hbm_efficiency=(
        0.83,
        "published: ~750 of 900 GB/s measured on V100 HBM2 (Jia et al. 2018, 'Dissecting the NVIDIA Volta GPU "
        "Architecture via Microbenchmarking', arXiv 1804.06826)",
    ),
    pcie_efficiency=_PCIE3_EFFICIENCY,
    kernel_floor_s=(3e-6, _CARRIED),
)
TURING = Generation(
    "turing",
    matmul_efficiency=(
        0.66,
        "assumption: Volta's published share (Markidis et al. 2018, arXiv 1803.04014) carried: Turing's tensor "
        "cores run the same HMMA kernel families in cuBLAS; the T4's 70 W cap throttles sustained GEMMs further "
        "(Jia et al. 2019, arXiv 1903.07486), not modelled",
    ),
    matmul_half_dim=(64.0, _CARRIED),
    hbm_efficiency=(0.8, _CARRIED + " (GDDR6, not HBM)"),
    pcie_efficiency=_PCIE3_EFFICIENCY,
    kernel_floor_s=(3e-6, _CARRIED),
)
GENERATIONS: tuple[Generation, ...] = (HOPPER, AMPERE_DATACENTER, AMPERE_GA10X, ADA, VOLTA, TURING)

_MEMORY = "nvidia-smi memory.total of this board (MiB)"
_PCIE3 = "mechanism: PCIe 3.0 x16"
_PCIE3_RATE = "mechanism: PCIe 3.0 x16 line rate, 8 GT/s x 16 lanes x 128b/130b = 15.75 GB/s per direction"
_PCIE4 = (
    "mechanism: PCIe 4.0 x16 (31.5 GB/s per direction by the standard); 25 GB/s is the catalog's figure below "
    "the line rate (assumption, kept)"
)
_PCIE5 = (
    "mechanism: PCIe 5.0 x16 (63 GB/s per direction by the standard); 50 GB/s is the catalog's figure below "
    "the line rate (assumption, kept)"
)
_PCIE4_PEER = "mechanism: no NVLink in this entry: GPU-to-GPU traffic crosses PCIe 4.0 x16 (the host-link figure)"
_NO_BF16 = (
    "mechanism: compute capability {cc} has no bf16 units (bf16 needs 8.0); the planner refuses bf16 on this GPU, "
    "the figure is its fp32 rate, the most an emulated bf16 could reach"
)


def _entry(
    name: str,
    memory_mib: int,
    cc: tuple[int, int],
    generation: Generation,
    rates: dict[str, tuple[float, str]],
    aliases: tuple[str, ...],
) -> GPUSpec:
    """One catalog entry: its rates with their sources, and its generation's fractions with theirs."""
    values = {field: value for field, (value, _) in rates.items()}
    sources = {field: source for field, (_, source) in rates.items()}
    for field, (value, source) in generation.fields().items():
        values[field] = value
        sources[field] = f"{generation.name}: {source}"
    sources["memory_bytes"] = _MEMORY
    sources["compute_capability"] = f"CUDA compute capability {cc[0]}.{cc[1]} ({generation.name})"
    missing = set(GPU_RATE_FIELDS) - set(rates)
    if missing:  # every rate must say where it comes from
        raise ValueError(f"{name}: no source for {sorted(missing)}")
    return GPUSpec(
        name=name,
        memory_bytes=memory_mib * MiB,
        aliases=aliases,
        compute_capability=cc,
        sources=tuple(sorted(sources.items())),
        **values,
    )


def _datasheet(doc: str, figure: str, value: float) -> tuple[float, str]:
    return value, f"datasheet: {doc}, {figure}"


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM4)"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM)"
_V100 = "NVIDIA Tesla V100 datasheet (SXM2)"
_GA102 = "NVIDIA Ampere GA102 GPU architecture whitepaper"
_AD102 = "NVIDIA Ada Lovelace GPU architecture whitepaper"

_GPUS: tuple[GPUSpec, ...] = (
    _entry(
        "A100-40G",
        40960,
        (8, 0),
        AMPERE_DATACENTER,
        {
            "bf16_tflops": _datasheet(_A100, "BF16 tensor 312 TF dense", 312),
            "fp16_tflops": _datasheet(_A100, "FP16 tensor 312 TF dense", 312),
            "fp32_tflops": _datasheet(_A100, "TF32 tensor 156 TF dense", 156),
            "hbm_gbps": _datasheet(_A100, "40GB HBM2, 1,555 GB/s", 1555),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": _datasheet(_A100, "NVLink 600 GB/s both directions: 300 per direction", 300),
        },
        ("a100", "a100-40gb", "a100-sxm4-40gb"),
    ),
    _entry(
        "A100-80G",
        81920,
        (8, 0),
        AMPERE_DATACENTER,
        {
            "bf16_tflops": _datasheet(_A100, "BF16 tensor 312 TF dense", 312),
            "fp16_tflops": _datasheet(_A100, "FP16 tensor 312 TF dense", 312),
            "fp32_tflops": _datasheet(_A100, "TF32 tensor 156 TF dense", 156),
            "hbm_gbps": _datasheet(_A100, "80GB HBM2e, 2,039 GB/s", 2039),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": _datasheet(_A100, "NVLink 600 GB/s both directions: 300 per direction", 300),
        },
        ("a100-80gb", "a100-sxm4-80gb"),
    ),
    _entry(
        "H100-80G",
        81559,
        (9, 0),
        HOPPER,
        {
            "bf16_tflops": _datasheet(_H100, "BF16 tensor 989 TF dense (1,979 with sparsity)", 989),
            "fp16_tflops": _datasheet(_H100, "FP16 tensor 989 TF dense (1,979 with sparsity)", 989),
            "fp32_tflops": _datasheet(_H100, "TF32 tensor 495 TF dense (989 with sparsity)", 495),
            "hbm_gbps": _datasheet(_H100, "HBM3, 3.35 TB/s", 3350),
            "pcie_gbps": (50, _PCIE5),
            "interconnect_gbps": _datasheet(_H100, "NVLink 900 GB/s both directions: 450 per direction", 450),
        },
        ("h100", "h100-sxm", "h100-80gb"),
    ),
    _entry(
        "H200",
        143771,
        (9, 0),
        HOPPER,
        {
            "bf16_tflops": _datasheet(_H200, "BF16 tensor 989 TF dense (1,979 with sparsity)", 989),
            "fp16_tflops": _datasheet(_H200, "FP16 tensor 989 TF dense (1,979 with sparsity)", 989),
            "fp32_tflops": _datasheet(_H200, "TF32 tensor 495 TF dense (989 with sparsity)", 495),
            "hbm_gbps": _datasheet(_H200, "141GB HBM3e, 4.8 TB/s", 4800),
            "pcie_gbps": (50, _PCIE5),
            "interconnect_gbps": _datasheet(_H200, "NVLink 900 GB/s both directions: 450 per direction", 450),
        },
        ("h200-141g", "h200-sxm"),
    ),
    _entry(
        "V100-16G",
        16384,
        (7, 0),
        VOLTA,
        {
            "bf16_tflops": (15.7, _NO_BF16.format(cc="7.0")),
            "fp16_tflops": _datasheet(_V100, "tensor performance 125 TF (fp16 in, fp32 accumulate)", 125),
            "fp32_tflops": _datasheet(_V100, "single precision 15.7 TF (no TF32 units)", 15.7),
            "hbm_gbps": _datasheet(_V100, "HBM2, 900 GB/s", 900),
            "pcie_gbps": (15.75, _PCIE3_RATE),
            "interconnect_gbps": _datasheet(_V100, "NVLink 300 GB/s both directions: 150 per direction", 150),
        },
        ("v100", "v100-16gb"),
    ),
    _entry(
        "V100-32G",
        32768,
        (7, 0),
        VOLTA,
        {
            "bf16_tflops": (15.7, _NO_BF16.format(cc="7.0")),
            "fp16_tflops": _datasheet(_V100, "tensor performance 125 TF (fp16 in, fp32 accumulate)", 125),
            "fp32_tflops": _datasheet(_V100, "single precision 15.7 TF (no TF32 units)", 15.7),
            "hbm_gbps": _datasheet(_V100, "HBM2, 900 GB/s", 900),
            "pcie_gbps": (15.75, _PCIE3_RATE),
            "interconnect_gbps": _datasheet(_V100, "NVLink 300 GB/s both directions: 150 per direction", 150),
        },
        ("v100-32gb",),
    ),
    _entry(
        "A10",
        23028,
        (8, 6),
        AMPERE_GA10X,
        {
            "bf16_tflops": _datasheet(
                "NVIDIA A10 Tensor Core GPU datasheet", "BF16 tensor 125 TF dense (250 with sparsity)", 125
            ),
            "fp16_tflops": _datasheet(
                "NVIDIA A10 Tensor Core GPU datasheet", "FP16 tensor 125 TF dense (250 with sparsity)", 125
            ),
            "fp32_tflops": _datasheet(
                "NVIDIA A10 Tensor Core GPU datasheet", "TF32 tensor 62.5 TF dense (125 with sparsity)", 62.5
            ),
            "hbm_gbps": _datasheet("NVIDIA A10 Tensor Core GPU datasheet", "GDDR6, 600 GB/s", 600),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": (25, _PCIE4_PEER),
        },
        ("a10-24g",),
    ),
    _entry(
        "A6000",
        49140,
        (8, 6),
        AMPERE_GA10X,
        {
            "bf16_tflops": _datasheet(
                "NVIDIA RTX A6000 datasheet", "tensor 309.7 TF with sparsity: 154.8 dense", 154.8
            ),
            "fp16_tflops": _datasheet(
                "NVIDIA RTX A6000 datasheet", "tensor 309.7 TF with sparsity: 154.8 dense", 154.8
            ),
            "fp32_tflops": (77.4, f"{_GA102}: TF32 tensor at half the dense FP16 rate (154.8 / 2)"),
            "hbm_gbps": _datasheet("NVIDIA RTX A6000 datasheet", "GDDR6, 768 GB/s", 768),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": (25, _PCIE4_PEER + " (the optional NVLink bridge is not assumed)"),
        },
        ("rtx-a6000",),
    ),
    _entry(
        "L4",
        23034,
        (8, 9),
        ADA,
        {
            "bf16_tflops": _datasheet(
                "NVIDIA L4 Tensor Core GPU datasheet", "BF16 tensor 242 TF with sparsity: 121 dense", 121
            ),
            "fp16_tflops": _datasheet(
                "NVIDIA L4 Tensor Core GPU datasheet", "FP16 tensor 242 TF with sparsity: 121 dense", 121
            ),
            "fp32_tflops": _datasheet(
                "NVIDIA L4 Tensor Core GPU datasheet", "TF32 tensor 120 TF with sparsity: 60 dense", 60
            ),
            "hbm_gbps": _datasheet("NVIDIA L4 Tensor Core GPU datasheet", "GDDR6, 300 GB/s", 300),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": (25, _PCIE4_PEER),
        },
        ("l4-24g",),
    ),
    _entry(
        "L40S",
        46068,
        (8, 9),
        ADA,
        {
            "bf16_tflops": _datasheet("NVIDIA L40S GPU datasheet", "BF16 tensor 733 TF with sparsity: 362 dense", 362),
            "fp16_tflops": _datasheet("NVIDIA L40S GPU datasheet", "FP16 tensor 733 TF with sparsity: 362 dense", 362),
            "fp32_tflops": _datasheet("NVIDIA L40S GPU datasheet", "TF32 tensor 366 TF with sparsity: 183 dense", 183),
            "hbm_gbps": _datasheet("NVIDIA L40S GPU datasheet", "GDDR6, 864 GB/s", 864),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": (25, _PCIE4_PEER),
        },
        ("l40s-48g",),
    ),
    _entry(
        "RTX-3090",
        24576,
        (8, 6),
        AMPERE_GA10X,
        {
            "bf16_tflops": (71, f"{_GA102}, GeForce RTX 3090: BF16 tensor with FP32 accumulate, 71 TF dense"),
            "fp16_tflops": (
                71,
                f"{_GA102}, GeForce RTX 3090: FP16 tensor with FP32 accumulate (what PyTorch's GEMMs use; GeForce runs "
                "it at half the FP16-accumulate rate), 71 TF dense",
            ),
            "fp32_tflops": (35.6, f"{_GA102}, GeForce RTX 3090: TF32 tensor 35.6 TF dense"),
            "hbm_gbps": (936, f"{_GA102}, GeForce RTX 3090: GDDR6X, 936 GB/s"),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": (25, _PCIE4_PEER),
        },
        ("3090", "rtx3090", "geforce-rtx-3090"),
    ),
    _entry(
        "RTX-4090",
        24564,
        (8, 9),
        ADA,
        {
            "bf16_tflops": (165, f"{_AD102}, GeForce RTX 4090: BF16 tensor with FP32 accumulate, 165.2 TF dense"),
            "fp16_tflops": (
                165,
                f"{_AD102}, GeForce RTX 4090: FP16 tensor with FP32 accumulate (what PyTorch's GEMMs use; GeForce runs "
                "it at half the FP16-accumulate rate), 165.2 TF dense",
            ),
            "fp32_tflops": (82.6, f"{_AD102}, GeForce RTX 4090: TF32 tensor 82.6 TF dense"),
            "hbm_gbps": (1008, f"{_AD102}, GeForce RTX 4090: GDDR6X, 1,008 GB/s"),
            "pcie_gbps": (25, _PCIE4),
            "interconnect_gbps": (25, _PCIE4_PEER),
        },
        ("4090", "rtx4090", "geforce-rtx-4090"),
    ),
    _entry(
        "T4",
        15360,
        (7, 5),
        TURING,
        {
            "bf16_tflops": (8.1, _NO_BF16.format(cc="7.5")),
            "fp16_tflops": _datasheet("NVIDIA T4 Tensor Core GPU datasheet", "mixed precision (FP16/FP32) 65 TF", 65),
            "fp32_tflops": _datasheet(
                "NVIDIA T4 Tensor Core GPU datasheet", "single precision 8.1 TF (no TF32 units)", 8.1
            ),
            "hbm_gbps": _datasheet("NVIDIA T4 Tensor Core GPU datasheet", "GDDR6, 320 GB/s", 320),
            "pcie_gbps": (15.75, _PCIE3_RATE),
            "interconnect_gbps": (12, f"{_PCIE3}: no NVLink, peer traffic over the host link (about 12 GB/s achieved)"),
        },
        ("tesla-t4",),
    ),
)

# Rates assumed when only ``--gpu-mem`` is given: an A100's. Memory comes from the user.
GENERIC_RATES = _GPUS[1]


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


_BY_KEY: dict[str, GPUSpec] = {}
for _gpu in _GPUS:
    for _alias in (_gpu.name, *_gpu.aliases):
        _BY_KEY[_key(_alias)] = _gpu


def gpu_names() -> list[str]:
    """Catalog names, in catalog order."""
    return [gpu.name for gpu in _GPUS]


def get_gpu(name: str) -> GPUSpec:
    """The catalog GPU called ``name`` (case and ``-``/``_`` insensitive, aliases allowed)."""
    found = _BY_KEY.get(_key(name))
    if found is None:
        close = difflib.get_close_matches(_key(name), list(_BY_KEY), n=3, cutoff=0.4)
        names = sorted({_BY_KEY[c].name for c in close})
        hint = f"; did you mean {', '.join(names)}?" if names else ""
        raise InputError(f"unknown GPU {name!r}{hint} Known: {', '.join(gpu_names())}")
    return found


GENERIC_PREFIX = "generic-"  # the name of a GPU known only by its memory


def generic_gpu(memory_bytes: int) -> GPUSpec:
    """A GPU known only by its memory: the catalog's A100 rates, the user's memory."""
    gib = memory_bytes / 2**30
    sources = dict(GENERIC_RATES.sources) | {"memory_bytes": "the user's --gpu-mem"}
    sources = {
        k: v if k == "memory_bytes" else f"{GENERIC_RATES.name}'s (a GPU known by its memory): {v}"
        for k, v in sources.items()
    }
    return replace(
        GENERIC_RATES,
        name=f"{GENERIC_PREFIX}{gib:g}G",
        memory_bytes=memory_bytes,
        aliases=(),
        sources=tuple(sorted(sources.items())),
    )


def _family(name: str) -> str:
    """The catalog name's model part: ``H100-80G`` -> ``h100``, ``RTX-4090`` -> ``4090``."""
    return _key(name).split("-")[1] if _key(name).startswith("rtx-") else _key(name).split("-")[0]


def gpu_for_device(device_name: str, total_memory_bytes: int) -> GPUSpec | None:
    """The catalog GPU that ``torch.cuda.get_device_name()`` and its total memory describe, or None.

    ``"NVIDIA H100 80GB HBM3"`` with 85,017,493,504 bytes is ``H100-80G``: the entries whose model name is a
    word of the device name, and of those the one whose memory is nearest to the device's.
    """
    words = set(device_name.lower().replace("_", " ").replace("-", " ").split())
    found = [gpu for gpu in _GPUS if _family(gpu.name) in words]
    if not found:
        return None
    return min(found, key=lambda gpu: abs(gpu.memory_bytes - total_memory_bytes))


def gpus_without_bf16() -> tuple[str, ...]:
    """Catalog names of the GPUs without bf16 arithmetic (compute capability under 8.0)."""
    return tuple(gpu.name for gpu in _GPUS if not gpu.has_bf16)


def bf16_refusal(gpu_name: str, compute_capability: tuple[int, int] | None) -> str:
    """The one line that refuses ``--dtype bf16`` on a GPU without bf16 arithmetic."""
    cc = f"compute capability {compute_capability[0]}.{compute_capability[1]}" if compute_capability else "its"
    return (
        f"--dtype bf16: {gpu_name} ({cc}) has no bf16 arithmetic (bf16 needs compute capability 8.0, Ampere or "
        "newer); use --dtype fp16 (mixed precision with loss scaling) or fp32"
    )

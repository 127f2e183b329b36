"""Seconds of one pass of a model from mechanisms: GPU work on a roofline, host work per launched kernel.

A pass (forward, backward, a decoding step) takes the longer of two clocks that run side by side:
- the GPU's: every matrix product at the rate its sizes reach (``matmul_efficiency`` of the dense peak,
  halved where its smallest dimension is ``matmul_half_dim``, never faster than its bytes over HBM nor
  shorter than ``kernel_floor_s``), the attention kernel, and the element-wise kernels' bytes over HBM at
  ``hbm_efficiency`` (all four from the GPU's catalog entry, per generation: each says where it comes from,
  ``planner gpus NAME`` and docs/gpus.md);
- the host's: every kernel costs ``host_s_per_kernel`` to issue from eager PyTorch (transformers' Python,
  the dispatcher, the launch), and DeepSpeed's per-tensor Python work counts in those units. That figure is the
  host CPU's (measured on the H100 host), not the GPU's: it is the same whichever GPU is planned for.
Small micro-batches are host-bound (opt-1.3b, 4 x 512 tokens on an H100: about 400 kernels take 16 ms to
issue, the GPU needs 10), large ones GPU-bound. Each pass reports its terms by name (``PassSeconds.terms``)
so a prediction can say which one dominates the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from search.coefficients import Coefficients
from search.model.kernels import Gemm
from store.records import DTYPE_BYTES, GPUSpec


@dataclass(frozen=True)
class PassSeconds:
    """Seconds of a pass on each clock, by term; the pass takes the longer clock."""

    gpu: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    serial: dict[str, float] = field(default_factory=dict)  # neither clock hides these (PCIe copies, CPU Adam)

    @property
    def seconds(self) -> float:
        return max(sum(self.gpu.values()), sum(self.host.values())) + sum(self.serial.values())

    @property
    def host_bound(self) -> bool:
        return sum(self.host.values()) > sum(self.gpu.values())

    @property
    def terms(self) -> dict[str, float]:
        """The seconds of the binding clock's terms and the serial ones (they add up to ``seconds``)."""
        return _sum(self.host if self.host_bound else self.gpu, self.serial)

    def __add__(self, other: PassSeconds) -> PassSeconds:
        return PassSeconds(_sum(self.gpu, other.gpu), _sum(self.host, other.host), _sum(self.serial, other.serial))


def _sum(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    out = dict(a)
    add_terms(out, b)
    return out


def add_terms(total: dict[str, float], terms: dict[str, float], factor: float = 1.0) -> None:
    """Accumulate ``terms`` (times ``factor``) into ``total`` in place."""
    for name, value in terms.items():
        total[name] = total.get(name, 0.0) + factor * value


def hbm_seconds(nbytes: float, gpu: GPUSpec) -> float:
    """Seconds to stream ``nbytes`` through HBM at the achieved bandwidth."""
    return nbytes / (gpu.hbm_gbps * 1e9 * gpu.hbm_efficiency)


def matmul_rate(smallest_dim: float, dtype: str, gpu: GPUSpec) -> float:
    """FLOP/s a matrix product whose smallest dimension is ``smallest_dim`` reaches."""
    fill = smallest_dim / (smallest_dim + gpu.matmul_half_dim)
    return gpu.tflops(dtype) * 1e12 * gpu.matmul_efficiency * fill


def gemm_seconds(gemm: Gemm, dtype: str, gpu: GPUSpec) -> float:
    """One matrix product on the roofline: its FLOPs at the rate its sizes reach, or its bytes over HBM."""
    d = DTYPE_BYTES[dtype]
    flops = gemm.flops / matmul_rate(min(gemm.m, gemm.n, gemm.k), dtype, gpu)
    traffic = hbm_seconds(d * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n), gpu)
    return max(flops, traffic, gpu.kernel_floor_s)


def backward_gemms(gemm: Gemm) -> tuple[Gemm, ...]:
    """The backward's products of one forward product: the input gradient, and the weight gradient when
    the weight trains (an (n x m) by (m x k) product over the tokens)."""
    dgrad = Gemm(gemm.m, gemm.k, gemm.n, gemm.trainable)
    if not gemm.trainable:
        return (dgrad,)
    return (dgrad, Gemm(gemm.n, gemm.k, gemm.m, True))


def host_seconds(kernels: float, coef: Coefficients) -> float:
    """Seconds the host needs to issue ``kernels`` kernels."""
    return kernels * coef.host_s_per_kernel

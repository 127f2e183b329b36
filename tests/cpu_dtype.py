"""The dtype the CPU tests compute in, asked of torch the way the fp16 skips ask DeepSpeed's accelerator.

bf16 where oneDNN has bf16 kernels for this processor (AVX512-BF16, AMX); fp32 elsewhere, where torch's
reference bf16 kernel makes every matmul about 75x slower (``probes.measure.cpu_support``). A test whose point is not
bf16 itself computes in ``CPU_DTYPE`` and predicts the dtype it ran; a test whose point is bf16 compute is
marked ``needs_fast_bf16`` (it skips, with the reason, where the kernels are missing) or keeps its shapes small
enough for the reference kernel. ``ONEDNN_MAX_CPU_ISA=AVX2`` simulates a processor without the kernels.
"""

from __future__ import annotations

import pytest

from probes.measure.cpu_support import cpu_bf16_is_fast

BF16_IS_FAST = cpu_bf16_is_fast()
CPU_DTYPE = "bf16" if BF16_IS_FAST else "fp32"
SLOW_BF16 = (
    "this processor has no oneDNN bf16 kernels (torch.ops.mkldnn._is_mkldnn_bf16_supported() is False): "
    "bf16 compute runs about 75x slower here"
)
needs_fast_bf16 = pytest.mark.skipif(not BF16_IS_FAST, reason=SLOW_BF16)

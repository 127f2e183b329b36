"""The host side of CPU optimizer offload, timed apart from training: ``python benchmarks/gpu/host_link.py OUT.json``.

What DeepSpeed's offloaded optimizer step does on the host and over the link, one operation at a time, on
``--gib`` GiB of 16-bit parameters (fp32 masters twice that), each the median of ``--repeat`` runs:

- ``pinned_h2d`` / ``pinned_d2h``: 16-bit bytes between pinned host memory and the GPU (the link's DMA rate);
- ``pageable_h2d`` / ``pageable_d2h``: the same from/to ordinary (pageable) host memory, which the CUDA driver
  stages through its own pinned buffers with a host copy;
- ``cast_fresh``: ``fp32.to(bfloat16)`` on the host into a new tensor (what torch's CPU-to-GPU ``copy_`` with a
  dtype change does first, ``aten/src/ATen/native/cuda/Copy.cu``), first touch of its pages included;
- ``cast_reused``: the same cast into a tensor allocated before (pages already touched);
- ``cross_copy``: ``gpu_bf16.copy_(cpu_fp32)``, stage3.py's ``_reassign_or_swap_out_partitioned_parameters``
  as it runs (cast into a temporary, then a pageable upload);
- ``mul_inplace``: ``cpu_fp32.mul_(s)``, stage3.py's ``unscale_and_clip_grads`` on the fp32 gradient.

Rates are bytes moved per second: the 16-bit bytes for copies and casts' outputs, fp32 read + write for
``mul_inplace``. On a machine without CUDA only the host rows run. Writes JSON and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch


def timed(run: Callable[[], object], repeat: int, cuda: bool) -> float:
    """Median seconds of ``run`` over ``repeat`` runs after one warm-up (synchronized on CUDA)."""
    times = []
    for index in range(repeat + 1):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        if index:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = int(args.gib * 2**30) // 2  # 16-bit elements
    cuda = torch.cuda.is_available()
    master = torch.randn(n, dtype=torch.float32)
    reused = torch.empty(n, dtype=torch.bfloat16)
    rows: dict[str, dict[str, float]] = {}

    def row(name: str, run: Callable[[], object], nbytes: float) -> None:
        seconds = timed(run, args.repeat, cuda)
        rows[name] = {"seconds": round(seconds, 6), "bytes": nbytes, "gbps": round(nbytes / seconds / 1e9, 3)}
        print(f"{name:14s} {seconds * 1e3:9.1f} ms {nbytes / seconds / 1e9:8.2f} GB/s", flush=True)

    row("cast_fresh", lambda: master.to(torch.bfloat16), 2 * n)
    row("cast_reused", lambda: reused.copy_(master), 2 * n)
    row("mul_inplace", lambda: master.mul_(1.0), 8 * n)
    if cuda:
        device = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
        pageable = torch.empty(n, dtype=torch.bfloat16)
        pageable.fill_(1.0)
        pinned.fill_(1.0)
        row("pinned_h2d", lambda: device.copy_(pinned, non_blocking=True), 2 * n)
        row("pinned_d2h", lambda: pinned.copy_(device, non_blocking=True), 2 * n)
        row("pageable_h2d", lambda: device.copy_(pageable), 2 * n)
        row("pageable_d2h", lambda: pageable.copy_(device), 2 * n)
        row("cross_copy", lambda: device.copy_(master), 2 * n)
    about = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "gib_16bit": args.gib,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"about": about, "rows": rows}, handle, indent=1)
    print(json.dumps(about))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

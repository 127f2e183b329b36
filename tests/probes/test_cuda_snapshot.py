"""The CUDA allocator's own history against memplan's reading of it (needs a CUDA device; skipped elsewhere).

A fresh process records ``torch.cuda.memory._record_memory_history`` from before its first CUDA allocation
through a small real workload: a tiny Llama built from its config (transformers, random weights) moved to
the GPU, two steps of forward, backward and AdamW, each followed by a 64 MiB scratch tensor (so that the
cache surely holds a free segment) and ``torch.cuda.empty_cache()``. It saves
``torch.cuda.memory._snapshot()`` with torch's own statistics. Then, here:

- :func:`store.cuda_snapshot.snapshot_to_stream` gives the stream whose live peak is torch's peak of
  requested bytes, whose EMPTY_CACHE events are the workload's calls, and :func:`reserved_peak` is
  ``max_memory_reserved()``;
- replayed through memplan's port of the caching allocator (``search.allocator.replay``, default settings:
  the process runs without ``PYTORCH_CUDA_ALLOC_CONF``), the stream gives the same peak reserved bytes and
  the same cudaMalloc sizes in the same order as the real allocator.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from store.alloc_stream import EMPTY_CACHE  # noqa: E402
from store.cuda_snapshot import reserved_peak, segment_events, snapshot_to_stream  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
WORKLOAD = """
import pickle, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.cuda.set_device(0)
torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1_000_000)
config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, vocab_size=256, max_position_embeddings=256)
torch.manual_seed(0)
model = LlamaForCausalLM(config).to("cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(STEPS):
    ids = torch.randint(3, 256, (2, 32), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss, ids
    scratch = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # its own segment, free below
    del scratch
    torch.cuda.empty_cache()
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
snapshot = torch.cuda.memory._snapshot()
with open(sys.argv[1], "wb") as handle:
    pickle.dump({"snapshot": snapshot, "max_reserved": torch.cuda.max_memory_reserved(),
                 "requested_peak": stats["requested_bytes.all.peak"]}, handle)
""".replace("STEPS", str(STEPS))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The snapshot and torch's statistics of the workload, run in a fresh process."""
    out = tmp_path_factory.mktemp("cuda-history") / "snapshot.pickle"
    env = {key: value for key, value in os.environ.items() if key != "PYTORCH_CUDA_ALLOC_CONF"}
    proc = subprocess.run(
        [sys.executable, "-c", WORKLOAD, str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with out.open("rb") as handle:
        data: dict[str, Any] = pickle.load(handle)
    return data


def test_the_stream_of_a_real_trace_keeps_requested_bytes_and_empty_cache(recorded: dict[str, Any]) -> None:
    snapshot = recorded["snapshot"]
    stream = snapshot_to_stream(snapshot)
    assert len(stream) > 100
    assert stream.live_peak() == recorded["requested_peak"]
    assert sum(op == EMPTY_CACHE for op, *_ in stream) == STEPS
    assert reserved_peak(snapshot) == recorded["max_reserved"]
    assert [a for a, _ in segment_events(snapshot)].count("segment_free") > 0


def test_a_replay_gives_the_real_allocators_reserved_peak_and_cuda_mallocs(
    recorded: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    allocator = pytest.importorskip("search.allocator")
    if not hasattr(allocator, "replay") or not hasattr(allocator, "CachingAllocator"):
        pytest.skip("search.allocator has no replay() yet")
    from search.allocator import AllocatorConfig, CachingAllocator, replay

    mallocs: list[int] = []
    original = CachingAllocator.alloc_block

    def logged(self: Any, p: Any, is_retry: bool) -> bool:
        done = original(self, p, is_retry)
        if done:
            mallocs.append(p.alloc_size)
        return done

    monkeypatch.setattr(CachingAllocator, "alloc_block", logged)
    snapshot = recorded["snapshot"]
    result = replay(snapshot_to_stream(snapshot), AllocatorConfig())
    assert not result.oom
    assert result.peak_reserved == reserved_peak(snapshot) == recorded["max_reserved"]
    assert mallocs == [size for action, size in segment_events(snapshot) if action == "segment_alloc"]

"""How much DeepSpeed's ``record_stream`` of ZeRO-3 gradients can add to a step's reserved memory (issue 46).

The built stream of a ZeRO-3 backward (:mod:`search.streams.build`) holds the top decoder layer's recompute and
backward and the gradients as the cost model's moments; autograd's parameter gradients of the layers below are
not separate requests in it. This script adds them, to bound what the allocator's ``record_stream`` rule
(:mod:`search.allocator.core`: a free with a pending use on another stream waits for its event) can do:

- below the top layer, each decoder layer's recompute and backward (the top layer's requests, repeated), then its
  parameters' gradients (bf16, each parameter's size from :func:`search.model.zero3_step.module_parameters`, in
  the backward's order), each made on the compute stream;
- DeepSpeed 0.19.8 ``runtime/zero/stage3.py``: ``reduce_independent_p_g_buckets_and_remove_grads`` flushes the
  bucket when the next gradient would overflow ``reduce_bucket_size`` (l. 1583-1585); ``__add_grad_to_ipg_bucket``
  copies a gradient that fits into the bucket on the reduction stream, ``record_stream``s it and drops it
  (l. 1621-1646: freed with a pending use); a gradient larger than the bucket is not copied and is freed the same
  way by ``partition_grads`` at its flush (l. 2048-2051);
- a gradient of bucket round ``j`` is copied behind flush ``j - 1``'s work, so its event has run once flush ``j``'s
  has; ``__reduce_and_partition_ipg_grads`` waits, before flush ``m``, for the oldest of more than
  ``max_param_reduce_events`` = 2 pending flush events (l. 462, 1663-1667), so flush ``m - 3`` has run by then:
  the stream says round ``m - 3``'s event has run at flush ``m`` (the latest torch could return those blocks: the
  bound), and every event at the backward's end (``independent_gradient_partition_epilogue`` synchronizes the
  reduction stream, l. 1414).

The job is the stored H200 loop row ``opt13_z3ckoff_mb8_s1024`` (its stream captured as ``planner.check``
replays it), replayed three ways: as built, with the lower layers' gradients freed at once (no ``record_stream``),
and freed pending, for the row's bucket (5e8 elements) and the probe's (hidden^2).

Usage: PYTHONPATH=. DS_ACCELERATOR=cpu .venv/bin/python benchmarks/zero3_record_stream_bound.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import search.step.replayed as replayed  # noqa: E402
from planner.calibration.records import compare_sft_row, load_records  # noqa: E402
from search.allocator import replay  # noqa: E402
from search.model.zero3_step import module_parameters  # noqa: E402
from store.alloc_stream import ALLOC, FREE, KIND_INDEX, PHASE, AllocStream, Event  # noqa: E402
from store.models import get_model  # noqa: E402

RECORDS = Path(__file__).resolve().parent.parent / "tests" / "data" / "gpu" / "h200-2026-11-26.json"
ROW = "opt13_z3ckoff_mb8_s1024"
BF16 = 2
ACTIVATIONS, GRADIENTS = KIND_INDEX["activations"], KIND_INDEX["gradients"]
RELEASED_AFTER_FLUSHES = 3  # max_param_reduce_events + 1: flush m waits for flush m - 3


def row_stream() -> tuple[AllocStream, dict[str, Any]]:
    """The row's built stream, as ``planner.check`` replays it (captured), and the row."""
    row = next(r for r in load_records(RECORDS)["sft"] if r["id"] == ROW)
    captured: list[AllocStream] = []

    def capture(stream: AllocStream, *args: Any, **kwargs: Any) -> Any:
        captured.append(stream)
        return replay(stream, *args, **kwargs)

    setattr(replayed, "replay", capture)  # noqa: B010 (the name search.step.replayed calls)
    try:
        compare_sft_row(row)
    finally:
        setattr(replayed, "replay", replay)  # noqa: B010
    return captured[0], row


def layer_gradients(model_name: str) -> tuple[int, list[int]]:
    """(layers, one decoder layer's parameter elements in the backward's order: the reverse of its module order)."""
    model = get_model(model_name)
    params = [numel for numel, _ in module_parameters(model)]
    per_layer = (len(params) - 2) // model.num_layers  # the token embedding and the learned positions first
    first = params[2 : 2 + per_layer]
    return model.num_layers, first[::-1]


class Bucket:
    """The ipg bucket's rounds and the events the stream names (round ``j``'s event is ``j + 1``)."""

    def __init__(self, elements: int) -> None:
        self.size, self.elements, self.round = elements, 0, 0
        self.oversize: list[int] = []  # keys of gradients over the bucket, freed at its flush

    def add(self, out: list[Event], key: int, numel: int, pending: bool) -> None:
        """A gradient's hook: flush first when it would overflow, then copy it (or keep it, when over the bucket)."""
        if self.elements + numel > self.size and self.elements > 0:
            self.flush(out, pending)
        self.elements += numel
        if numel <= self.size:
            out.append((FREE, key, self.round + 1 if pending else 0, 0, 0))
        else:
            self.oversize.append(key)

    def flush(self, out: list[Event], pending: bool) -> None:
        """``__reduce_and_partition_ipg_grads``: flush m has waited for flush m - 3; partition_grads frees the
        gradients over the bucket with their pending use."""
        if pending and self.round + 1 > RELEASED_AFTER_FLUSHES:
            out.append((4, self.round + 1 - RELEASED_AFTER_FLUSHES, 0, 0, 0))
        for key in self.oversize:
            out.append((FREE, key, self.round + 1 if pending else 0, 0, 0))
        self.oversize, self.elements, self.round = [], 0, self.round + 1


def with_lower_layers(stream: AllocStream, layers: int, grads: list[int], bucket: int, pending: bool) -> AllocStream:
    """``stream`` with, in each backward, the layers below the top one (recompute and backward as the top
    layer's requests, then the parameters' gradients through the bucket); ``pending``: freed with their use."""
    events = list(stream.events)
    key = max(e[1] for e in events if e[0] == ALLOC) + 1
    out: list[Event] = []
    i = 0
    while i < len(events):
        out.append(events[i])
        if events[i][0] != PHASE or stream.phases[events[i][1]] != "backward":
            i += 1
            continue
        start = next(j for j in range(i + 1, len(events)) if events[j][0] == ALLOC and events[j][4] == ACTIVATIONS)
        first = events[start][1]
        end = next(j for j in range(start, len(events)) if events[j][0] == FREE and events[j][1] == first)
        out.extend(events[i + 1 : end + 1])
        top = events[start : end + 1]
        ipg = Bucket(bucket)
        for _ in range(layers - 1):
            renamed: dict[int, int] = {}
            for op, k, size, on, kind in top:
                if op == ALLOC:
                    renamed[k], key = key, key + 1
                    out.append((ALLOC, renamed[k], size, on, kind))
                else:
                    out.append((op, renamed.get(k, k), size, on, kind))
            for numel in grads:
                out.append((ALLOC, key, numel * BF16, 0, GRADIENTS))
                ipg.add(out, key, numel, pending)
                key += 1
        i = end + 1
        while i < len(events) and events[i][0] != PHASE:
            out.append(events[i])
            i += 1
        ipg.flush(out, pending)  # the epilogue's flush, then its synchronize: every event has run
        if pending:
            out.append((4, ipg.round, 0, 0, 0))
    return AllocStream(tuple(out), stream.phases)


def most_pending(stream: AllocStream) -> int:
    """The most bytes freed with a pending use and not yet returned, at any point of ``stream``."""
    sizes: dict[int, int] = {}
    waiting: list[tuple[int, int]] = []  # (event, bytes)
    most = 0
    for op, k, size, _, _ in stream.events:
        if op == ALLOC:
            sizes[k] = size
        elif op == FREE and size:
            waiting.append((size, sizes.pop(k, 0)))
            most = max(most, sum(b for _, b in waiting))
        elif op == 4:
            waiting = [(e, b) for e, b in waiting if e > k]
    return most


def main() -> int:
    stream, row = row_stream()
    model = get_model(row["workload"]["model"])
    layers, grads = layer_gradients(row["workload"]["model"])
    measured = row["measured"]["peak_reserved_bytes"]
    mib = 2**20
    print(f"{ROW}: measured peak reserved {measured / mib:,.0f} MiB")
    print(f"  as built: {replay(stream).peak_reserved / mib:,.0f} MiB")
    for bucket in (int(row["ds_config"]["zero_optimization"].get("reduce_bucket_size", 5e8)), model.hidden_size**2):
        for pending in (False, True):
            built = with_lower_layers(stream, layers, grads, bucket, pending)
            result = replay(built)
            print(
                f"  bucket {bucket:>11,} elements, lower layers' gradients {'pending' if pending else 'freed  '}: "
                f"{result.peak_reserved / mib:,.0f} MiB reserved, {result.peak_allocated / mib:,.0f} MiB allocated, "
                f"at most {most_pending(built) / mib:,.0f} MiB pending"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

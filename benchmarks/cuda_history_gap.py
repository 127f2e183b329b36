"""Why a CUDA probe's peak reserved differs from the prediction: its recorded allocator history against the
stream memplan builds, both replayed through memplan's port of the caching allocator.

A CUDA probe (``planner probe --device cuda``) keeps the caching allocator's history
(``torch.cuda.memory._record_memory_history``) and its snapshot. This reads one probe from a memplan store
and prints:

1. **Peaks**: measured (the probe's phases), the recorded sequence replayed through
   :func:`search.allocator.replay` (on its real streams, and with every request on the default stream),
   and the stream the cost model builds for the same job and strategy
   (:func:`search.step.replayed.stream_of`). When the recorded replay meets the measured reserved peak, the
   allocator model is right and the built stream is what differs. Then the same per phase (a check of the
   phase cut: the recorded replay's phase peaks should be the measured ones).
2. **cudaMallocs by step and phase** in both replays: where reserved memory grows, with the request that
   made each large segment (the recorded trace is cut into steps at the input ids' allocation, and into
   phases at the host-time pauses of the probe's phase synchronizes; unmeasured steps are aligned on the
   first measured one); then, for each large cudaMalloc that a cached segment could have served had a few
   live blocks not split it, those blocks (oldest first).
3. **What-ifs**, each replayed: the recorded sequence with its late never-freed 1-64 MiB allocations (the
   cuBLAS workspaces) made first, or without the forward's / backward's temporaries; the built stream (which
   makes the cuBLAS workspaces where torch makes them since this analysis: ``search.streams.workspaces``), or
   (``--temp-sizes-mib``) with a same-size temporary before each forward activation of the sizes.
4. **Allocations of one steady step, by size and phase** (``--step``, default 2, the first measured one):
   counts and bytes per request size in the recorded and the built stream, the largest differences first,
   split into tensors freed within the phase (``temp``) and tensors that outlive it (``kept``).

Findings for the 2026-11-27 H200 probes: ``benchmarks/results/cuda_history_gap.md``.

Single-model SFT-style probes with ``grad_accum`` 1 (one forward, backward and optimizer step per step).

Usage: DS_ACCELERATOR=cpu .venv/bin/python benchmarks/cuda_history_gap.py --db /tmp/h200/probes2.db \\
           --probe-id e6120cff3ecb [--step 2] [--rows 10] [--temp-sizes-mib 128]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cuda_history_windows import (  # noqa: E402
    BIG_SEGMENT,
    PHASES,
    STEP,
    Malloc,
    Window,
    built_with_forward_temporaries,
    hoisted,
    late_persistent,
    replay_windows,
    size_differences,
    step_allocations,
    without_temporaries,
)
from search.allocator import AllocatorConfig, replay  # noqa: E402
from store.alloc_stream import AllocStream  # noqa: E402
from store.cuda_snapshot import device_trace, reserved_peak, snapshot_to_stream  # noqa: E402

GiB, MiB = 2**30, 2**20
SLACK_MS = 5.0  # widening of the window in which a measured phase boundary is looked for
SIGNATURE = 6  # trace entries either side of a phase boundary compared when aligning an unmeasured step


# --- reading a probe ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One stored CUDA probe: its request and result (the JSON shapes) and its allocator snapshot."""

    probe_id: str
    request: dict[str, Any]
    result: dict[str, Any]
    snapshot: dict[str, Any]


def load_probe(db: str, probe_id: str) -> Probe:
    """The probe ``probe_id`` (or a unique prefix) of the store ``db``, with its CUDA snapshot."""
    from store.artifacts import CUDA_SNAPSHOT, unpack_snapshot
    from store.db import open_storage

    with open_storage(db) as storage:
        record = storage.get_probe(probe_id)
        artifact = storage.load_probe_artifact(record.probe_id, CUDA_SNAPSHOT)
    if artifact is None:
        raise SystemExit(f"probe {record.probe_id} kept no CUDA snapshot (a CPU probe, or history was off)")
    return Probe(record.probe_id, record.request.to_dict(), record.result.to_dict(), unpack_snapshot(artifact.data))


# --- the recorded trace, cut into steps and phases ---------------------------------------------------------


def _ids_size(request: dict[str, Any]) -> int:
    """Bytes of the probe's input ids (int64, micro_batch x seq_len): the first allocation of each step."""
    return 8 * int(request["strategy"]["micro_batch"]) * int(request["workload"]["seq_len"])


def step_bounds(trace: Sequence[dict[str, Any]], ids_size: int, steps: int) -> list[tuple[int, int]]:
    """(first, last) trace index of each step: the input ids are allocated first and freed last, so a step
    is the life of one of the ``steps`` longest-lived allocations of that size."""
    born: dict[int, int] = {}
    lives: list[tuple[int, int]] = []
    for i, entry in enumerate(trace):
        action = entry["action"]
        if action == "alloc" and entry["size"] == ids_size:
            born[entry["addr"]] = i
        elif action == "free_completed" and entry["addr"] in born:
            lives.append((born.pop(entry["addr"]), i))
    lives.extend((start, len(trace) - 1) for start in born.values())
    longest = sorted(lives, key=lambda life: life[1] - life[0], reverse=True)[:steps]
    return sorted(longest)


def _signature(trace: Sequence[dict[str, Any]], i: int) -> tuple[tuple[str, int], ...]:
    return tuple(
        (trace[j]["action"], int(trace[j]["size"])) for j in range(i - SIGNATURE, i + SIGNATURE) if 0 <= j < len(trace)
    )


def phase_markers(probe: Probe) -> list[tuple[int, str]]:
    """(trace index, name) of every step and phase start of the recorded trace.

    Each phase of the probe ends on a device synchronize and the next starts after the clock's own calls, so
    the host's timestamps jump at a boundary: in a measured step, the backward (optimizer step) starts after
    the longest pause between entries within ``SLACK_MS`` of the shortest to the longest measured forward
    (backward) after the phase's start (``extra["phase_time_s"]`` holds each phase's times sorted, not by
    step). The warm-up and profiled steps run other code on their first calls: their boundaries are the
    entries whose neighbourhood matches the first measured step's boundary, at the nearest offset from the
    step's start.
    """
    trace = device_trace(probe.snapshot)
    extra = probe.result.get("extra", {})
    warmup = int(extra.get("warmup_steps", 1))
    times: dict[str, list[float]] = extra.get("phase_time_s", {})
    measured = len(times.get("forward", []))
    steps = warmup + measured + (1 if "profile" in extra else 0)
    bounds = step_bounds(trace, _ids_size(probe.request), steps)
    timed: dict[int, list[int]] = {}
    for n in range(warmup, min(warmup + measured, len(bounds))):
        start, end = bounds[n]
        cuts = []
        for name in PHASES[:-1]:
            t0 = trace[start]["time_us"]
            low = t0 + (min(times[name]) * 1e3 - SLACK_MS) * 1e3
            high = t0 + (max(times[name]) * 1e3 + SLACK_MS) * 1e3
            inside = [j for j in range(start + 1, end + 1) if low <= trace[j]["time_us"] <= high]
            start = max(inside, key=lambda j: trace[j]["time_us"] - trace[j - 1]["time_us"])
            cuts.append(start)
        timed[n] = cuts
    markers: list[tuple[int, str]] = [(0, "setup")]
    reference = min(timed) if timed else None
    for n, (start, end) in enumerate(bounds):
        found = timed.get(n)
        if found is None and reference is not None:
            found = [_align(trace, start, end, c, bounds[reference][0]) for c in timed[reference]]
        markers += [(start, f"{STEP}{n + 1}"), (start + 1, PHASES[0])]
        markers += [(cut, name) for cut, name in zip(found or [], PHASES[1:], strict=False)]
    return markers


def _align(trace: Sequence[dict[str, Any]], start: int, end: int, cut: int, ref_start: int) -> int:
    """The entry of [start, end] that plays the part of ``cut`` in the reference step starting at ``ref_start``."""
    wanted, offset = _signature(trace, cut), cut - ref_start
    matches = [j for j in range(start, end + 1) if _signature(trace, j) == wanted]
    if not matches:
        return min(end, start + offset)
    return min(matches, key=lambda j: abs(j - start - offset))


def recorded_stream(probe: Probe) -> AllocStream:
    """The probe's recorded sequence as a stream with step and phase markers
    (:func:`store.cuda_snapshot.snapshot_to_stream`, which reads ``snapshot["memplan"]["phases"]``)."""
    marked = dict(probe.snapshot)
    marked["memplan"] = {"phases": [[index, name] for index, name in phase_markers(probe)]}
    return snapshot_to_stream(marked)


# --- the stream the cost model builds --------------------------------------------------------------------


def built_stream(probe: Probe) -> AllocStream:
    """The allocation stream memplan builds for the probe's job and strategy (what ``planner predict`` and
    ``compare_probe`` replay), with the default coefficients."""
    from planner.calibration.records import _catalog_gpu, _probe_job
    from planner.planning.predicting import batch_of_job, job_spec, resolve, with_batch_of
    from search.coefficients import DEFAULT_COEFFICIENTS
    from search.predictor import _step
    from search.step.replayed import stream_of
    from store.records import Strategy

    request = probe.request
    resolved = resolve(
        job_spec(request["workload"]["model"], _probe_job(request, _catalog_gpu(probe.result["fingerprint"])))
    )
    strategy = Strategy.from_dict(batch_of_job(resolved, dict(request["strategy"])))
    resolved = with_batch_of(resolved, strategy, given=False)
    step = _step(resolved.workload, strategy, resolved.hardware, DEFAULT_COEFFICIENTS)
    return stream_of(step, strategy.empty_cache)


# --- printing ------------------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def _size(n: int) -> str:
    return f"{n / MiB:.2f} MiB" if n >= MiB else f"{n} B"


def _new_segments(mallocs: Iterable[Malloc]) -> str:
    found = list(mallocs)
    big = [m for m in found if m.segment >= BIG_SEGMENT]
    small = [m for m in found if m.segment < BIG_SEGMENT]
    parts = [f"{m.segment / MiB:.0f} MiB for {_size(m.made.size)}{' (side stream)' if m.stream else ''}" for m in big]
    if small:
        parts.append(f"{len(small)} x <{BIG_SEGMENT // MiB} MiB = {sum(m.segment for m in small) / MiB:.0f} MiB")
    return "; ".join(parts) or "-"


def print_peaks(probe: Probe, recorded: AllocStream, built: AllocStream) -> None:
    measured_alloc = max(p["peak_allocated_bytes"] for p in probe.result["phases"])
    measured_res = max(p["peak_reserved_bytes"] for p in probe.result["phases"])
    rows = [("measured (probe phases)", measured_alloc, measured_res)]
    rows.append(("history's segment events", 0, reserved_peak(probe.snapshot)))
    for name, stream in (
        ("recorded, replayed", recorded),
        ("recorded, replayed on one stream", recorded.on_one_stream()),
        ("built (cost model), replayed", built),
    ):
        r = replay(stream, AllocatorConfig())
        rows.append((name, r.peak_allocated, r.peak_reserved))
    print("| sequence | peak allocated GiB | peak reserved GiB | reserved vs measured |")
    print("|---|---|---|---|")
    for name, allocated, reserved in rows:
        print(
            f"| {name} | {_gib(allocated) if allocated else '-'} | {_gib(reserved)} | "
            f"{reserved / measured_res - 1:+.1%} |"
        )


def print_phase_peaks(probe: Probe, recorded: list[Window], built: list[Window]) -> None:
    """Per phase, the measured peaks (the probe resets them at each phase start) beside both replays' over the
    measured steps (recorded: the probe's; built: all but its warm-up step): a check of the phase cut."""
    warmup = int(probe.result.get("extra", {}).get("warmup_steps", 1))
    measured = len(probe.result.get("extra", {}).get("phase_time_s", {}).get("forward", []))

    def peak(windows: list[Window], name: str, steps: range) -> tuple[int, int]:
        runs = [w for w in windows if w.phase == name and w.step in steps]
        return max((w.peak_allocated for w in runs), default=0), max((w.peak_reserved for w in runs), default=0)

    print("| phase | measured allocated / reserved GiB | recorded replay | built replay |")
    print("|---|---|---|---|")
    for phase in probe.result["phases"]:
        name = phase["name"]
        ra, rr = peak(recorded, name, range(warmup + 1, warmup + measured + 1))
        ba, br = peak(built, name, range(2, 100))
        print(
            f"| {name} | {_gib(phase['peak_allocated_bytes'])} / {_gib(phase['peak_reserved_bytes'])} | "
            f"{_gib(ra)} / {_gib(rr)} | {_gib(ba)} / {_gib(br)} |"
        )


def print_what_ifs(recorded: AllocStream, built: AllocStream, temp_sizes: Sequence[int]) -> None:
    late = late_persistent(recorded)
    sizes = ", ".join(_size(recorded.events[i][2]) for i in late) or "none"
    variants: list[tuple[str, AllocStream]] = [
        ("recorded", recorded),
        (f"recorded, late persistent allocations ({sizes}) made first", hoisted(recorded, late)),
        ("recorded without forward/backward temporaries < 256 MiB", without_temporaries(recorded)),
        ("recorded without forward temporaries < 256 MiB", without_temporaries(recorded, PHASES[:1])),
        ("recorded without backward temporaries < 256 MiB", without_temporaries(recorded, PHASES[1:2])),
        ("built (its cuBLAS workspaces placed by search.streams.workspaces)", built),
    ]
    if temp_sizes:
        shown = ", ".join(_size(n) for n in temp_sizes)
        variants.append(
            (
                f"built, a temporary before each forward activation of {shown}",
                built_with_forward_temporaries(built, temp_sizes),
            )
        )
    print("| what-if (replayed) | peak reserved GiB | peak allocated GiB |")
    print("|---|---|---|")
    for name, stream in variants:
        r = replay(stream, AllocatorConfig())
        print(f"| {name} | {_gib(r.peak_reserved)} | {_gib(r.peak_allocated)} |")


def print_blockers(windows: list[Window], label: str, most: int = 4) -> None:
    """Each large cudaMalloc after the setup that a cached segment of the right size could have served had
    a few live blocks (at most half its bytes) not split it: those blocks, the oldest first."""
    for w in windows:
        for m in w.mallocs:
            split = [b for b in m.blocked if 2 * sum(x.size for x in b.blockers) <= b.segment]
            if m.segment < BIG_SEGMENT or w.step == 0 or not split:
                continue
            where = f"step {m.made.step} {m.made.phase}"
            print(f"- {label}, {where}: {_size(m.made.size)} -> new {m.segment / MiB:.0f} MiB segment; cached:")
            for b in split:
                live = sorted(b.blockers, key=lambda x: x.event)  # the oldest first: what stayed longest
                shown = ", ".join(f"{_size(x.size)} (step {x.step} {x.phase})" for x in live[:most])
                more = f" and {len(live) - most} more" if len(live) > most else ""
                print(
                    f"  - a {b.segment / MiB:.0f} MiB segment, largest free block {b.free / MiB:.1f} MiB, split by "
                    f"{len(live)} live block(s) of {sum(x.size for x in live) / MiB:.1f} MiB: {shown}{more}"
                )


def print_mallocs(recorded: list[Window], built: list[Window]) -> None:
    def keyed(windows: list[Window]) -> dict[tuple[int, str], Window]:
        return {(w.step, w.phase): w for w in windows}

    rec, bui = keyed(recorded), keyed(built)
    keys = sorted(set(rec) | set(bui), key=lambda k: (k[0], PHASES.index(k[1]) if k[1] in PHASES else -1))
    print(
        "| step | phase | recorded: new segments | recorded reserved at end GiB | built: new segments | "
        "built reserved at end GiB |"
    )
    print("|---|---|---|---|---|---|")
    for key in keys:
        r, b = rec.get(key), bui.get(key)
        if not (r is not None and r.mallocs) and not (b is not None and b.mallocs):
            continue  # neither replay made a segment here
        print(
            f"| {key[0]} | {key[1]} | {_new_segments(r.mallocs) if r else 'n/a'} | "
            f"{_gib(r.end_reserved) if r else '-'} | "
            f"{_new_segments(b.mallocs) if b else 'n/a'} | {_gib(b.end_reserved) if b else '-'} |"
        )


def print_sizes(recorded: AllocStream, built: AllocStream, step: int, rows: int) -> None:
    rec, bui = step_allocations(recorded, step), step_allocations(built, step)
    print("| phase | size | stream | temp/kept | recorded count | built count | recorded - built |")
    print("|---|---|---|---|---|---|---|")
    for phase in PHASES:
        for size, s, how, nr, nb in size_differences(rec.get(phase, Counter()), bui.get(phase, Counter()))[:rows]:
            print(f"| {phase} | {_size(size)} | {s} | {how} | {nr} | {nb} | {(nr - nb) * size / MiB:+.0f} MiB |")
        r_total = sum(size * n for (size, _, _), n in rec.get(phase, Counter()).items())
        b_total = sum(size * n for (size, _, _), n in bui.get(phase, Counter()).items())
        r_count, b_count = sum(rec.get(phase, Counter()).values()), sum(bui.get(phase, Counter()).values())
        print(
            f"| {phase} | all | | | {r_count} ({_gib(r_total)} GiB) | {b_count} ({_gib(b_total)} GiB) | "
            f"{(r_total - b_total) / GiB:+.2f} GiB |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="memplan store (SQLite file) holding the probe")
    parser.add_argument("--probe-id", required=True, help="probe id or unique prefix (a CUDA probe)")
    parser.add_argument("--step", type=int, default=2, help="step whose allocations are compared by size")
    parser.add_argument("--rows", type=int, default=10, help="size rows per phase in the last table")
    parser.add_argument(
        "--temp-sizes-mib",
        nargs="*",
        default=(),
        help="what-if: a same-size temporary before each built forward activation of these sizes (MiB)",
    )
    args = parser.parse_args()
    probe = load_probe(args.db, args.probe_id)
    w, s = probe.request["workload"], probe.request["strategy"]
    print(
        f"probe {probe.probe_id}: {w['kind']} {w['model']}, ZeRO-{s.get('zero_stage')}, {s.get('micro_batch')} x "
        f"{w['seq_len']} tokens, {probe.result['fingerprint'].get('name')}\n"
    )
    recorded, built = recorded_stream(probe), built_stream(probe)
    print_peaks(probe, recorded, built)
    print()
    rec_windows, built_windows = replay_windows(recorded), replay_windows(built)
    print_phase_peaks(probe, rec_windows, built_windows)
    print()
    print_mallocs(rec_windows, built_windows)
    print("(phase runs where neither replay made a segment are left out)\n")
    print_blockers(rec_windows, "recorded")
    print_blockers(built_windows, "built")
    print()
    print_what_ifs(recorded, built, [int(float(n) * MiB) for n in args.temp_sizes_mib])
    print()
    print_sizes(recorded, built, args.step, args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

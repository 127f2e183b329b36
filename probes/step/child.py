"""The probe child: ``python -m probes.step.child DIR`` runs the request in ``DIR/request.json`` and reports.

Reads top to bottom: report ``startup`` and import torch and deepspeed (the parent set the environment
first, see :mod:`probes.process.isolation`), join the one-rank process group, report the fingerprint, rebuild
the records, start the CPU tracker (it counts everything built from here on, plus what already exists),
report ``setup`` and build the models and engines, then run ``steps`` steps of the workload's phases
(:mod:`probes.step.phases`): the first one or, with ZeRO-3, two are warm-up (:mod:`probes.step.warmup`), the rest
measured, their time spread in ``extra["step_time_s"]`` and ``extra["phase_time_s"]``; with
``MEMPLAN_PROFILE=1`` one more step, not measured, runs under the profiler (:mod:`probes.step.profile`,
``extra["profile"]``). Any exception
becomes the outcome: ``oom`` for a CUDA out-of-memory, the tracker's cap (ProbeOOM) or the host
allocator's failure, else ``error`` (type and first line of the message); the phase running then is
``failed_phase``. The child writes ``result.json`` and leaves with ``os._exit`` (DeepSpeed's and gloo's
teardown can hang; nothing is left to flush). It ends, with its helpers, when the planner dies
(:mod:`probes.process.parent_watch`).

Allocation records (:mod:`probes.process.artifacts`), kept whatever the outcome: a CPU probe's tracker records the
allocation stream (``setup`` is marked before the build, the clock marks the phases and steps); a CUDA
probe records the caching allocator's history from before the build and takes ``_snapshot()`` at the end.
Each is written to ``DIR/artifact.<name>`` and listed in ``extra["artifacts"]`` for the parent to keep.

One rank of a group (:mod:`probes.process.rank_group`: WORLD_SIZE above 1, set by the launcher) joins the group's
process group, uses the CUDA device of its LOCAL_RANK, announces its pid first and writes everything above
in ``DIR/rank<RANK>/`` instead of ``DIR``; it exits 1 after a failure (the launcher then ends the others).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from probes.process.artifacts import Recording, cpu_stream_enabled, start_cuda_history
from probes.process.isolation import EVENTS_FILE, REQUEST_FILE, RESULT_FILE
from store.measurements import ProbeRequest, ProbeResult

FINGERPRINT: list[Any] = []  # the fingerprint taken at startup (reused in the result)
RECORDING = Recording()  # what this probe records of its allocations (written whatever the outcome)
OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def rss_peak_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class Reporter:
    """Appends the child's events to ``events.jsonl`` (one flushed line each) for the parent to read."""

    def __init__(self, folder: Path) -> None:
        self.handle = (folder / EVENTS_FILE).open("a", encoding="utf-8")
        self.start = time.perf_counter()
        self.phase: str | None = None

    def event(self, **data: Any) -> None:
        self.handle.write(json.dumps(data) + "\n")
        self.handle.flush()

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.event(phase=phase, t=round(time.perf_counter() - self.start, 4), rss=rss_peak_bytes())


def is_oom(exc: BaseException) -> bool:
    """A CUDA OOM, the tracker's cap, a MemoryError or the CPU allocator's failure, anywhere in the chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or type(current).__name__ in ("OutOfMemoryError", "ProbeOOM"):
            return True
        text = str(current).lower()
        if any(marker in text for marker in OOM_MARKERS) or "probe memory cap" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def run(request: ProbeRequest, reporter: Reporter, extra: dict[str, Any]) -> tuple[list[Any], int]:
    """Run the probe; returns (phase measurements, layers run). Raises whatever the probe raised."""
    reporter.enter("startup")
    from probes.process.jit_lock import install

    # before DeepSpeed loads an op: a lock this process leaves names it (probes.process.jit_lock). Ranks of one probe
    # wait on each other's lock as a rule, so a wait is an event here, not a phase a failure would be charged to
    install(on_wait=lambda lock: reporter.event(waiting_on=str(lock)))
    from probes.process.cpu_info import cache_cpu_info

    cache_cpu_info()  # DeepSpeed's op loads ask py-cpuinfo, which starts a process each time
    import deepspeed
    import torch

    from probes.measure.fingerprint import fingerprint
    from probes.model.build import plan_from_request

    device = request.device
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device cuda asked for, but torch sees no CUDA device")
        torch.cuda.set_device(RANK.local)
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    FINGERPRINT.append(fingerprint(device))
    reporter.event(fingerprint=FINGERPRINT[-1].to_dict())
    plan = plan_from_request(request)
    extra["layers_run"] = plan.layers
    extra["attn_impl"] = plan.workload.attn_impl
    if device == "cpu" and plan.workload.attn_impl == "flash_attention_2":
        extra["attn_impl"] = "sdpa"
        extra["attn_impl_note"] = "flash_attention_2 needs CUDA: the CPU probe ran sdpa"
    if device == "cuda":
        extra["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")

    tracker = None
    if device == "cpu":
        from probes.measure.tracker import LiveTensorTracker

        tracker = LiveTensorTracker(cap_bytes=request.memory_cap_bytes, record_stream=cpu_stream_enabled())
        RECORDING.tracker = tracker
    elif start_cuda_history():
        RECORDING.cuda = True
    with tracker if tracker is not None else contextlib.nullcontext():
        if tracker is not None:
            extra["bytes_before_setup"] = tracker.track_existing()
            tracker.mark_phase("setup")
        reporter.enter("setup")
        setup_start = time.perf_counter()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        runner = _build(plan, extra)
        extra["setup_s"] = round(time.perf_counter() - setup_start, 3)
        if tracker is not None:
            extra["resident_bytes"] = tracker.current
            extra["setup_peak_bytes"] = tracker.peak
        else:
            extra["resident_bytes"] = torch.cuda.memory_allocated()
            extra["setup_peak_bytes"] = torch.cuda.max_memory_allocated()

        clock = _run_steps(runner, plan, request, tracker, extra, reporter)
        return clock.measurements(), plan.layers


def _run_steps(
    runner: Any, plan: Any, request: ProbeRequest, tracker: Any, extra: dict[str, Any], reporter: Reporter
) -> Any:
    """The warm-up and timed steps on the phase clock (and the profiled step where asked); returns the clock."""
    from probes.step.phases import PhaseClock
    from probes.step.profile import profile_enabled
    from probes.step.warmup import trace_complete, warmup_steps

    device = request.device
    clock = PhaseClock(device, plan.strategy.empty_cache, tracker, on_phase=reporter.enter)
    warmup, note = warmup_steps(plan.strategy, request.steps)
    if note:
        extra["warmup_note"] = note
    try:
        for index in range(request.steps):
            if index == warmup:
                traces = trace_complete(_engines(runner))
                if traces:
                    extra["zero3_trace_complete"] = traces
            clock.start_step(measured=index >= warmup)
            runner.step(clock)
            clock.finish_step(measured=index >= warmup)
        if profile_enabled():
            extra["profile"] = _profiled_step(runner, clock, device)
    finally:
        if tracker is not None:
            with contextlib.suppress(Exception):  # best-effort labels, never the outcome
                tracker.label_kinds()  # while the engines are alive: parameters, gradients, optimizer states
    extra.update(measured_steps=clock.measured_steps, warmup_steps=warmup, empty_cache_calls=clock.cache_calls)
    extra.update(clock.spread())
    return clock


def _profiled_step(runner: Any, clock: Any, device: str) -> dict[str, Any]:
    """One more step, not measured, each phase under the profiler (:mod:`probes.step.profile`)."""
    from probes.step.profile import PhaseProfiler

    profiler = PhaseProfiler(device)
    clock.profiler = profiler
    try:
        clock.start_step(measured=False)
        runner.step(clock)
        clock.finish_step(measured=False)
    finally:
        clock.profiler = None
    return profiler.phases


def _engines(runner: Any) -> dict[str, Any]:
    """The runner's DeepSpeed engines by role (``model`` is a single-model run's trained engine)."""
    names = {"model": "engine", "reference": "reference", "actor": "actor", "critic": "critic", "reward": "reward"}
    return {role: getattr(runner, name, None) for role, name in names.items()}


def _build(plan: Any, extra: dict[str, Any]) -> Any:
    if plan.workload.is_rlhf:
        from probes.step.phases_rlhf import RLHFRun

        return RLHFRun(plan, extra)
    from probes.step.phases_sft import SingleModelRun

    return SingleModelRun(plan, extra)


class Rank:
    """This process's place in its group, from the launcher's environment (one rank: 0 of 1)."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.rank = int(env.get("RANK", "0"))
        self.local = int(env.get("LOCAL_RANK", "0"))
        self.world = int(env.get("WORLD_SIZE", "1"))

    def folder(self, folder: Path) -> Path:
        """Where this rank writes: ``folder`` alone, ``folder/rank<r>`` in a group
        (:mod:`probes.process.rank_group`)."""
        return folder if self.world == 1 else folder / f"rank{self.rank}"


RANK = Rank()


def main(folder: Path) -> int:
    request = ProbeRequest.from_dict(json.loads((folder / REQUEST_FILE).read_text(encoding="utf-8")))
    folder = RANK.folder(folder)
    folder.mkdir(exist_ok=True)
    reporter = Reporter(folder)
    extra: dict[str, Any] = {}
    if RANK.world > 1:
        reporter.event(pid=os.getpid(), rank=RANK.rank)
        extra.update(rank=RANK.rank, world_size=RANK.world)
    start = time.perf_counter()
    phases: list[Any] = []
    layers = None
    try:
        phases, layers = run(request, reporter, extra)
        outcome, failed, message = "ok", None, ""
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the probe's outcome
        outcome = "oom" if is_oom(exc) else "error"
        failed, message = reporter.phase, describe(exc)
        extra["traceback"] = traceback.format_exc()[-4000:]
        layers = extra.get("layers_run")
    RECORDING.write(folder, extra)
    from probes.measure.fingerprint import host_fingerprint

    print_ = FINGERPRINT[-1] if FINGERPRINT else host_fingerprint(request.device)
    result = ProbeResult(
        outcome=outcome,
        phases=tuple(phases),
        failed_phase=failed,
        message=message,
        host_rss_peak_bytes=rss_peak_bytes(),
        wall_s=time.perf_counter() - start,
        fingerprint=print_,
        layers=layers,
        extra=_jsonable(extra),
    )
    temporary = folder / (RESULT_FILE + ".tmp")
    temporary.write_text(json.dumps(result.to_dict()), encoding="utf-8")
    temporary.replace(folder / RESULT_FILE)
    return 1 if RANK.world > 1 and outcome != "ok" else 0  # a failed rank ends its group's launcher too


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(data, default=str))


if __name__ == "__main__":
    from probes.process.parent_watch import watch_parent

    watch_parent()  # this process and its helpers end with the planner, however it ends
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

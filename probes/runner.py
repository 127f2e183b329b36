"""``run_probe``: one probe in its own process, its outcome as a ProbeResult.

The request is checked here first (:func:`probes.model.build.plan_from_request`: bad input, and requests for
more than one node or for more CPU ranks than the backend runs, come back as outcome "error" without
starting anything). Then the DeepSpeed ops the
probe will load are built, once per process and before the probe's clock and timeout start
(:func:`probes.ops.prepare.prepare_ops`; a caller that probes many strategies may call it first for all of them).
An op that cannot be built raises OpBuildError, one line for the whole run: no probe can run without it,
and no "error" outcome is stored for one probe after another. Then a fresh child process
(:mod:`probes.process.isolation`, :mod:`probes.step.child`) builds the models and engines and runs the steps; a fresh
process per probe is what keeps DeepSpeed's global state (process group, ZeRO-3 hooks, the accelerator,
compiled ops) from leaking between probes. Outcomes:

- ``ok``: the child ran every step and measured its phases;
- ``oom``: a CUDA out-of-memory, the CPU tracker's ``memory_cap_bytes``, or the host allocator failing;
- ``error``: any other exception (message: its type and first line), or a child that died without a
  report (message: the exit code or signal, with the log's tail in ``extra["log_tail"]``);
- ``timeout``: ``request.timeout_s`` of wall time passed; the child's process group is killed and
  ``failed_phase`` is the phase it had entered last.

A child that reported carries its allocation records in ``result.artifacts`` (:mod:`probes.process.artifacts`);
the store keeps them with the probe.

A request for N > 1 GPUs (one node) runs N ranks under PyTorch's elastic launcher as one probe
(:mod:`probes.process.rank_group`); a failure or hang of any rank ends the group, and the result is the worst
rank's, with every rank's own in ``extra["ranks"]`` (:mod:`probes.process.worst_rank`). One GPU runs one child
directly, no launcher.

Pure Python: importing this module imports no torch.
"""

from __future__ import annotations

import signal
import time

from probes.measure.fingerprint import host_fingerprint
from probes.model.build import plan_from_request
from probes.ops.prepare import note_to_stderr, prepare_ops
from probes.process.isolation import ChildRun, child_env, run_child
from probes.process.rank_group import run_group
from probes.process.worst_rank import group_result
from store.errors import InputError
from store.measurements import DeviceFingerprint, ProbeRequest, ProbeResult

__all__ = ["run_probe"]

_clock = time.perf_counter  # the probe's wall clock (tests replace it)


def run_probe(request: ProbeRequest) -> ProbeResult:
    """Run ``request`` in a fresh process within ``request.timeout_s`` seconds and say what happened.

    Never raises for a failing probe (the outcome says it). Raises OpBuildError when DeepSpeed's ops for
    it cannot be built (before any child starts; see the module docstring); KeyboardInterrupt passes
    through after the child's process group is killed. ``wall_s`` and the timeout count from the child's
    start: building DeepSpeed's ops (here, if nobody built them before) counts in neither.
    """
    start = _clock()
    try:
        plan = plan_from_request(request)
    except InputError as exc:
        return ProbeResult(
            outcome="error",
            message=f"InputError: {exc}",
            wall_s=_clock() - start,
            fingerprint=host_fingerprint(request.device),
            layers=request.layers,
        )
    prepare_ops([request], on_note=note_to_stderr)  # OpBuildError: one line for the run
    start = _clock()
    env = child_env(request.device, plan.strategy.allocator)
    ranks = plan.hardware.world_size
    if ranks > 1:
        group = run_group(request.to_dict(), env, float(request.timeout_s), ranks)
        return group_result(
            group.ranks,
            request,
            layers=plan.layers,
            wall_s=_clock() - start,
            timed_out=group.timed_out,
            returncode=group.returncode,
            log_tail=group.log_tail,
            fallback=host_fingerprint(request.device),
        )
    run = run_child(request.to_dict(), env, float(request.timeout_s))
    return _result(run, request, plan.layers, _clock() - start)


def _fingerprint(run: ChildRun, device: str) -> DeviceFingerprint:
    data = run.fingerprint
    return DeviceFingerprint.from_dict(data) if data else host_fingerprint(device)


def _result(run: ChildRun, request: ProbeRequest, layers: int, wall_s: float) -> ProbeResult:
    if run.timed_out:
        phase = run.last_phase
        return ProbeResult(
            outcome="timeout",
            failed_phase=phase,
            message=f"timed out after {request.timeout_s:g} s in phase {phase or 'startup'}; process group killed",
            host_rss_peak_bytes=run.last_rss,
            wall_s=wall_s,
            fingerprint=_fingerprint(run, request.device),
            layers=layers,
            extra={"child_pid": run.pid, "log_tail": run.log_tail},
        )
    if run.result is not None:
        result = ProbeResult.from_dict(run.result)
        extra = dict(result.extra)
        if result.outcome != "ok":
            extra["log_tail"] = run.log_tail
        return ProbeResult(
            outcome=result.outcome,
            phases=result.phases,
            failed_phase=result.failed_phase,
            message=result.message,
            host_rss_peak_bytes=result.host_rss_peak_bytes,
            wall_s=wall_s,
            fingerprint=result.fingerprint or _fingerprint(run, request.device),
            layers=result.layers if result.layers is not None else layers,
            extra=extra,
            artifacts=run.artifacts,
        )
    code = run.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        how = f"killed by {name}" + (" (the kernel's out-of-memory killer?)" if -code == signal.SIGKILL else "")
    else:
        how = f"exited with code {code}"
    return ProbeResult(
        outcome="error",
        failed_phase=run.last_phase,
        message=f"probe process {how} without a report (in phase {run.last_phase or 'startup'})",
        host_rss_peak_bytes=run.last_rss,
        wall_s=wall_s,
        fingerprint=_fingerprint(run, request.device),
        layers=layers,
        extra={"child_pid": run.pid, "exit_code": code, "log_tail": run.log_tail},
    )

"""DeepSpeed's compiled ops, built once per run before any probe, in a child of their own.

DeepSpeed JIT-builds the C++/CUDA ops an engine needs the first time it loads them (about 50 s each for
FusedAdam and CPU Adam on 16 cores). Inside a probe that time was charged to the probe's timeout (a first
PPO probe on a fresh machine timed out), and a build that cannot succeed (DeepSpeed 0.19.8 cannot parse
``TORCH_CUDA_ARCH_LIST=9.0a``) failed every probe alike. :func:`prepare_ops` therefore works out which ops
the probes will load (:func:`needed_ops`, from the DeepSpeed configs they pass to ``deepspeed.initialize``),
and loads them in one ``python -m probes.ops.child`` process with the probes' own environment (so the
probes find them in the same torch extensions folder: the user's ``TORCH_EXTENSIONS_DIR``, else one of
memplan's environment, :mod:`probes.process.op_cache`, which the note names), under its own generous timeout. A
failure raises
:class:`OpBuildError` with one line for the whole run. The answer is remembered for the life of this
process: a second call builds nothing, and an op that failed fails again at once without a rebuild.

Which ops (DeepSpeed 0.19, ``runtime/engine.py``: ``get_optimizer_configuration``):

- an Adam/AdamW optimizer without ``torch_adam``: ``CPUAdamBuilder`` when ``offload_optimizer.device`` is
  cpu or nvme, else ``FusedAdamBuilder`` (on the CPU accelerator its CPU version);
- NVMe offload of anything: ``AsyncIOBuilder``;
- ``hybrid_engine.enabled`` on CUDA: ``InferenceBuilder`` (``HybridEngine.__init__`` makes a ``WorkspaceOp``,
  which loads it; on the CPU accelerator it is not implemented and DeepSpeed falls back on its own);
- on the CPU device, first ``ShareMemCommBuilder`` (the shared-memory allreduce ``deepspeed.init_distributed``
  loads), optional: skipped where DeepSpeed would skip it.

Pure Python: the parent imports no torch here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.process.arch_list import ARCH_VARIABLE, arch_list_env
from probes.process.isolation import ChildRun, child_env, run_child
from probes.process.op_cache import ops_folder
from store.errors import InputError
from store.measurements import ProbeRequest
from store.records import RLHFStrategy

__all__ = [
    "BUILD_TIMEOUT_S",
    "BuildOutcome",
    "OpBuildError",
    "OpsBuild",
    "build_in_child",
    "forget_builds",
    "needed_ops",
    "ops_for_configs",
    "prepare_ops",
]

BUILD_TIMEOUT_S = 1800.0  # all ops of one device together; transformer_inference alone takes minutes
OPS_CHILD_MODULE = "probes.ops.child"
OPTIONAL_OPS: tuple[str, ...] = ("ShareMemCommBuilder",)
ADAM_TYPES = ("adam", "adamw")


class OpBuildError(InputError):
    """DeepSpeed's ops for the probes could not be built: one line for the run (the CLI exits 2 on it)."""


@dataclass(frozen=True)
class BuildOutcome:
    """What one build child did (see :mod:`probes.ops.child`)."""

    ok: bool
    built: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    failed: str | None = None
    message: str = ""
    seconds: float = 0.0
    timed_out: bool = False
    last_step: str | None = None
    log_tail: str = ""
    arch_list: str | None = None
    capability: str | None = None


@dataclass(frozen=True)
class OpsBuild:
    """The ops built for one device before the probes, and the note that said so."""

    device: str
    ops: tuple[str, ...]
    built: tuple[str, ...]
    skipped: tuple[str, ...]
    seconds: float
    note: str


Builder = Callable[[str, tuple[str, ...], dict[str, str], float], BuildOutcome]

# (device, op, TORCH_CUDA_ARCH_LIST the children get) -> None when the op loads, else the one-line failure
_BUILT: dict[tuple[str, str, str | None], str | None] = {}


def forget_builds() -> None:
    """Forget what this process built (the next :func:`prepare_ops` asks the build child again)."""
    _BUILT.clear()


def ops_for_configs(configs: Iterable[dict[str, Any]], device: str) -> tuple[str, ...]:
    """The op builders DeepSpeed loads for engines started from ``configs`` on ``device``, in build order."""
    ops: list[str] = ["ShareMemCommBuilder"] if device == "cpu" else []
    for config in configs:
        zero = config.get("zero_optimization") or {}
        offload = {(zero.get(key) or {}).get("device", "none") for key in ("offload_optimizer", "offload_param")}
        optimizer = config.get("optimizer") or {}
        params = optimizer.get("params") or {}
        if str(optimizer.get("type", "")).lower() in ADAM_TYPES and not params.get("torch_adam", False):
            optimizer_offload = (zero.get("offload_optimizer") or {}).get("device", "none")
            ops.append("CPUAdamBuilder" if optimizer_offload in ("cpu", "nvme") else "FusedAdamBuilder")
        if "nvme" in offload:
            ops.append("AsyncIOBuilder")
        if device == "cuda" and (config.get("hybrid_engine") or {}).get("enabled", False):
            ops.append("InferenceBuilder")
    return tuple(dict.fromkeys(ops))


def needed_ops(request: ProbeRequest) -> tuple[str, ...]:
    """The op builders the probe of ``request`` will load; InputError for a request the runner refuses."""
    from probes.model.build import plan_from_request

    plan = plan_from_request(request)
    strategy = plan.strategy
    if isinstance(strategy, RLHFStrategy):
        from launch.rlhf_config import render_rlhf_ds_configs

        configs = list(render_rlhf_ds_configs(strategy, plan.workload, plan.hardware).values())
    else:
        from launch.ds_config import render_ds_config

        configs = [render_ds_config(strategy, plan.workload, plan.hardware)]
    return ops_for_configs(configs, plan.device)


def prepare_ops(
    requests: Iterable[ProbeRequest],
    *,
    timeout_s: float = BUILD_TIMEOUT_S,
    on_note: Callable[[str], None] | None = None,
    build: Builder | None = None,
) -> list[OpsBuild]:
    """Build, once per process, every op the probes of ``requests`` will load, before any of them runs.

    ``on_note`` gets one line per device that has something to build (what, and the arch list as the
    children read it); ``build`` defaults to :func:`build_in_child`. Requests the runner would refuse
    are skipped (their probes run nothing). Raises OpBuildError when an op cannot be built, now or
    earlier in this process.
    """
    wanted: dict[str, list[str]] = {}
    for request in requests:
        try:
            ops = needed_ops(request)
        except InputError:
            continue
        wanted.setdefault(request.device, []).extend(ops)
    done: list[OpsBuild] = []
    for device, ops_list in wanted.items():
        ops = tuple(dict.fromkeys(ops_list))
        env = child_env(device, "default")
        arch = env.get(ARCH_VARIABLE)
        for op in ops:
            failure = _BUILT.get((device, op, arch))
            if failure is not None:
                raise OpBuildError(failure)
        todo = tuple(op for op in ops if (device, op, arch) not in _BUILT)
        if not todo:
            continue
        note = _note(device, todo, arch, ops_folder(env))
        if on_note is not None:
            on_note(note)
        outcome = (build or build_in_child)(device, todo, env, float(timeout_s))
        for op in (*outcome.built, *outcome.skipped):
            _BUILT[(device, op, arch)] = None
        if not outcome.ok:
            message = _failure(device, todo, outcome, arch, timeout_s)
            settled = (*outcome.built, *outcome.skipped)
            for op in (outcome.failed,) if outcome.failed else tuple(op for op in todo if op not in settled):
                _BUILT[(device, op, arch)] = message
            raise OpBuildError(message)
        done.append(OpsBuild(device, todo, outcome.built, outcome.skipped, outcome.seconds, note))
    return done


def build_in_child(device: str, ops: tuple[str, ...], env: dict[str, str], timeout_s: float) -> BuildOutcome:
    """Load ``ops`` in one ``python -m probes.ops.child`` process with ``env`` within ``timeout_s`` seconds."""
    optional = [op for op in ops if op in OPTIONAL_OPS]
    run = run_child({"device": device, "ops": list(ops), "optional": optional}, env, timeout_s, OPS_CHILD_MODULE)
    return _outcome(run)


def _outcome(run: ChildRun) -> BuildOutcome:
    data = run.result
    if run.timed_out or data is None:
        how = "timed out" if run.timed_out else f"exited with code {run.returncode} without a report"
        return BuildOutcome(
            ok=False, message=how, seconds=run.wall_s, timed_out=run.timed_out, last_step=run.last_phase,
            log_tail=run.log_tail,
        )  # fmt: skip
    seconds = data.get("seconds") or {}
    return BuildOutcome(
        ok=bool(data.get("ok")),
        built=tuple(data.get("built") or ()),
        skipped=tuple(data.get("skipped") or ()),
        failed=data.get("failed"),
        message=str(data.get("message") or ""),
        seconds=float(sum(seconds.values())) if isinstance(seconds, dict) else 0.0,
        last_step=run.last_phase,
        log_tail=run.log_tail,
        arch_list=data.get("arch_list"),
        capability=data.get("capability"),
    )


def _note(device: str, ops: tuple[str, ...], arch: str | None, folder: Path | None = None) -> str:
    names = ", ".join(op.removesuffix("Builder") for op in ops)
    line = f"DeepSpeed ops {names} for {device}: built once (or loaded if cached) before the probes, timed with none"
    line += f"; built in {folder}" if folder is not None else ""
    if device != "cuda":
        return line
    changed = arch_list_env({k: v for k, v in os.environ.items() if k == ARCH_VARIABLE})[1]
    return line + (f"; {changed}" if changed else f"; {ARCH_VARIABLE}={arch!r}" if arch else "")


def _failure(device: str, ops: tuple[str, ...], outcome: BuildOutcome, arch: str | None, timeout_s: float) -> str:
    where = f"{ARCH_VARIABLE}={arch!r}" if arch else f"{ARCH_VARIABLE} unset"
    if outcome.timed_out:
        what = f"took more than {timeout_s:g} s (stopped in {outcome.last_step or 'startup'})"
    else:
        op = outcome.failed or (outcome.last_step or "startup")
        what = f"failed at {op}: {outcome.message or 'no message'}"
    tail = _last_line(outcome.log_tail)
    line = f"building DeepSpeed's ops {', '.join(ops)} for {device} before the probes {what} ({where})"
    return line + (f"; build log ends: {tail}" if tail else "") + "; no probe was run with them"


def _last_line(text: str, limit: int = 240) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def note_to_stderr(line: str) -> None:
    """The default progress note of :func:`probes.runner.run_probe`'s own op build."""
    print(f"memplan: {line}", file=sys.stderr, flush=True)

"""DeepSpeed's ops for the user's program (``planner probe|tune -- CMD``), built before it runs, as for
memplan's own probes (:mod:`probes.ops.prepare`).

A program that starts a DeepSpeed engine with an Adam optimizer JIT-builds its op (FusedAdam's CPU version, or
CPU Adam with optimizer offload) the first time it loads it; inside the run that build was charged to the
program's timeout (a 400 s ``timeout (setup)`` on a 2-core CPU), and a second run started it again. Here the
ops that the strategies' DeepSpeed configs load (:func:`probes.ops.prepare.ops_for_configs` over the configs
memplan renders for them: the keys the start-up hook sets in the program's config) are built once, in one build
child (:func:`probes.ops.prepare.build_in_child`), outside any timeout, into the torch extensions folder the
program's own environment names (``TORCH_EXTENSIONS_DIR`` of :func:`probes.process.isolation.child_env`, which
``probes.script.launch`` starts the program with), so the program loads them instead of building them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from store.records import Hardware, Strategy, Workload

__all__ = ["program_ops", "prepare_program_ops"]

Builder = Callable[..., object]
_DONE: set[tuple[str, tuple[str, ...], str]] = set()  # (device, ops, folder) built in this process


def program_ops(strategies: Sequence[Strategy], workload: Workload, hardware: Hardware, device: str) -> tuple[str, ...]:
    """The op builders DeepSpeed loads for the program under each of ``strategies`` (their rendered configs)."""
    from launch.ds_config import render_ds_config
    from probes.ops.prepare import ops_for_configs

    return ops_for_configs([render_ds_config(s, workload, hardware) for s in strategies], device)


def prepare_program_ops(
    strategies: Sequence[Strategy],
    workload: Workload,
    hardware: Hardware,
    device: str,
    *,
    on_note: Callable[[str], None] | None = None,
    build: Builder | None = None,
) -> tuple[str, ...]:
    """Build (or load, where cached) the ops the program will load, once per process, before its first run; a
    note names them and the folder. Returns the ops; raises ``OpBuildError`` (an InputError) with one line when
    they cannot be built. ``build`` defaults to ``probes.ops.prepare.build_in_child``."""
    from probes.ops.prepare import BUILD_TIMEOUT_S, OpBuildError, build_in_child
    from probes.process.isolation import child_env
    from probes.process.op_cache import VARIABLE

    ops = program_ops(strategies, workload, hardware, device)
    env = child_env(device, "default")
    folder = env.get(VARIABLE, "")
    if not ops or (device, ops, folder) in _DONE:
        return ops
    names = ", ".join(op.removesuffix("Builder") for op in ops)
    if on_note is not None:
        on_note(
            f"DeepSpeed ops {names} for your program on {device}: built once (or loaded if cached) before it runs, "
            f"outside its timeout, in {folder} (the program gets {VARIABLE}={folder})"
        )
    outcome = (build or build_in_child)(device, ops, env, BUILD_TIMEOUT_S)
    if not getattr(outcome, "ok", False):
        how = "timed out" if getattr(outcome, "timed_out", False) else str(getattr(outcome, "message", "") or "failed")
        step = getattr(outcome, "last_step", None) or "startup"
        raise OpBuildError(
            f"building DeepSpeed's ops {names} for your program on {device} {how} (in {step}); the program was not run"
        )
    _DONE.add((device, ops, folder))
    return ops

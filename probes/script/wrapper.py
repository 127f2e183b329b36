"""The program's side of a script probe: ``deepspeed.initialize`` wrapped, the engine's phases measured.

The start-up hook (:mod:`probes.script.hook.sitecustomize`) calls :func:`install` in every process of the
user's program, right after ``deepspeed`` has been imported there. It replaces the module's ``initialize`` (so
``deepspeed.initialize(...)``, as Accelerate and the HF Trainer call it, and ``from deepspeed import initialize``
done later, both reach it), makes the process's torch extension locks name their holder
(:mod:`probes.process.jit_lock`) and starts a watch that ends the process, with what it started, when its parent
or the planner is gone (:mod:`probes.process.parent_watch`; no signal handler of the program's is replaced).

At ``initialize`` (:class:`ScriptProbe`), in this order:

- the settings that live outside the config: gradient checkpointing switched on or off on a transformers model
  (``activation_checkpointing_enable`` / ``gradient_checkpointing_enable``); LoRA and the chunked loss, which
  only the program can do, are checked. A setting that cannot be applied ends the probe here, before the engine
  is built, with outcome ``not_applied`` and one line per setting;
- the strategy's keys merged into the config the program passed (:func:`probes.script.settings.merge_config`;
  ``config=``, ``config_params=``, a path or a dict, or ``args.deepspeed_config``, which is then cleared);
- on the CPU backend the live-tensor tracker starts (:class:`probes.measure.tracker.LiveTensorTracker`, with the
  tensors that exist already), then the real ``initialize`` runs (its peak is ``setup_peak_bytes``);
- what the engine really runs with is recorded (``ran_with``: stage, micro-batch, accumulation, dtype, offload,
  ranks, checkpointing, ``PYTORCH_CUDA_ALLOC_CONF``), and the engine's ``forward``, ``backward`` and ``step``
  are wrapped in the phases ``forward``, ``backward``, ``optimizer_step`` of :class:`probes.step.phases.PhaseClock`,
  the built-in probes' clock: peaks reset per phase (CUDA: the allocator's counters; CPU: the tracker),
  ``empty_cache`` where the policy says (``store.phases``), times per phase and per step.

A step is one optimizer step: it opens at the first phase after the previous one and closes at the ``step()``
call on an accumulation boundary. Each forward's batch size (the first dimension of ``input_ids``, else of the
first tensor argument) and each step's count of forwards are recorded; where they differ from the plan's
micro-batch and accumulation, the result lists the contradiction. After ``warmup_steps + timed_steps`` steps the
rank writes ``result.json`` (atomically), waits for the other ranks (a barrier, so no rank leaves a collective
half done), and leaves with ``os._exit(0)``: every rank runs the same steps, so every rank ends and the launcher
exits 0. An exception in a phase (an out-of-memory: ``oom``; anything else: ``error``) or in ``initialize`` ends
the rank the same way with exit code 1, its phase and traceback recorded; a failure of the hook's own code is
an ``error`` whose result says ``hook_error``. A second ``initialize`` (a reference or critic model) gets the
overrides too and is recorded in ``other_engines``; only the first engine's phases are measured.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

from probes.script import program_model
from probes.script.program_model import apply_outside, batch_size_of, contradictions, load_config, ran_with
from probes.script.settings import EVENTS_FILE, RESULT_FILE, ScriptProbeSettings, merge_config, rank_folder

__all__ = ["ScriptProbe", "batch_size_of", "install", "preload"]

WRAPPED = "__memplan_script_probe__"
TRACEBACK_CHARS = 4000


def preload() -> None:
    """Import every module the probe uses later, now (the hook may find memplan on sys.path only meanwhile)."""
    import probes.measure.fingerprint
    import probes.measure.tracker  # imports torch, which deepspeed has loaded already
    import probes.process.jit_lock
    import probes.process.parent_watch
    import probes.step.child
    import probes.step.phases
    import probes.step.warmup  # noqa: F401


def install(deepspeed: Any, settings_path: str) -> None:
    """Wrap ``deepspeed.initialize`` for the probe described in ``settings_path`` (module docstring)."""
    original = deepspeed.initialize
    if getattr(original, WRAPPED, False):
        return
    settings = ScriptProbeSettings.read(settings_path)
    if not settings.output_dir:
        raise ValueError(f"the script probe's settings {settings_path} name no output folder")
    probe = ScriptProbe(settings, original)

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        return probe.initialize(*args, **kwargs)

    setattr(initialize, WRAPPED, True)
    deepspeed.initialize = initialize
    from probes.process.jit_lock import install as name_lock_holders

    name_lock_holders(on_wait=lambda lock: probe.event(waiting_on=str(lock)))
    _watch_parent()


def _watch_parent() -> None:
    """End this process and what it started once its parent or the planner is gone (a thread: no handler of
    the program's is touched)."""
    from probes.process.parent_watch import PLANNER_PID_VARIABLE, POLL_S, end_tree, parent_is_gone

    text = os.environ.get(PLANNER_PID_VARIABLE, "")
    planner = int(text) if text.isdigit() else 0
    parent = os.getppid()

    def watch() -> None:
        while not parent_is_gone(parent, planner):
            time.sleep(POLL_S)
        end_tree()

    threading.Thread(target=watch, name="memplan-script-probe-watch", daemon=True).start()


class ScriptProbe:
    """The probe in one process of the program (module docstring)."""

    def __init__(self, settings: ScriptProbeSettings, original: Any) -> None:
        self.settings = settings
        self.original = original
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self.folder = rank_folder(settings.output_dir, self.rank)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.events = (self.folder / EVENTS_FILE).open("a", encoding="utf-8")
        self.start = time.perf_counter()
        self.phase: str | None = None
        self.engine: Any = None
        self.model_zero_init: bool | None = None  # the model handed to initialize, already partitioned (zero.Init)
        self.clock: Any = None
        self.tracker: Any = None
        self.steps_done = 0
        self.step_open = False
        self.forwards_in_step = 0
        self.batch_sizes: list[int] = []
        self.micro_steps: list[int] = []
        self.step_wall: list[float] = []
        self.step_started = 0.0
        self.record: dict[str, Any] = {
            "rank": self.rank,
            "world_size": self.world,
            "pid": os.getpid(),
            "initialize_calls": 0,
            "applied": {},
            "not_applied": [],
            "other_engines": [],
        }
        self.event(pid=os.getpid(), rank=self.rank, world_size=self.world)

    # --- reporting ---------------------------------------------------------------------------------------

    def event(self, **data: Any) -> None:
        """One flushed line of ``events.jsonl`` (the parent reads it while the program runs)."""
        self.events.write(json.dumps(data, default=str) + "\n")
        self.events.flush()

    def enter(self, phase: str) -> None:
        from probes.step.child import rss_peak_bytes

        self.phase = phase
        self.event(phase=phase, t=round(time.perf_counter() - self.start, 4), rss=rss_peak_bytes())

    # --- initialize --------------------------------------------------------------------------------------

    def initialize(self, *args: Any, **kwargs: Any) -> Any:
        self.record["initialize_calls"] += 1
        first = self.engine is None
        self.event(
            initialize=self.record["initialize_calls"],
            t=round(time.perf_counter() - self.start, 4),
            master_port=os.environ.get("MASTER_PORT", ""),
        )
        if first:
            self.enter("setup")
        try:
            bound = inspect.signature(self.original).bind_partial(*args, **kwargs)
            if first:
                model = bound.arguments.get("model")
                self.model_zero_init = None if model is None else program_model.zero_init(model)
                lines = apply_outside(self.settings, model, self.record["applied"])
                if lines:
                    self.record["not_applied"] = lines
                    self.finish("not_applied", message="; ".join(lines))
            self._merge_config(bound, first)
            if first and self.settings.device == "cpu":
                self._start_tracker()
            elif first:
                self._reset_cuda_peak()
        except Exception as exc:  # noqa: BLE001 - the hook's own failure is the probe's outcome
            self.fail(exc, hook=True)
        try:
            result = self.original(*bound.args, **bound.kwargs)
        except Exception as exc:  # noqa: BLE001 - DeepSpeed refused the config, or ran out of memory building
            self.fail(exc)
        try:
            engine = result[0] if isinstance(result, tuple) else result
            if first:
                self._measure(engine)
            else:
                self.record["other_engines"].append(ran_with(engine, self.world))
        except Exception as exc:  # noqa: BLE001
            self.fail(exc, hook=True)
        return result

    def _merge_config(self, bound: inspect.BoundArguments, first: bool) -> None:
        """Put the strategy's keys into the config the program passed (module docstring)."""
        arguments = bound.arguments
        config, source = arguments.get("config"), "config"
        if config is None and arguments.get("config_params") is not None:
            config, source = arguments["config_params"], "config_params"
        holder = arguments.get("args")
        for name in ("deepspeed_config", "deepscale_config"):
            if config is None and getattr(holder, name, None) is not None:
                config, source = getattr(holder, name), f"args.{name}"
        if config is None:
            raise ValueError("deepspeed.initialize was called without a config (config=, config_params= or args)")
        program = load_config(config)
        merged = merge_config(program, self.settings.ds_overrides)
        arguments["config"] = merged
        arguments.pop("config_params", None)
        for name in ("deepspeed_config", "deepscale_config"):
            if getattr(holder, name, None) is not None:
                setattr(holder, name, None)
        if first:
            self.record.update(config_source=source, program_config=program, config=merged)

    def _start_tracker(self) -> None:
        from probes.measure.tracker import LiveTensorTracker

        self.tracker = LiveTensorTracker(cap_bytes=self.settings.memory_cap_bytes)
        self.tracker.__enter__()  # active for the rest of the program: it ends with os._exit
        self.record["bytes_before_setup"] = self.tracker.track_existing()
        self.tracker.reset_peak()

    @staticmethod
    def _reset_cuda_peak() -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def _measure(self, engine: Any) -> None:
        """Record the engine, then wrap its forward, backward and step in the probe's phases."""
        from probes.step.phases import PhaseClock

        self.engine = engine
        self.record["ran_with"] = ran_with(engine, self.world) | program_model.model_build_seen(
            self.model_zero_init, self.record.get("program_config")
        )
        if self.tracker is not None:
            self.record.update(setup_peak_bytes=self.tracker.peak, resident_bytes=self.tracker.current)
        else:
            import torch

            if torch.cuda.is_available():
                self.record.update(
                    setup_peak_bytes=torch.cuda.max_memory_allocated(), resident_bytes=torch.cuda.memory_allocated()
                )
        self.record["setup_s"] = round(time.perf_counter() - self.start, 3)
        self.clock = PhaseClock(self.settings.device, self.settings.empty_cache, self.tracker, on_phase=self.enter)
        forward, backward, step = engine.forward, engine.backward, engine.step

        def probed_forward(*args: Any, **kwargs: Any) -> Any:
            import torch

            if not (getattr(engine.module, "training", True) and torch.is_grad_enabled()):
                return forward(*args, **kwargs)  # an evaluation pass: not a training phase
            self._open_step()
            self.forwards_in_step += 1
            size = batch_size_of(args, kwargs)
            if size is not None:
                self.batch_sizes.append(size)
            with self._phase("forward"):
                return forward(*args, **kwargs)

        def probed_backward(*args: Any, **kwargs: Any) -> Any:
            self._open_step()
            with self._phase("backward"):
                return backward(*args, **kwargs)

        def probed_step(*args: Any, **kwargs: Any) -> Any:
            self._open_step()
            boundary = bool(engine.is_gradient_accumulation_boundary())
            with self._phase("optimizer_step"):
                out = step(*args, **kwargs)
                if boundary:
                    self.clock.end_step()  # every-step empties the cache here, inside the phase
            if boundary:
                self._close_step()
            return out

        engine.forward, engine.backward, engine.step = probed_forward, probed_backward, probed_step

    # --- steps and phases --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        try:
            with self.clock.phase(name):
                yield
        except Exception as exc:  # noqa: BLE001 - an out-of-memory or the program's own error ends the probe
            self.fail(exc)

    def _open_step(self) -> None:
        if self.step_open:
            return
        self.step_open = True
        self.forwards_in_step = 0
        if self.steps_done == self.settings.warmup_steps:
            with contextlib.suppress(Exception):  # best-effort note, never the outcome
                from probes.step.warmup import trace_complete

                traces = trace_complete({"model": self.engine})
                if traces:
                    self.record["zero3_trace_complete"] = traces
        self.clock.start_step(measured=self.steps_done >= self.settings.warmup_steps)
        self.step_started = time.perf_counter()

    def _close_step(self) -> None:
        measured = self.steps_done >= self.settings.warmup_steps
        self.clock.finish_step(measured=measured)
        self.step_wall.append(round(time.perf_counter() - self.step_started, 4))
        self.micro_steps.append(self.forwards_in_step)
        self.step_open = False
        self.steps_done += 1
        self.event(step=self.steps_done, t=round(time.perf_counter() - self.start, 4))
        if self.steps_done >= self.settings.steps:
            self.finish("ok")

    # --- the end -----------------------------------------------------------------------------------------

    def fail(self, exc: BaseException, hook: bool = False) -> NoReturn:
        """End the rank on ``exc``: ``oom`` for an out-of-memory, else ``error`` (``hook``: the hook's own)."""
        from probes.step.child import describe, is_oom

        outcome = "oom" if not hook and is_oom(exc) else "error"
        self.record["traceback"] = traceback.format_exc()[-TRACEBACK_CHARS:]
        if hook:
            self.record["hook_error"] = True
        message = ("memplan's hook failed: " if hook else "") + describe(exc)
        self.finish(outcome, message=message, failed_phase=self.phase)

    def finish(self, outcome: str, message: str = "", failed_phase: str | None = None) -> NoReturn:
        """Write this rank's result, wait for the other ranks after a success, and leave the process."""
        try:
            self._write(outcome, message, failed_phase)
        except BaseException:  # noqa: BLE001 - the last resort: say so on stderr, the parent reads the log
            print("memplan script probe: could not write the result:\n" + traceback.format_exc(), file=sys.stderr)
        if outcome == "ok" and self.world > 1:
            with contextlib.suppress(Exception):
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.barrier()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0 if outcome in ("ok", "not_applied") else 1)

    def _write(self, outcome: str, message: str, failed_phase: str | None) -> None:
        from probes.step.child import rss_peak_bytes

        record = dict(self.record)
        record.update(outcome=outcome, message=message, failed_phase=failed_phase)
        record["plan"] = {
            "zero_stage": self.settings.zero_stage,
            "micro_batch": self.settings.micro_batch,
            "grad_accum": self.settings.grad_accum,
            "dtype": self.settings.dtype,
            "world_size": self.settings.world_size,
        }
        record["observed"] = {"batch_sizes": sorted(set(self.batch_sizes)), "micro_steps_per_step": self.micro_steps}
        record["contradictions"] = (
            contradictions(self.settings, record.get("ran_with", {}), self.batch_sizes, self.micro_steps)
            if self.engine is not None
            else []
        )
        record["steps_done"] = self.steps_done
        record["warmup_steps"] = self.settings.warmup_steps
        record["step_wall_s"] = self.step_wall
        if self.clock is not None:
            record["phases"] = [m.to_dict() for m in self.clock.measurements()]
            record["measured_steps"] = self.clock.measured_steps
            record["empty_cache_calls"] = self.clock.cache_calls
            record.update(self.clock.spread())
        else:
            record["phases"] = []
        record["host_rss_peak_bytes"] = rss_peak_bytes()
        record["wall_s"] = round(time.perf_counter() - self.start, 3)
        with contextlib.suppress(Exception):
            from probes.measure.fingerprint import fingerprint

            record["fingerprint"] = fingerprint(self.settings.device).to_dict()
        temporary = self.folder / (RESULT_FILE + ".tmp")
        temporary.write_text(json.dumps(record, default=str), encoding="utf-8")
        temporary.replace(self.folder / RESULT_FILE)
        self.event(result=outcome, t=round(time.perf_counter() - self.start, 4))

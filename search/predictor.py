"""One entry point for a prediction, whatever the workload kind, and the CPU-backend view of it."""

from __future__ import annotations

from search.coefficients import DEFAULT_COEFFICIENTS, Coefficients
from search.prediction import Prediction
from search.rlhf.predict import predict_rlhf, rlhf_step
from search.single.predict import checked_step, predict_single_model
from search.step.assemble import Step, screen_step
from search.step.replayed import StepReplayed, StepTimeline, replay_step, step_timeline
from store.errors import InputError
from store.records import Hardware, RLHFStrategy, Strategy, Workload
from store.workload_kinds import KINDS, traits


def predict(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> Prediction:
    """Predicted memory and time of ``strategy`` for ``workload`` on ``hardware``; peak reserved from the
    allocator replay of its step (:func:`search.step.finish.finish_step`).

    Single-model kinds (sft, reward, dpo) take a ``Strategy``; RLHF kinds (ppo, remax, grpo) an
    ``RLHFStrategy``. The other shape is an InputError.
    """
    _step_kind(workload, strategy)
    if isinstance(strategy, RLHFStrategy):
        return predict_rlhf(workload, strategy, hardware, coef)
    return predict_single_model(workload, strategy, hardware, coef)


def screen(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> Prediction:
    """As :func:`predict`, with peak reserved from the fragment coefficients a search screens with
    (:func:`search.step.assemble.screen_step`)."""
    step = _step(workload, strategy, hardware, coef)
    return screen_step(step, strategy.empty_cache, strategy.allocator, hardware, coef)


def _step_kind(workload: Workload, strategy: Strategy | RLHFStrategy) -> None:
    """InputError unless the strategy's shape is the workload kind's."""
    if workload.kind not in KINDS:
        raise InputError(f"workload {workload.kind!r} is not supported; supported: {', '.join(KINDS)}")
    if not traits(workload.kind).rlhf:
        if not isinstance(strategy, Strategy):
            raise InputError(f"{workload.kind} trains one model: give a single-model strategy, not an RLHF one")
    elif not isinstance(strategy, RLHFStrategy):
        raise InputError(
            f"{workload.kind} is an RLHF workload: give an RLHF strategy (actor/critic/reference/reward blocks)"
        )


def _step(workload: Workload, strategy: Strategy | RLHFStrategy, hardware: Hardware, coef: Coefficients) -> Step:
    """The strategy's step before its policy is applied, once the strategy is known to be the workload's."""
    _step_kind(workload, strategy)
    if isinstance(strategy, RLHFStrategy):
        return rlhf_step(workload, strategy, hardware, coef)
    return checked_step(workload, strategy, hardware, coef)


def replay_memory(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
    *,
    streams: bool = True,
) -> StepReplayed:
    """The strategy's step replayed through the port of torch's caching allocator (:mod:`search.allocator`):
    reserved bytes per phase and after the engines' init, from the allocation stream the cost model's bytes
    make (:mod:`search.streams`), under the strategy's ``empty_cache`` policy and allocator setting, on the
    GPU's memory less the CUDA context: a plan that does not fit meets the allocator's retry and its
    out-of-memory (``oom_phase``). ``streams=False``: as on DeepSpeed's CPU accelerator, which makes no side
    streams (ZeRO's reduction stream), every request on the default stream."""
    device = hardware.gpu_memory_bytes - int(coef.cuda_context_bytes)  # what torch's allocator can take
    step = _step(workload, strategy, hardware, coef)
    return replay_step(step, strategy.empty_cache, strategy.allocator, coef, device, streams)


def replay_timeline(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> StepTimeline:
    """Allocated and reserved bytes over one (the measured) step of the allocator replay, event by event."""
    return step_timeline(_step(workload, strategy, hardware, coef), strategy.empty_cache, strategy.allocator)


def cpu_backend_coefficients(coef: Coefficients) -> Coefficients:
    """``coef`` for DeepSpeed's CPU accelerator: no CUDA context and no cuBLAS workspace exist there."""
    return coef.with_(cublas_workspace_bytes=0.0, cuda_context_bytes=0.0)


def predict_cpu_backend(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> Prediction:
    """The prediction as DeepSpeed's CPU accelerator shows it (what the probes' CPU tracker counts).

    Two named differences from a GPU, nothing else: (1) no CUDA context or cuBLAS workspace
    (:func:`cpu_backend_coefficients`); (2) host and "device" are one memory, so offloaded optimizer
    states and their pinned buffers add to every phase's live bytes (:meth:`Prediction.on_cpu_backend`).
    """
    return predict(workload, strategy, hardware, cpu_backend_coefficients(coef)).on_cpu_backend()


def predict_cpu_allocated(
    workload: Workload,
    strategy: Strategy | RLHFStrategy,
    hardware: Hardware,
    coef: Coefficients = DEFAULT_COEFFICIENTS,
) -> int:
    """Peak live tensor bytes of one training step on DeepSpeed's CPU accelerator (one rank)."""
    return predict_cpu_backend(workload, strategy, hardware, coef).peak_allocated_bytes

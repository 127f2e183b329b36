"""The cuBLAS workspaces in a built stream are made where torch makes them (``search.streams.workspaces``): the
main thread's at the first step's first allocation, the autograd thread's right after the first gradient of the
first backward, both kept for the run; none at setup."""

from __future__ import annotations

from search.coefficients import Coefficients
from search.single.predict import single_step
from search.step.replayed import stream_of
from search.streams.build import STEP_MARK
from search.streams.workspaces import backward_workspace, place_workspaces
from store.alloc_stream import ALLOC, FREE, KIND_INDEX, PHASE, AllocStream, StreamBuilder
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

MIB = 2**20
BUFFERS, GRADIENTS = KIND_INDEX["buffers"], KIND_INDEX["gradients"]


def _toy(workspace: int) -> AllocStream:
    out = StreamBuilder()
    out.phase("setup")
    out.alloc(100 * MIB, "parameters")
    out.alloc(workspace, "buffers")
    for step in (1, 2):
        out.phase(f"{STEP_MARK}{step}")
        out.phase("forward")
        activation = out.alloc(10 * MIB, "activations")
        out.phase("backward")
        out.alloc(5 * MIB, "logits")
        grad = out.alloc(7 * MIB, "gradients")
        out.free(activation)
        out.free(grad)
    return out.build()


def _where(stream: AllocStream, size: int, kind: int) -> list[tuple[str, int]]:
    """(phase, step) of every request of ``size`` bytes of ``kind``."""
    found, step, phase = [], 0, "setup"
    for op, key, nbytes, _, made in stream:
        if op == PHASE:
            name = stream.phases[key]
            step, phase = (int(name.removeprefix(STEP_MARK)), phase) if name.startswith(STEP_MARK) else (step, name)
        elif op == ALLOC and nbytes == size and made == kind:
            found.append((phase, step))
    return found


def test_the_workspaces_move_from_setup_to_the_first_products() -> None:
    stream = place_workspaces(_toy(32 * MIB), 32 * MIB, STEP_MARK)
    assert _where(stream, 32 * MIB, BUFFERS) == [("forward", 1), ("backward", 1)]
    events = [e for e in stream if e[0] == ALLOC]
    first_forward = next(i for i, e in enumerate(events) if e[2] == 10 * MIB)
    first_gradient = next(i for i, e in enumerate(events) if e[4] == GRADIENTS)
    assert events[first_forward + 1][2] == 32 * MIB  # right after the forward's first request
    assert events[first_gradient + 1][2] == 32 * MIB  # right after the backward's first gradient
    workspaces = {e[1] for e in events if e[2] == 32 * MIB}
    assert not any(e[0] == FREE and e[1] in workspaces for e in stream)  # kept for the run


def test_without_a_workspace_the_stream_is_unchanged() -> None:
    toy = _toy(0)
    assert place_workspaces(toy, 0, STEP_MARK) is toy


def test_a_cuda_plan_makes_two_workspaces_and_a_cpu_plan_none() -> None:
    spec = get_gpu("H200")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes)
    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=512, global_batch=4)
    strategy = Strategy(zero_stage=2, micro_batch=4)
    coef = Coefficients()
    workspace = int(coef.cublas_workspace_bytes)
    step = single_step(workload, strategy, hardware, coef)
    assert step.resident["backward_workspace"] == workspace  # counted in the resident bytes
    stream = stream_of(step, "never")
    assert _where(stream, workspace, BUFFERS)[:2] == [("forward", 1), ("backward", 1)]
    cpu = single_step(workload, strategy, hardware, coef.with_(cublas_workspace_bytes=0.0))
    assert "backward_workspace" not in cpu.resident
    assert backward_workspace(coef.with_(cublas_workspace_bytes=0.0)) == {}

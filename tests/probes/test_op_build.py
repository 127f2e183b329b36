"""DeepSpeed's ops are built once per run, before any probe, in a child of their own (faults 1 and 2 of the H100
run, issue 15): which ops the planned strategies need, one build however many probes, a failing build as one
error line for the run (not one failed probe per strategy), and the build's time charged to no probe.

The unit tests inject the builder, the probe child and the clock (nothing depends on how fast this machine
is); the last two start the real build child on DeepSpeed's CPU accelerator.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cpu_dtype import CPU_DTYPE
from one_starter import settle_environment

import probes.ops.prepare
import probes.runner
from probes.ops.prepare import (
    BuildOutcome,
    OpBuildError,
    build_in_child,
    forget_builds,
    needed_ops,
    ops_for_configs,
    prepare_ops,
)
from probes.process.isolation import ChildRun, child_env
from probes.process.jit_lock import waiting_step
from probes.runner import run_probe
from store.errors import InputError
from store.measurements import PhaseMeasurement, ProbeRequest, ProbeResult

HARDWARE = {"gpu": "H100-80G", "gpu_memory_bytes": 80 * 2**30, "gpus": 1, "nodes": 1, "cpu_memory_bytes": 64 * 2**30}
SFT = {"kind": "sft", "model": "opt-125m", "seq_len": 16, "global_batch": 2, "dtype": CPU_DTYPE}
PPO = {"kind": "ppo", "model": "opt-125m", "prompt_len": 8, "gen_len": 8, "global_batch": 2, "dtype": CPU_DTYPE}


def sft(device: str = "cuda", timeout_s: float = 600.0, **strategy: Any) -> ProbeRequest:
    return ProbeRequest(
        workload=SFT,
        strategy={"zero_stage": 2, "micro_batch": 2, **strategy},
        hardware=HARDWARE,
        device=device,
        timeout_s=timeout_s,
    )


def ppo(device: str = "cuda", actor_offload: str = "none", hybrid_engine: bool = True) -> ProbeRequest:
    actor = {"zero_stage": 2, "offload_optimizer": actor_offload}
    strategy = {"actor": actor, "critic": {"zero_stage": 2}, "hybrid_engine": hybrid_engine}
    strategy.update(generation_batch=2, micro_batch=2)
    return ProbeRequest(workload=PPO, strategy=strategy, hardware=HARDWARE, device=device)


class FakeBuild:
    """Stands in for the build child: records each call and says ok (or fails at ``fail``)."""

    def __init__(self, fail: str | None = None, on_call: Any = None) -> None:
        self.calls: list[tuple[str, tuple[str, ...], dict[str, str], float]] = []
        self.fail = fail
        self.on_call = on_call

    def __call__(self, device: str, ops: tuple[str, ...], env: dict[str, str], timeout_s: float) -> BuildOutcome:
        self.calls.append((device, ops, env, timeout_s))
        if self.on_call is not None:
            self.on_call()
        if self.fail is None:
            return BuildOutcome(ok=True, built=ops, seconds=50.0)
        built = ops[: ops.index(self.fail)]
        return BuildOutcome(
            ok=False,
            built=built,
            failed=self.fail,
            message="ValueError: invalid literal for int() with base 10: '0a'",
            log_tail="Building extension module fused_adam...\nValueError: invalid literal for int() '0a'\n",
        )


@pytest.fixture(autouse=True)
def fresh_builds() -> Iterator[None]:
    forget_builds()
    yield
    forget_builds()


# --- which ops -----------------------------------------------------------------------------------------


def test_the_ops_follow_the_configs_the_probes_pass_to_deepspeed() -> None:
    assert needed_ops(sft()) == ("FusedAdamBuilder",)
    assert needed_ops(sft(offload_optimizer="cpu")) == ("CPUAdamBuilder",)
    assert needed_ops(sft(zero_stage=3, offload_optimizer="cpu", offload_param="cpu")) == ("CPUAdamBuilder",)
    assert needed_ops(sft(device="cpu", zero_stage=0)) == ("ShareMemCommBuilder", "FusedAdamBuilder")
    assert needed_ops(ppo(actor_offload="cpu")) == ("CPUAdamBuilder", "InferenceBuilder", "FusedAdamBuilder")
    assert needed_ops(ppo(hybrid_engine=False)) == ("FusedAdamBuilder",)
    assert needed_ops(ppo(device="cpu")) == ("ShareMemCommBuilder", "FusedAdamBuilder")  # no inference op on CPU
    with pytest.raises(InputError):
        needed_ops(sft(zero_stage=7))


def test_configs_without_deepspeeds_adam_need_no_adam_op() -> None:
    torch_adam = {"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}, "zero_optimization": {"stage": 2}}
    frozen = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    assert ops_for_configs([torch_adam, frozen], "cuda") == ()
    nvme = {"optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}
    assert ops_for_configs([nvme], "cuda") == ("CPUAdamBuilder", "AsyncIOBuilder")


# --- once per run, before the probes ---------------------------------------------------------------------


def test_prepare_builds_each_op_once_for_all_requests() -> None:
    build, notes = FakeBuild(), list[str]()
    requests = [sft(), sft(zero_stage=3), sft(offload_optimizer="cpu"), ppo(), sft(zero_stage=7)]
    done = prepare_ops(requests, on_note=notes.append, build=build)
    assert [(device, ops) for device, ops, _, _ in build.calls] == [
        ("cuda", ("FusedAdamBuilder", "CPUAdamBuilder", "InferenceBuilder"))
    ]
    assert len(notes) == 1 and "FusedAdam, CPUAdam, Inference" in notes[0] and "\n" not in notes[0]
    assert done[0].built == ("FusedAdamBuilder", "CPUAdamBuilder", "InferenceBuilder")
    assert prepare_ops(requests, on_note=notes.append, build=build) == []  # built already: nothing, no note
    assert len(build.calls) == 1 and len(notes) == 1
    prepare_ops([sft(device="cpu")], build=build)  # another device is another build
    assert build.calls[-1][:2] == ("cpu", ("ShareMemCommBuilder", "FusedAdamBuilder"))
    assert build.calls[0][3] >= 600  # its own generous timeout, not a probe's


def test_a_failing_build_is_one_error_for_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    build = FakeBuild(fail="FusedAdamBuilder")
    with pytest.raises(OpBuildError) as caught:
        prepare_ops([sft(offload_optimizer="cpu"), sft()], build=build)
    message = str(caught.value)
    assert isinstance(caught.value, InputError)  # the CLI prints it on one line and exits 2
    assert "\n" not in message and "FusedAdamBuilder" in message and "invalid literal" in message
    assert "TORCH_CUDA_ARCH_LIST='9.0'" in message
    with pytest.raises(OpBuildError, match="FusedAdamBuilder"):  # remembered: no second build
        prepare_ops([sft()], build=build)
    prepare_ops([sft(offload_optimizer="cpu")], build=build)  # the op built before the failure stays built
    assert len(build.calls) == 1

    def no_child(*args: Any, **kwargs: Any) -> ChildRun:
        raise AssertionError("no probe child may start when its ops cannot be built")

    monkeypatch.setattr(probes.runner, "run_child", no_child)
    for stage in (0, 1, 2):  # run_probe raises it too (nothing to store as one probe's "error"), no rebuild
        with pytest.raises(OpBuildError, match="FusedAdamBuilder"):
            run_probe(sft(zero_stage=stage))
    assert len(build.calls) == 1
    assert run_probe(sft(zero_stage=7)).outcome == "error"  # a refused request still answers without a build


def test_a_build_that_timed_out_waiting_on_a_lock_names_the_lock() -> None:
    """The child reports a wait on another process's JIT lock as its step (probes.process.jit_lock): the one error line
    then says which file to look at."""
    lock = Path("/home/u/.cache/torch_extensions/py311_cu130/fused_adam/lock")

    def waited(device: str, ops: tuple[str, ...], env: dict[str, str], timeout_s: float) -> BuildOutcome:
        return BuildOutcome(ok=False, message="timed out", timed_out=True, last_step=waiting_step(lock))

    with pytest.raises(OpBuildError) as caught:
        prepare_ops([sft()], build=waited)
    message = str(caught.value)
    assert "\n" not in message and f"stopped in waiting on {lock}" in message and "remove it if" in message


def test_the_cuda_note_says_how_the_arch_list_was_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    build, notes = FakeBuild(), list[str]()
    prepare_ops([sft()], on_note=notes.append, build=build)
    assert build.calls[0][2]["TORCH_CUDA_ARCH_LIST"] == "9.0"  # the build child gets what the probes get
    assert child_env("cuda", "default")["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert "'9.0a'" in notes[0] and "'9.0'" in notes[0]


def test_planner_probe_stops_with_one_error_line_and_stores_nothing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the CLI as it is (run_probe raises at the first probe): exit 2, one error line, no probe
    stored as "error" (a rerun after fixing the environment must not reuse failures)."""
    from planner.cli import main
    from store.db import open_storage

    build = FakeBuild(fail="FusedAdamBuilder")
    monkeypatch.setattr(probes.ops.prepare, "build_in_child", build)
    db = str(tmp_path / "probes.db")
    job = ["--model", "opt-125m", "--workload", "sft", "--device", "cpu", "--layers", "1", "--batch", "2"]
    job += ["--seq-len", "16"]
    assert main(["probe", *job, "--strategies", "grid", "--json", "--db", db]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("planner: error: building DeepSpeed's ops")
    assert len(build.calls) == 1
    with open_storage(db) as storage:
        assert storage.list_probes() == []


# --- the build's time is charged to no probe --------------------------------------------------------------


def test_run_probe_builds_first_and_neither_its_timeout_nor_wall_time_counts_the_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    events: list[str] = []

    def slow_build() -> None:
        events.append("build")
        now[0] += 500.0  # a 500 s JIT build, far over the probe's 5 s timeout

    def child(request: dict[str, Any], env: dict[str, str], timeout_s: float, *args: Any) -> ChildRun:
        events.append(f"child timeout={timeout_s:g}")
        now[0] += 2.0
        phase = PhaseMeasurement(name="forward", peak_allocated_bytes=1, peak_reserved_bytes=1, time_s=0.1)
        return ChildRun(returncode=0, timed_out=False, wall_s=2.0, result=ProbeResult("ok", (phase,)).to_dict())

    build = FakeBuild(on_call=slow_build)
    monkeypatch.setattr(probes.runner, "_clock", lambda: now[0])
    monkeypatch.setattr(probes.runner, "run_child", child)
    monkeypatch.setattr(probes.ops.prepare, "build_in_child", build)
    first = run_probe(sft(device="cpu", timeout_s=5.0))
    second = run_probe(sft(device="cpu", timeout_s=5.0, zero_stage=3))
    assert events == ["build", "child timeout=5", "child timeout=5"]
    assert first.outcome == second.outcome == "ok"
    assert first.wall_s == pytest.approx(2.0) and second.wall_s == pytest.approx(2.0)


# --- the real build child (DeepSpeed's CPU accelerator) -------------------------------------------------


@pytest.mark.slow
def test_the_build_child_loads_the_cpu_ops() -> None:
    """cpu_adam and the shared-memory allreduce: built once (about a minute on 2 cores), then loaded."""
    settle_environment()
    outcome = build_in_child("cpu", ("ShareMemCommBuilder", "CPUAdamBuilder"), child_env("cpu", "default"), 1800.0)
    assert outcome.ok, (outcome.message, outcome.log_tail[-2000:])
    assert "CPUAdamBuilder" in outcome.built
    assert set(outcome.built) | set(outcome.skipped) == {"ShareMemCommBuilder", "CPUAdamBuilder"}


@pytest.mark.slow
def test_a_real_failing_build_is_one_line() -> None:
    """The CPU accelerator has no inference op: its builder raises, and the run gets one line saying so."""
    settle_environment()

    def inference_op(device: str, ops: tuple[str, ...], env: dict[str, str], timeout_s: float) -> BuildOutcome:
        return build_in_child(device, ("InferenceBuilder",), env, timeout_s)

    with pytest.raises(OpBuildError) as caught:
        prepare_ops([sft(device="cpu")], build=inference_op)
    message = str(caught.value)
    assert "\n" not in message and "InferenceBuilder" in message and "not been implemented" in message


@pytest.mark.slow
def test_probing_cuda_without_a_gpu_stops_before_any_probe() -> None:
    """The build child is the first to import torch for the run: no CUDA device is one line, not N errors."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(OpBuildError, match="no CUDA device"):
        prepare_ops([sft(device="cuda")])

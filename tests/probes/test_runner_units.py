"""The probe runner's pure parts: request checks and layer cuts, the child's environment, outcome mapping,
OOM classification, phase bookkeeping and the empty_cache table. No child process is started here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tiny_models import make_hardware, tiny_llama_hf_config

from probes.model.build import cut_spec, frozen_config_like, plan_from_request
from probes.process.isolation import EXPANDABLE, ChildRun, child_env
from probes.runner import _result, run_probe
from probes.step.child import describe, is_oom
from probes.step.phases import EMPTY_CACHE_AFTER, PHASES, PhaseClock, empties_after
from store.errors import InputError
from store.measurements import ProbeRequest
from store.models import get_model, spec_from_hf_config

REPO_ROOT = Path(__file__).resolve().parents[2]
LLAMA = {"model_type": "llama", **tiny_llama_hf_config(), "num_hidden_layers": 3}


def request(**changes: Any) -> ProbeRequest:
    workload = {
        "kind": "sft",
        "model": "tiny-llama",
        "seq_len": 16,
        "global_batch": 2,
        "dtype": "bf16",
        "hf_configs": {"model": LLAMA},
    }
    values: dict[str, Any] = {
        "workload": workload,
        "strategy": {"zero_stage": 0, "micro_batch": 2},
        "hardware": make_hardware().to_dict(),
    }
    values.update(changes)
    return ProbeRequest(**values)


# --- request -> plan ------------------------------------------------------------------------------


def test_plan_rebuilds_specs_from_hf_configs_and_cuts_layers() -> None:
    plan = plan_from_request(request(layers=2))
    assert plan.layers == 2 and plan.workload.model.num_layers == 2
    assert plan.workload.model.total_params == spec_from_hf_config("x", {**LLAMA, "num_hidden_layers": 2}).total_params
    assert plan_from_request(request()).layers == 3
    assert plan_from_request(request(layers=10)).layers == 3  # a cut deeper than the model keeps it whole


def test_cut_uses_gpt2s_layer_key_and_catalog_names_work() -> None:
    gpt2 = get_model("gpt2")
    cut = cut_spec(gpt2, 1)
    assert cut.num_layers == 1 and cut.hf_config["n_layer"] == 1
    assert cut.total_params == gpt2.total_params - (gpt2.num_layers - 1) * gpt2.layer_params
    workload = {"kind": "sft", "model": "gpt2", "seq_len": 8, "global_batch": 1}
    assert plan_from_request(request(workload=workload, layers=2)).workload.model.num_layers == 2


def test_plan_refuses_more_than_one_node_or_cpu_rank_and_bad_input() -> None:
    assert plan_from_request(request(hardware=make_hardware(gpus=4).to_dict())).hardware.world_size == 4
    assert plan_from_request(request(device="cuda", hardware=make_hardware(gpus=8).to_dict())).hardware.gpus == 8
    with pytest.raises(InputError, match="at most 4 ranks, not gpus=8"):
        plan_from_request(request(hardware=make_hardware(gpus=8).to_dict()))
    with pytest.raises(InputError, match="one node, but the hardware has 2 nodes"):
        plan_from_request(request(hardware=make_hardware(gpus=1, nodes=2).to_dict()))
    with pytest.raises(InputError, match="micro_batch"):
        plan_from_request(request(strategy={"zero_stage": 0, "micro_batch": 0}))
    with pytest.raises(InputError, match="device"):
        plan_from_request(request(device="tpu"))
    with pytest.raises(InputError, match="cpu device only"):
        plan_from_request(request(device="cuda", memory_cap_bytes=10))


def test_run_probe_answers_refusals_without_a_child() -> None:
    result = run_probe(request(hardware=make_hardware(gpus=2, nodes=2).to_dict()))
    assert result.outcome == "error"
    assert "one node, but the hardware has 2 nodes" in result.message
    assert result.phases == () and result.fingerprint is not None and result.wall_s < 5


def test_frozen_config_like_follows_trl() -> None:
    trained = {
        "train_batch_size": 2,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW"},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
    }
    frozen = frozen_config_like(trained)
    assert "optimizer" not in frozen and "gradient_clipping" not in frozen
    assert frozen["zero_optimization"] == {"stage": 3, "offload_param": {"device": "cpu"}}
    assert frozen_config_like({**trained, "zero_optimization": {"stage": 2}})["zero_optimization"] == {"stage": 0}


# --- the child's environment ------------------------------------------------------------------------


def test_child_env_sets_one_rank_and_the_allocator_before_torch() -> None:
    base = {"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6", "PYTHONPATH": "/x"}
    cuda = child_env("cuda", "expandable-segments", base)
    assert cuda["PYTORCH_CUDA_ALLOC_CONF"] == EXPANDABLE == "expandable_segments:True"
    assert cuda["DS_ACCELERATOR"] == "cuda"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in child_env("cuda", "default", base)
    cpu = child_env("cpu", "default", base)
    assert cpu["DS_ACCELERATOR"] == "cpu" and cpu["CUDA_VISIBLE_DEVICES"] == ""
    for env in (cuda, cpu):
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "0", "1", "127.0.0.1")
        assert 0 < int(env["MASTER_PORT"]) < 65536
        assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/x"]


def test_importing_probes_loads_no_torch() -> None:
    code = (
        "import sys, probes, probes.runner, probes.model.build, probes.process.isolation, probes.step.phases, "
        "probes.measure.fingerprint; "
        "from probes import run_probe, PHASES; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed', 'transformers')]; "
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# --- outcomes -------------------------------------------------------------------------------------------


def test_child_reports_become_results() -> None:
    req = request(timeout_s=5)
    events = [{"phase": "startup", "rss": 10}, {"fingerprint": {"device": "cpu", "name": "x", "total_memory_bytes": 1}}]
    events.append({"phase": "setup", "rss": 30})
    timeout = _result(ChildRun(None, True, 5.1, 77, events, None, "log"), req, 3, 5.2)
    assert (timeout.outcome, timeout.failed_phase, timeout.host_rss_peak_bytes) == ("timeout", "setup", 30)
    assert "5 s in phase setup" in timeout.message and timeout.fingerprint.name == "x"
    killed = _result(ChildRun(-signal.SIGKILL, False, 1.0, 78, events[:1], None, "tail"), req, 3, 1.0)
    assert killed.outcome == "error" and "SIGKILL" in killed.message and killed.failed_phase == "startup"
    assert killed.extra["log_tail"] == "tail" and killed.fingerprint.device == "cpu"
    crashed = _result(ChildRun(3, False, 1.0, 79, [], None, ""), req, 3, 1.0)
    assert crashed.outcome == "error" and "exited with code 3" in crashed.message and crashed.failed_phase is None
    report = {"outcome": "oom", "failed_phase": "backward", "message": "ProbeOOM: cap", "layers": 3, "extra": {}}
    oom = _result(ChildRun(0, False, 2.0, 80, events, report, "tail"), req, 3, 2.5)
    assert (oom.outcome, oom.failed_phase, oom.wall_s, oom.layers) == ("oom", "backward", 2.5, 3)


def test_oom_classification() -> None:
    from probes.measure.tracker import ProbeOOM

    assert is_oom(ProbeOOM("probe memory cap: ..."))
    assert is_oom(MemoryError())
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    try:
        try:
            raise ProbeOOM("probe memory cap")
        except ProbeOOM as inner:
            raise RuntimeError("hook failed") from inner
    except RuntimeError as outer:
        assert is_oom(outer)
    assert not is_oom(ValueError("This op had not been implemented on CPU backend."))
    assert describe(KeyError("gelu_nope")) == "KeyError: 'gelu_nope'"
    assert describe(RuntimeError("first\nsecond")) == "RuntimeError: first"


# --- phases ---------------------------------------------------------------------------------------------


class FakeTracker:
    def __init__(self) -> None:
        self.current = self.peak = 100

    def reset_peak(self) -> None:
        self.peak = self.current


def test_phase_clock_folds_micro_steps_and_skips_the_warmup() -> None:
    tracker = FakeTracker()
    seen: list[str] = []
    clock = PhaseClock("cpu", "after-phase", tracker, on_phase=seen.append)
    for step, sizes in enumerate(([900, 50], [300, 200], [400, 100])):
        clock.start_step()
        for size in sizes:  # two micro-steps per step
            with clock.phase("forward"):
                tracker.peak = tracker.current + size
            with clock.phase("backward"):
                tracker.peak = tracker.current + 2 * size
        with clock.phase("optimizer_step"):
            clock.end_step()
        clock.finish_step(measured=step > 0)
    names = [m.name for m in clock.measurements()]
    assert names == ["forward", "backward", "optimizer_step"]
    forward, backward, _ = clock.measurements()
    assert forward.peak_allocated_bytes == forward.peak_reserved_bytes == 100 + 400  # warm-up's 100 + 900 left out
    assert backward.peak_allocated_bytes == 100 + 800
    assert clock.measured_steps == 2 and clock.cache_calls == 3 * 5  # after-phase: every phase, CPU: counted
    assert seen[:3] == ["forward", "backward", "forward"]


def test_empty_cache_table_matches_the_planner_runtime() -> None:
    from planner.runtime import PHASES as RLHF_PHASES
    from planner.runtime import POLICY_TABLE

    assert set(EMPTY_CACHE_AFTER) == set(POLICY_TABLE)
    for policy, events in POLICY_TABLE.items():
        for event in (*RLHF_PHASES, "end_step"):
            assert empties_after(policy, event) == (event in events), (policy, event)
    assert empties_after("after-inference", "reference_forward")
    assert not empties_after("after-generation", "reference_forward")
    assert PHASES["ppo"] == RLHF_PHASES
    assert PHASES["dpo"] == ("reference_forward", "forward", "backward", "optimizer_step")

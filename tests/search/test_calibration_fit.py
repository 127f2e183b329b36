"""The calibration fit (search.calibration): a bounded least-squares solver, and a fit that finds the
coefficients a device's measurements were made with, keeps the ones they do not determine, and reports
its errors before, after and held out."""

from __future__ import annotations

import math

import pytest

from search import predict, screen
from search.calibration import PARAMETERS, Observation, apply_values, calibrate, predicted_quantities
from search.calibration.fit import DETERMINED
from search.calibration.solver import levenberg_marquardt
from search.coefficients import DEFAULT_COEFFICIENTS
from store.gpus import get_gpu
from store.models import get_model, with_layers
from store.records import Hardware, Strategy, Workload

H100 = Hardware(gpu=get_gpu("H100"), gpu_memory_bytes=get_gpu("H100").memory_bytes, cpu_memory_bytes=256 * 2**30)
# A device slower than the catalog says in its matmuls and its host, faster over PCIe.
TRUE_VALUES = {
    "gpu.matmul_efficiency": 0.45,
    "host_s_per_kernel": 7e-5,
    "gpu.pcie_efficiency": 0.55,
}
FRAGMENT_COEFFICIENTS = ("frag_within_step", "frag_carried", "frag_inference_carried", "frag_zero3_factor")
STRATEGIES = [
    Strategy(zero_stage=0, micro_batch=1, grad_accum=8),
    Strategy(zero_stage=2, micro_batch=8, grad_accum=1),
    Strategy(zero_stage=2, micro_batch=4, grad_accum=2, gradient_checkpointing=True),
    Strategy(zero_stage=3, micro_batch=8, grad_accum=1),
    Strategy(zero_stage=2, offload_optimizer="cpu", micro_batch=8, grad_accum=1),
    Strategy(zero_stage=1, micro_batch=2, grad_accum=4),
]


def _workload(model: str, seq_len: int, layers: int | None = None) -> Workload:
    spec = get_model(model) if layers is None else with_layers(get_model(model), layers)
    return Workload(kind="sft", model=spec, seq_len=seq_len, global_batch=8)


def _measured_with(values: dict[str, float], layers: int | None = None) -> list[Observation]:
    """Probes of several jobs as a device with ``values`` would measure them: the cost model's own numbers
    (with ``layers``, of the models cut to that many decoder layers: fewer allocator events to replay)."""
    jobs = [(_workload("opt-1.3b", 512, layers), s) for s in STRATEGIES]
    jobs.append((_workload("llama-3.2-1b", 1024, layers), STRATEGIES[1]))
    out = []
    for i, (workload, strategy) in enumerate(jobs):
        keys = [(phase, q) for phase in ("forward", "backward", "optimizer_step") for q in ("time", "peak_reserved")]
        blank = Observation(f"probe{i}", workload, strategy, H100, "cuda", tuple((s, q, 1.0) for s, q in keys))
        truth = predicted_quantities(blank, values, DEFAULT_COEFFICIENTS)
        out.append(
            Observation(blank.label, workload, strategy, H100, "cuda", tuple((s, q, truth[(s, q)]) for s, q in keys))
        )
    return out


def test_the_solver_finds_a_bounded_minimum() -> None:
    # r = (t0 - 1, t1 - 5, 10 (t0 - t1) - 10 (1 - 5)) is zero at (1, 5); t1 is bounded by 3, so it stops at
    # the bound and t0 follows the coupling (the least squares of t0 - 1 and 10 (t0 - 3 + 4)).
    def residuals(t: list[float]) -> list[float]:
        return [t[0] - 1, t[1] - 5, 10 * (t[0] - t[1]) + 40]

    solution = levenberg_marquardt(residuals, [0.0, 0.0], [-10.0, -10.0], [10.0, 3.0], data_count=3)
    assert solution.theta[1] == pytest.approx(3.0)
    expected_t0 = (1 + 100 * (3 - 4)) / (1 + 100)  # d/dt0 of (t0-1)^2 + (10 t0 + 10)^2 = 0
    assert solution.theta[0] == pytest.approx(expected_t0, abs=1e-4)


def test_a_fit_finds_the_coefficients_the_device_measured_with() -> None:
    observations = _measured_with(TRUE_VALUES)
    fit = calibrate(observations)
    # the defaults miss this device; the fit and the held-out predictions follow it
    assert fit.before["time"].median_abs > 0.15
    assert fit.after["time"].median_abs < 0.02
    assert fit.held_out["time"].median_abs < 0.05
    # the strongly determined ones come back close to the truth (the prior pulls a little toward the default)
    assert fit.values["host_s_per_kernel"] == pytest.approx(TRUE_VALUES["host_s_per_kernel"], rel=0.1)
    assert fit.values["gpu.matmul_efficiency"] == pytest.approx(TRUE_VALUES["gpu.matmul_efficiency"], rel=0.15)
    assert fit.values["gpu.pcie_efficiency"] == pytest.approx(TRUE_VALUES["gpu.pcie_efficiency"], rel=0.15)


def test_reserved_comes_from_the_replay_which_no_fitted_coefficient_moves() -> None:
    """Peak reserved is the allocator replay's: a device with more fragments than the defaults is no
    different to a prediction (the fragment coefficients only screen a search), so they are not calibrated."""
    fit = calibrate(_measured_with(TRUE_VALUES), leave_one_out=False)
    assert fit.before["peak_reserved"].median_abs == fit.after["peak_reserved"].median_abs == 0.0
    assert not {p.name for p in PARAMETERS} & set(FRAGMENT_COEFFICIENTS)
    workload, strategy = _workload("opt-1.3b", 512), STRATEGIES[1]
    doubled = {name: 2 * getattr(DEFAULT_COEFFICIENTS, name) for name in FRAGMENT_COEFFICIENTS}
    more = DEFAULT_COEFFICIENTS.with_(**doubled)
    assert predict(workload, strategy, H100, more).peak_reserved_bytes == (
        predict(workload, strategy, H100, DEFAULT_COEFFICIENTS).peak_reserved_bytes
    )
    assert screen(workload, strategy, H100, more).peak_reserved_bytes > (
        screen(workload, strategy, H100, DEFAULT_COEFFICIENTS).peak_reserved_bytes
    )


def test_what_the_probes_do_not_determine_keeps_its_default() -> None:
    fit = calibrate(_measured_with(TRUE_VALUES), leave_one_out=False)
    # no probe ran NVMe offload, several GPUs or empty_cache: nothing in them moves these
    for name in ("nvme_gbps", "network_efficiency", "empty_cache_call_s"):
        assert fit.sensitivity[name] < DETERMINED and name not in fit.values
    assert fit.held_out == {}  # not asked for


def test_fitted_values_stay_within_their_bounds() -> None:
    # the same jobs cut to two layers: the solver walks far from the defaults here (each of its steps replays
    # every job), and a bound holds whatever the depth of the models measured
    observations = _measured_with({}, layers=2)
    absurd = [
        Observation(
            o.label, o.workload, o.strategy, o.hardware, o.device, tuple((s, q, v * 1e6) for s, q, v in o.measured)
        )
        for o in observations
    ]
    fit = calibrate(absurd, leave_one_out=False)
    for p in PARAMETERS:
        value = fit.values.get(p.name, fit.defaults[p.name])
        assert p.lower * (1 - 1e-9) <= value <= p.upper * (1 + 1e-9), p.name
    assert fit.values["gpu.matmul_efficiency"] < 1e-3  # a million times slower: the rate went down, bounded


def test_values_apply_to_the_gpu_entry_and_the_coefficients() -> None:
    hardware, coef = apply_values(H100, DEFAULT_COEFFICIENTS, {"gpu.hbm_efficiency": 0.5, "step_overhead_s": 0.2})
    assert hardware.gpu.hbm_efficiency == 0.5 and hardware.gpu.name == "H100-80G" and coef.step_overhead_s == 0.2
    assert H100.gpu.hbm_efficiency != 0.5 and DEFAULT_COEFFICIENTS.step_overhead_s != 0.2  # copies, not changes
    slower = _measured_with({"gpu.hbm_efficiency": 0.01})[1]
    faster = _measured_with({})[1]
    step = ("optimizer_step", "time")
    assert (
        dict(((s, q), v) for s, q, v in slower.measured)[step] > dict(((s, q), v) for s, q, v in faster.measured)[step]
    )
    assert all(math.isfinite(v) for _, _, v in slower.measured)


def test_the_one_step_held_out_fit_agrees_with_a_refit() -> None:
    """Held out by one Gauss-Newton step on the full fit's Jacobian, or by refitting without the probe: the
    same errors, within a small fraction of them."""
    observations = _measured_with({**TRUE_VALUES, "gpu.hbm_efficiency": 0.5})
    step = calibrate(observations)
    refit = calibrate(observations, refit=True)
    for quantity in ("time", "peak_reserved"):
        assert step.held_out[quantity].median_abs == pytest.approx(refit.held_out[quantity].median_abs, abs=0.01)
    assert len(step.held_out_detail) == sum(len(o.measured) for o in observations)


def test_a_rate_on_the_clock_that_does_not_bind_is_still_found() -> None:
    """A device whose matmuls run 400 times below the catalog's rate: at the defaults every pass is bound by
    the host's kernel issuing, so the matmul share has no gradient there; the coarse start finds it anyway
    (the CPU backend is such a device)."""
    slow = {"gpu.matmul_efficiency": 0.002, "host_s_per_kernel": 6e-5}
    fit = calibrate(_measured_with(slow), leave_one_out=False)
    assert fit.before["time"].median_abs > 0.9  # the defaults predict a tenth of the time, or less
    assert fit.after["time"].median_abs < 0.05
    assert fit.values["gpu.matmul_efficiency"] == pytest.approx(0.002, rel=0.3)

"""Predictions against the GPU measurements in tests/data/gpu/ (issue 15, part 1).

Every records file there is predicted through the public API (``planner.calibration.records``) and each measured
quantity is held inside the issue's bounds: per SFT row (user-style loop) peak allocated within 5%, peak
reserved within -5%..+8%, step time within 20%; per PPO probe phase time within 25% and reserved within 8%;
and the predicted effect of ``empty_cache`` after inference on peak reserved within 3 points of the measured
one. A new device's file joins by being dropped in. No GPU is needed: the measurements are stored.

The quantities the cost model does not yet meet are listed in ``NOT_YET`` with the reason; they run as strict
xfails, so a change that brings one inside its bound fails here until it is taken off the list.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.calibration.records import RecordComparison, compare_records, load_records

RECORDS = sorted((Path(__file__).resolve().parents[1] / "data" / "gpu").glob("*.json"))

SFT_BOUNDS = {"peak_allocated": (-0.05, 0.05), "peak_reserved": (-0.05, 0.08), "time": (-0.20, 0.20)}
PPO_BOUNDS = {"peak_reserved": (-0.08, 0.08), "time": (-0.25, 0.25)}
EMPTY_CACHE_POINTS = 0.03

_RLHF_TIME = (
    "H100 never probe: PPO training phases predicted at 0.23 s against 0.33 and 0.31 s (27-30% under); this run "
    "was slow on every phase, the host's (generation 4.77 s against 3.93 s in the after-inference probe of the same "
    "strategy). The same probe on the H200 (h200-2026-11-27.json, 3aa0e728f166) measured 0.242 and 0.223 s against "
    "0.226 predicted (-7%, +1%), and its profile places the phases on the host: 9,079 kernels in actor_training, "
    "the GPU active 87 ms of 408 (benchmarks/results/h200_profiles.md). The H100 run's extra 80-100 ms is that "
    "host's, which the default host_s_per_kernel cannot know"
)
_H200_ZERO3_OFFLOAD = (
    "H200, opt-1.3b ZeRO-3 + CPU optimizer offload, mb 8 x 1024, in measure_sft.py: reserved 12,900 MiB against "
    "11,272 replayed (-12.6%; allocated within 0.1%, the init exact). memplan's own probe of the same strategy "
    "(h200-2026-11-27.json, 8 MiB reduce bucket) reserved 10.16 GiB against 10.10: the loop's extra 1,542 MiB beyond "
    "its 954 MiB bucket is this program's. Ruled out from DeepSpeed 0.19.8's code: bucket-sized casts or copies in "
    "the flush, the deferred offload pass, gathers on one rank, device temporaries in the offloaded step; and "
    "record_stream up to DeepSpeed's own bound (every lower layer's gradient pending until flush j + 3 or the "
    "epilogue: 2,209 MiB pending, +2 MiB reserved; the allocator port models the rule, "
    "benchmarks/zero3_record_stream_bound.py). Cause not established: benchmarks/results/zero3_offload_loop_gap.md; "
    "benchmarks/gpu/zero3_offload_segments.py settles it on a GPU"
)
_H200_DECODE_HOST = (
    "H200 host, opt-1.3b PPO generation (HF decode, hybrid engine): 3.73 s measured against 4.75 predicted (+27%). "
    "The phase is bound by the host's kernel issue (121,627 kernels in the profiled step, the GPU active 0.58 s): "
    "30.7 us per kernel on this host against the 39 us that coef.host_s_per_kernel carries from the H100 host of "
    "the shared records (whose two runs of this probe took 3.93 and 4.77 s). A host's issue rate is what "
    "planner calibrate fits from the user's own probes; the default stays one host's figure"
)
NOT_YET: dict[tuple[str, str, str], str] = {
    ("3aa0e728f166", "generation", "time"): _H200_DECODE_HOST,
    ("38187ad8c1ed", "actor_training", "time"): _RLHF_TIME,
    ("38187ad8c1ed", "critic_training", "time"): _RLHF_TIME,
    ("opt13_z3ckoff_mb8_s1024", "step", "peak_reserved"): _H200_ZERO3_OFFLOAD,
}


def _comparisons() -> list[RecordComparison]:
    return [c for path in RECORDS for c in compare_records(path)]


COMPARISONS = _comparisons()


def _cases() -> list[object]:
    cases = []
    for c in COMPARISONS:
        if c.kind == "sft":
            bounds = SFT_BOUNDS
        elif c.workload in ("ppo", "remax", "grpo"):
            bounds = PPO_BOUNDS
        else:
            continue  # SFT probes: benchmarks/shared_gpu_records.py reports them
        for scope, quantities in c.quantities.items():
            for quantity, (low, high) in bounds.items():
                if quantity == "time" and not c.time_comparable:
                    continue
                key = (c.record_id, scope, quantity)
                marks = [pytest.mark.xfail(strict=True, reason=NOT_YET[key])] if key in NOT_YET else []
                compared = quantities[quantity]
                cases.append(pytest.param(compared, low, high, id="-".join(key), marks=marks))
    return cases


def test_records_are_in_the_project() -> None:
    assert RECORDS, "tests/data/gpu/ holds no records"
    for path in RECORDS:
        data = load_records(path)
        assert data["sft"] or data["probes"]


@pytest.mark.parametrize(("compared", "low", "high"), _cases())
def test_prediction_within_bound(compared, low: float, high: float) -> None:
    assert low <= compared.error <= high, (
        f"predicted {compared.predicted:.4g}, measured {compared.measured:.4g}: {compared.error:+.1%}"
    )


def test_every_sft_row_and_ppo_phase_is_compared() -> None:
    """Nothing in the files is skipped silently: every SFT row and every finished PPO probe's phases."""
    for path in RECORDS:
        data = load_records(path)
        ids = {c.record_id for c in COMPARISONS}
        assert {row["id"] for row in data.get("sft", [])} <= ids
        finished = [p for p in data.get("probes", []) if p["result"]["outcome"] == "ok"]
        assert {p["probe_id"] for p in finished} <= ids


def test_time_model_names_its_dominant_term() -> None:
    """Each prediction says which mechanism takes most of the step (host-bound small batches, GEMMs at 16k
    tokens per micro-batch, CPU Adam with offload)."""
    by_id = {c.record_id: c for c in COMPARISONS}
    assert by_id["opt13_z2_mb4_s512"].dominant_time_term in ("host_launch", "deepspeed_per_tensor")
    assert by_id["opt13_z2ck_mb16_s1024"].dominant_time_term == "matmul"
    assert by_id["opt13_z2off_mb8_s512"].dominant_time_term == "cpu_adam"


def _ppo_pairs() -> list[tuple[dict, dict]]:
    """PPO probes of one file that differ only in ``empty_cache`` (never vs after-inference)."""
    pairs = []
    for path in RECORDS:
        probes = [p for p in load_records(path).get("probes", []) if p["result"]["outcome"] == "ok"]
        for never in probes:
            s = never["request"]["strategy"]
            if never["request"]["workload"]["kind"] != "ppo" or s.get("empty_cache") != "never":
                continue
            for other in probes:
                o = other["request"]["strategy"]
                if o.get("empty_cache") == "after-inference" and {**o, "empty_cache": "never"} == s:
                    pairs.append((never, other))
    return pairs


def _empty_cache_effects(quantity: str) -> list[tuple[float, float]]:
    """(predicted, measured) effect of empty_cache after inference on the step's peak ``quantity``
    (``peak_reserved`` or ``replay_peak_reserved``), per never/after-inference pair of PPO probes."""
    by_id = {c.record_id: c for c in COMPARISONS}

    def peak(c: RecordComparison, which: str) -> float:
        return max(getattr(q[quantity], which) for q in c.quantities.values())

    effects = []
    for never, after in _ppo_pairs():
        n, a = by_id[never["probe_id"]], by_id[after["probe_id"]]
        effects.append((peak(a, "predicted") / peak(n, "predicted") - 1, peak(a, "measured") / peak(n, "measured") - 1))
    return effects


def test_empty_cache_effect_within_three_points() -> None:
    assert _ppo_pairs(), "no PPO probe pair differing only in empty_cache"
    for predicted, measured in _empty_cache_effects("peak_reserved"):
        assert abs(predicted - measured) <= EMPTY_CACHE_POINTS, (predicted, measured)


# The engines' init replayed through the allocator port (search.streams.init, search.allocator) against what
# the H100 reserved once deepspeed.initialize returned (torch.cuda.memory_reserved()).
INIT_BOUND = 0.05
INIT_NOT_YET: dict[str, str] = {}  # record id -> why its init is not yet replayed within the bound


def _init_cases() -> list[object]:
    cases = []
    for c in COMPARISONS:
        compared = c.quantities.get("step", {}).get("replay_after_init_reserved")
        if compared is None:
            continue
        marks = (
            [pytest.mark.xfail(strict=True, reason=INIT_NOT_YET[c.record_id])] if c.record_id in INIT_NOT_YET else []
        )
        cases.append(pytest.param(compared, id=c.record_id, marks=marks))
    return cases


@pytest.mark.parametrize("compared", _init_cases())
def test_replayed_engine_init_reserves_what_the_gpu_reserved(compared) -> None:
    """The loaded weights, DeepSpeed's flat copies, the 16-bit clone of the fp32 master and the dropped zero
    gradient leave blocks cached; the replay of those allocations reserves what the device reserved."""
    assert abs(compared.error) <= INIT_BOUND, (
        f"replayed {compared.predicted / 2**30:.2f} GiB, measured {compared.measured / 2**30:.2f} GiB: "
        f"{compared.error:+.1%}"
    )


def test_init_replay_covers_every_sft_row_with_an_after_init_figure() -> None:
    rows = [r for path in RECORDS for r in load_records(path).get("sft", [])]
    with_init = {r["id"] for r in rows if r["measured"].get("after_init_reserved_bytes")}
    assert with_init and with_init == {case.id for case in _init_cases()}


# The whole step replayed through the allocator port (search.streams, search.allocator) against the peak the
# device reserved, with the suite's bounds. The stream makes DeepSpeed's gradient tensors as its code does
# (search.model.moments' named tensors: ZeRO-2's partition from the first bucket flush, on the reduction
# stream under overlap_comm; the step's norm, flat and fp32 copies; FP16_Optimizer's upcasts) and the loss's
# (transformers' cross-entropy: the fp32 upcast and log-softmax, the NLL's and log-softmax's gradients).
REPLAY_NOT_YET: dict[tuple[str, str], str] = {  # (record id, scope) -> why its replay is not yet in bounds
    ("opt13_z3ckoff_mb8_s1024", "step"): _H200_ZERO3_OFFLOAD,
}


def _replay_cases() -> list[object]:
    cases = []
    for c in COMPARISONS:  # SFT loop rows and SFT probes with the SFT rows' bounds, RLHF probes with PPO's
        low, high = (
            PPO_BOUNDS["peak_reserved"] if c.workload in ("ppo", "remax", "grpo") else SFT_BOUNDS["peak_reserved"]
        )
        for scope, quantities in c.quantities.items():
            key = (c.record_id, scope)
            marks = [pytest.mark.xfail(strict=True, reason=REPLAY_NOT_YET[key])] if key in REPLAY_NOT_YET else []
            cases.append(pytest.param(quantities["replay_peak_reserved"], low, high, id="-".join(key), marks=marks))
    return cases


@pytest.mark.parametrize(("compared", "low", "high"), _replay_cases())
def test_replayed_step_reserves_what_the_gpu_reserved(compared, low: float, high: float) -> None:
    assert low <= compared.error <= high, (
        f"replayed {compared.predicted / 2**30:.2f} GiB, measured {compared.measured / 2**30:.2f} GiB: "
        f"{compared.error:+.1%}"
    )


def test_replayed_empty_cache_effect_within_three_points() -> None:
    """never vs after-inference, both replayed: the effect on the step's peak reserved is the measured one."""
    for replayed, measured in _empty_cache_effects("replay_peak_reserved"):
        assert abs(replayed - measured) <= EMPTY_CACHE_POINTS, (replayed, measured)


# Never under (issue 46): a plan that says it fits must fit, so no record's predicted peak reserved may be more
# than 3% under what the device reserved. Those not yet there are strict xfails with their causes.
NEVER_UNDER = -0.03
UNDER_NOT_YET: dict[tuple[str, str], str] = {
    ("opt13_z3ckoff_mb8_s1024", "step"): _H200_ZERO3_OFFLOAD,
}


def _under_cases() -> list[object]:
    cases = []
    for c in COMPARISONS:
        for scope, quantities in c.quantities.items():
            key = (c.record_id, scope)
            marks = [pytest.mark.xfail(strict=True, reason=UNDER_NOT_YET[key])] if key in UNDER_NOT_YET else []
            cases.append(pytest.param(quantities["peak_reserved"], id="-".join(key), marks=marks))
    return cases


@pytest.mark.parametrize("compared", _under_cases())
def test_predicted_reserved_is_never_more_than_three_percent_under(compared) -> None:
    assert compared.error >= NEVER_UNDER, (
        f"predicted {compared.predicted / 2**30:.2f} GiB, measured {compared.measured / 2**30:.2f} GiB: "
        f"{compared.error:+.1%}"
    )

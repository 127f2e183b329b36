"""A plan's spread of peak reserved from the measured records nearest its kind (search.spread, issue 46 A).

The residual rows here are real ``store.residuals.Residual`` values written for the case (measured and predicted
bytes chosen so each record's under-prediction is known), looked up the way a plan looks up the shipped table.
"""

from __future__ import annotations

import pytest

from search import DEFAULT_COEFFICIENTS as C
from search import predict
from search.spread import SpreadKind, kind_of, measured_spread, with_measured_spread
from search.step.assemble import gpu_budget_bytes
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, RLHFStrategy, Strategy, TrainedModelStrategy, Workload
from store.residuals import Residual, load_residuals

GiB = 2**30
Z2 = SpreadKind(zero_stage=2, offload="none", checkpointing=True, large_vocab=False, rlhf=False)


def _row(name: str, kind: SpreadKind, measured_gib: float, predicted_gib: float) -> Residual:
    return Residual(
        record=f"case.json:{name}",
        source="probe",
        workload="sft",
        model="opt-1.3b",
        gpu="H100-80G",
        kind=kind.to_dict(),
        scope="backward",
        measured_reserved_bytes=int(measured_gib * GiB),
        predicted_reserved_bytes=int(predicted_gib * GiB),
    )


ROWS = (
    _row("z2a", Z2, 40.0, 39.0),  # 2.5% under
    _row("z2b", Z2, 40.0, 40.4),  # over: counts as 0
    _row("z3", SpreadKind(3, "none", True, False, False), 40.0, 38.0),  # 5% under
    _row("z0", SpreadKind(0, "none", False, False, False), 40.0, 34.0),  # 15% under
)


def test_records_of_the_plans_kind_give_their_worst_under_prediction_plus_the_margin() -> None:
    found = measured_spread(Z2, C, ROWS)
    assert found.near and found.distance == 0 and found.differs_in == ()
    assert found.records == ("case.json:z2a", "case.json:z2b") and found.worst_record == "case.json:z2a"
    assert found.under == pytest.approx(1 - 39.0 / 40.0)
    assert found.spread == pytest.approx(0.025 + C.reserved_spread_margin)
    assert found.to_dict()["count"] == 2


def test_records_one_mechanism_away_are_used_and_named() -> None:
    offloaded = SpreadKind(2, "optimizer", True, False, False)
    found = measured_spread(offloaded, C, ROWS)
    assert found.near and found.distance == 1 and found.differs_in == ("offload",)
    assert set(found.records) == {"case.json:z2a", "case.json:z2b"}
    z3_large = SpreadKind(3, "none", True, True, False)  # the ZeRO-3 row differs in the vocabulary only
    assert measured_spread(z3_large, C, ROWS).spread == pytest.approx(0.05 + C.reserved_spread_margin)


def test_no_near_record_keeps_the_widest_and_says_so() -> None:
    far = SpreadKind(3, "optimizer+param", False, True, True)
    found = measured_spread(far, C, ROWS)
    assert not found.near and found.records == () and found.distance is not None and found.distance > 1
    assert found.worst_record == "case.json:z0"
    assert found.spread == pytest.approx(1 - 34.0 / 40.0 + C.reserved_spread_margin)
    assert found.spread >= max(measured_spread(row_kind, C, ROWS).spread for row_kind in (Z2,))


def test_without_a_table_the_fixed_spread_stays() -> None:
    found = measured_spread(Z2, C, ())
    assert found.spread == pytest.approx(C.reserved_spread) and found.distance is None and not found.near


def test_a_programs_factor_multiplies_the_records_spread() -> None:
    """The program reserves its factor times memplan's probe, which reserves at most 1 + spread of the prediction."""
    plain = measured_spread(Z2, C, ROWS)
    program = measured_spread(Z2, C.with_(program_reserved_factor=1.05), ROWS)
    assert 1 + program.spread == pytest.approx((1 + plain.spread) * 1.05)


def _hw() -> Hardware:
    gpu = get_gpu("H100-80G")
    return Hardware(gpu=gpu, gpu_memory_bytes=gpu.memory_bytes, cpu_memory_bytes=512 * GiB)


def test_kind_follows_the_plans_mechanisms() -> None:
    opt = Workload(kind="sft", model=get_model("opt-1.3b"), seq_len=512, global_batch=4)
    qwen = Workload(kind="sft", model=get_model("qwen2.5-1.5b"), seq_len=512, global_batch=4)
    offloaded = Strategy(zero_stage=3, offload_optimizer="cpu", offload_param="cpu", micro_batch=4)
    assert kind_of(opt, offloaded) == SpreadKind(3, "optimizer+param", False, False, False)
    assert kind_of(qwen, Strategy(zero_stage=2, micro_batch=4)).large_vocab  # 151,936 tokens
    ppo = Workload(kind="ppo", model=get_model("opt-1.3b"), seq_len=512, global_batch=4, prompt_len=256, gen_len=256)
    actor = TrainedModelStrategy(zero_stage=1, offload_optimizer="cpu", gradient_checkpointing=True)
    assert kind_of(ppo, RLHFStrategy(actor=actor)) == SpreadKind(1, "optimizer", True, False, True)


def test_a_plans_usable_memory_keeps_its_own_spread() -> None:
    """A kind measured far under keeps more free than one measured on the mark: the budget follows the spread."""
    workload = Workload(kind="sft", model=get_model("opt-1.3b"), seq_len=512, global_batch=4)
    hardware = _hw()
    prediction = predict(workload, Strategy(zero_stage=2, gradient_checkpointing=True, micro_batch=4), hardware)
    narrow = with_measured_spread(
        prediction, workload, Strategy(zero_stage=2, gradient_checkpointing=True), hardware, C, ROWS
    )
    wide = with_measured_spread(prediction, workload, Strategy(zero_stage=0), hardware, C, ROWS)
    assert narrow.reserved_uncertainty < wide.reserved_uncertainty
    assert narrow.gpu_budget_bytes > wide.gpu_budget_bytes
    assert wide.gpu_budget_bytes == gpu_budget_bytes(hardware, C.with_(reserved_spread=wide.reserved_uncertainty))
    assert wide.reserved_spread_basis["records"] == ["case.json:z0"]
    assert narrow.peak_reserved_bytes == wide.peak_reserved_bytes == prediction.peak_reserved_bytes


def test_the_shipped_table_is_read_and_covers_every_mechanism_measured() -> None:
    rows = load_residuals()
    assert rows, "store/residuals.json is missing: run scripts/spread_table.py"
    kinds = {SpreadKind.from_dict(row.kind) for row in rows}
    assert (
        {k.zero_stage for k in kinds} >= {0, 2, 3} and any(k.rlhf for k in kinds) and any(k.large_vocab for k in kinds)
    )

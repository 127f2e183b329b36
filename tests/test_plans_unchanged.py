"""benchmarks/plans_unchanged.py: what counts as a moved plan (the check every search speed change is held to)."""

from __future__ import annotations

from benchmarks.plans_unchanged import differences, jobs

PLAN = {
    "plan_id": "a1",
    "_cpu_s": 2.0,
    "search": {"replays": 12, "trials": 70},
    "strategy": {"zero_stage": 2, "micro_batch": 4},
    "alternatives": [{"predicted": {"peak_reserved_bytes": 73_639_395_328}}],
}


def test_a_speed_change_moves_nothing() -> None:
    faster = {**PLAN, "plan_id": "b2", "_cpu_s": 0.5, "search": {"replays": 9, "trials": 70}}
    assert differences(PLAN, faster) == []


def test_a_moved_strategy_or_alternative_is_named() -> None:
    moved = {
        **PLAN,
        "strategy": {"zero_stage": 3, "micro_batch": 4},
        "alternatives": [{"predicted": {"peak_reserved_bytes": 73_700_212_736}}],
    }
    assert differences(PLAN, moved) == ["alternatives[0].predicted.peak_reserved_bytes", "strategy.zero_stage"]


def test_a_field_on_one_side_only_is_named() -> None:
    assert differences(PLAN, {**PLAN, "suggestions": ["2 GPUs"]}) == ["suggestions[0]"]


def test_the_jobs_are_the_matrix_jobs_named_and_the_demo() -> None:
    chosen = jobs()
    assert len(chosen) == 12
    assert chosen["demo"] == ("opt-1.3b", {"gpu_mem": "24G"})
    assert chosen["case-sft-q30ba3b"][1]["workload"] == "sft"

"""planner.runtime.EmptyCachePolicy: where each empty_cache policy empties the cache, and the CPU no-op."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planner.runtime import PHASES, POLICY_TABLE, CacheDecision, EmptyCachePolicy
from store.errors import InputError
from store.records import EMPTY_CACHE_POLICIES, RLHFStrategy, Strategy

REPO_ROOT = Path(__file__).resolve().parents[2]
EVENTS = (*PHASES, "end_step")
# The policy table of docs/rlhf.md, written out: the events after which each policy empties the cache.
EXPECTED = {
    "never": set(),
    "after-generation": {"generation"},
    "after-inference": {"generation", "scoring"},
    "after-phase": {"generation", "scoring", "actor_training", "critic_training"},
    "every-step": {"end_step"},
}


def _run_step(cache: EmptyCachePolicy) -> None:
    """One PPO-shaped step: the four phases in order, then the end of the step."""
    for name in PHASES:
        with cache.phase(name):
            pass
    cache.end_step()


@pytest.mark.parametrize("policy", EMPTY_CACHE_POLICIES)
def test_policy_table(policy: str) -> None:
    assert set(POLICY_TABLE[policy]) == EXPECTED[policy]
    cache = EmptyCachePolicy(policy, empty_fn=lambda: None)
    assert [event for event in EVENTS if cache.empties_after(event)] == [e for e in EVENTS if e in EXPECTED[policy]]
    _run_step(cache)
    assert [(d.event, d.called) for d in cache.calls] == [(e, e in EXPECTED[policy]) for e in EVENTS]


@pytest.mark.parametrize("policy", EMPTY_CACHE_POLICIES)
def test_injected_function_runs_exactly_where_the_policy_says(policy: str) -> None:
    ran: list[int] = []
    cache = EmptyCachePolicy(policy, empty_fn=lambda: ran.append(1))
    _run_step(cache)
    _run_step(cache)
    assert len(ran) == 2 * len(EXPECTED[policy]) == cache.executed
    assert all(d.executed == d.called for d in cache.calls)


def test_cpu_is_a_noop_that_still_records(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    cache = EmptyCachePolicy("after-phase")
    _run_step(cache)
    assert emptied == [] and cache.executed == 0
    assert [d.called for d in cache.calls] == [True, True, True, True, False]
    assert cache.calls[0] == CacheDecision("generation", True, False)
    assert cache.calls[0][:2] == ("generation", True)


def test_cuda_available_calls_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where CUDA is there, the real torch.cuda.empty_cache() runs (faked here: no GPU on CI)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    cache = EmptyCachePolicy("after-inference")
    _run_step(cache)
    assert len(emptied) == 2 == cache.executed
    assert [d.event for d in cache.calls if d.executed] == ["generation", "scoring"]


def test_end_phase_and_return_values() -> None:
    cache = EmptyCachePolicy("after-generation", empty_fn=lambda: None)
    assert cache.end_phase("generation") is True
    assert cache.end_phase("scoring") is False
    assert cache.end_step() is False
    assert repr(cache) == "EmptyCachePolicy('after-generation', calls=3)"


def test_phase_that_raises_records_nothing() -> None:
    cache = EmptyCachePolicy("after-phase", empty_fn=lambda: None)
    with pytest.raises(RuntimeError), cache.phase("generation"):
        raise RuntimeError("out of memory")
    assert cache.calls == []


def test_policy_from_strategies_and_dicts() -> None:
    assert EmptyCachePolicy(Strategy(empty_cache="every-step")).name == "every-step"
    assert EmptyCachePolicy(RLHFStrategy(empty_cache="after-inference")).name == "after-inference"
    assert EmptyCachePolicy({"empty_cache": "after-phase", "micro_batch": 4}).name == "after-phase"
    plan = {"plan_id": "abc", "strategy": RLHFStrategy(empty_cache="never").to_dict()}
    assert EmptyCachePolicy(plan).name == "never"

    class Plan:  # an object holding its strategy as a dictionary, as planner.report.results.Plan does
        strategy = {"empty_cache": "after-generation"}

    assert EmptyCachePolicy(Plan()).name == "after-generation"


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("sometimes", "must be one of never, after-generation"),
        ("", "must be one of"),
        ({"micro_batch": 4}, 'no "empty_cache" policy'),
        (42, "cannot find an empty_cache policy"),
    ],
)
def test_bad_policy_is_input_error(policy: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        EmptyCachePolicy(policy)


def test_unknown_phase_is_input_error() -> None:
    cache = EmptyCachePolicy("after-phase")
    with pytest.raises(InputError, match="unknown phase 'rollout'; phases are generation, scoring"):
        cache.end_phase("rollout")
    with pytest.raises(InputError, match="unknown phase"), cache.phase("end_step"):
        pass
    with pytest.raises(InputError, match="unknown phase"):
        cache.empties_after("optimizer")
    assert cache.calls == []


def test_runtime_imports_no_heavy_libraries() -> None:
    code = (
        "import sys, planner.runtime as r; c = r.EmptyCachePolicy('after-inference', empty_fn=lambda: None); "
        "c.end_phase('generation'); "
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)

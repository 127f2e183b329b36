"""One ``empty_cache`` table (store.phases), and the cost model, the probes and the runtime helper follow it.

For every policy and every phase of every workload kind: the probe's phase clock empties the cache exactly
after the events the table names, ``planner.runtime.EmptyCachePolicy`` decides the same, and the cost
model's release plan releases fragments after exactly those phases (and charges time only for them).
"""

from __future__ import annotations

import pytest

from planner.runtime import EmptyCachePolicy
from probes.step.phases import PhaseClock
from search.step.fragments import release_plan
from store.phases import EMPTY_CACHE_AFTER, END_STEP, PHASES, empties_after
from store.records import EMPTY_CACHE_POLICIES

# What each policy means, written out from docs/rlhf.md (not read from the table under test).
EXPECTED_AFTER = {
    "never": set(),
    "after-generation": {"generation"},
    "after-inference": {"generation", "scoring", "reference_forward"},
    "after-phase": {name for names in PHASES.values() for name in names},
    "every-step": {END_STEP},
}


def test_the_table_says_what_design_md_says() -> None:
    assert set(EMPTY_CACHE_AFTER) == set(EMPTY_CACHE_POLICIES)
    assert {policy: set(events) for policy, events in EMPTY_CACHE_AFTER.items()} == EXPECTED_AFTER


@pytest.mark.parametrize("policy", EMPTY_CACHE_POLICIES)
@pytest.mark.parametrize("kind", list(PHASES))
def test_probe_clock_empties_after_the_tables_events(kind: str, policy: str) -> None:
    clock = PhaseClock("cpu", policy)
    clock.start_step()
    for name in PHASES[kind]:
        with clock.phase(name):
            if name == PHASES[kind][-1]:
                clock.end_step()
    clock.finish_step(measured=True)
    expected = sum(empties_after(policy, event) for event in (*PHASES[kind], END_STEP))
    assert clock.cache_calls == expected


@pytest.mark.parametrize("policy", EMPTY_CACHE_POLICIES)
def test_runtime_policy_decides_as_the_table(policy: str) -> None:
    runtime = EmptyCachePolicy(policy, empty_fn=lambda: None)
    for event in (*PHASES["ppo"], END_STEP):
        assert runtime.empties_after(event) == (event in EXPECTED_AFTER[policy]), (policy, event)


@pytest.mark.parametrize("policy", EMPTY_CACHE_POLICIES)
@pytest.mark.parametrize("kind", list(PHASES))
def test_cost_model_releases_after_the_tables_phases(kind: str, policy: str) -> None:
    groups = {"optimizer_step": "optimizer", "generation": "inference", "scoring": "inference"}
    structure = tuple((name, groups.get(name, "training"), False) for name in PHASES[kind])
    sees, releases = release_plan(structure, policy)
    released_after = {structure[p][0] for p, _ in releases}
    assert released_after == {name for name in PHASES[kind] if name in EXPECTED_AFTER[policy]}
    for seen in sees:
        for q in seen:  # a phase finds another's fragments only if no call lies between them
            assert not empties_after(policy, structure[q][0])

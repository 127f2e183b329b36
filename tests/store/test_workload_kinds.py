"""The workload-kind table (store.workload_kinds) against facts stated elsewhere: the phases each kind runs, the
kind lists of store.records and store.frameworks, the module's own documented table, and what the implications
mean together."""

from __future__ import annotations

from dataclasses import fields

import pytest

import store.workload_kinds as workload_kinds
from store.errors import InputError
from store.frameworks import TRL_FUSED_HEAD_WORKLOADS, TRL_HEAD_OUTPUTS, WORKLOADS
from store.models import get_model
from store.phases import INFERENCE_PHASES, PHASES
from store.records import (
    MODEL_ROLES,
    RLHF_WORKLOADS,
    SINGLE_MODEL_WORKLOADS,
    WORKLOAD_KINDS,
    Workload,
)
from store.workload_kinds import KINDS, KindTraits, traits


def test_every_listed_kind_is_in_the_table_and_every_table_kind_is_listed() -> None:
    assert set(KINDS) == set(WORKLOAD_KINDS) == set(PHASES)
    assert len(WORKLOAD_KINDS) == len(set(WORKLOAD_KINDS))
    assert set(SINGLE_MODEL_WORKLOADS) | set(RLHF_WORKLOADS) == set(KINDS)
    assert not set(SINGLE_MODEL_WORKLOADS) & set(RLHF_WORKLOADS)
    framework_kinds = {kind for kinds in WORKLOADS.values() for kind in kinds}
    assert framework_kinds <= set(KINDS)
    assert set(TRL_FUSED_HEAD_WORKLOADS) <= set(KINDS)
    assert set(TRL_HEAD_OUTPUTS) <= set(KINDS)


def test_the_kind_lists_keep_their_order() -> None:
    # contracts: planner and probes list the kinds in messages, single-model kinds as store.phases has them
    assert WORKLOAD_KINDS == RLHF_WORKLOADS + SINGLE_MODEL_WORKLOADS
    assert list(KINDS) == list(PHASES)


@pytest.mark.parametrize("kind", list(PHASES))
def test_the_phases_a_kind_runs_say_what_it_implies(kind: str) -> None:
    phases = PHASES[kind]
    implies = traits(kind)
    assert implies.reference_forward == ("reference_forward" in phases)
    assert implies.generates == ("generation" in phases)
    assert implies.rlhf == ("actor_training" in phases)
    assert implies.trains_critic == ("critic_training" in phases)
    # the reference runs in an inference phase of its own (dpo) or among the scoring forwards (RLHF)
    assert implies.reference_model == bool({"reference_forward", "scoring"} & set(phases))
    assert implies.rlhf == (kind in RLHF_WORKLOADS)
    # a kind without an inference phase does nothing that after-inference could empty the cache after
    has_inference = bool(INFERENCE_PHASES & set(phases))
    assert has_inference == (implies.generates or implies.reference_forward)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_implications_hold_together(kind: str) -> None:
    t = traits(kind)
    assert t.generate_passes == (0 if not t.generates else 2 if t.greedy_baseline else 1)
    for needs_generation in (t.greedy_baseline, t.group_samples, t.gae_advantages, t.clipped_ratio, t.kl_in_loss):
        assert not needs_generation or t.generates
    assert not t.gae_advantages or t.trains_critic  # GAE reads the critic's values
    assert not t.kl_in_loss or t.reference_model  # the KL is against the reference's log-probs
    assert not t.reference_forward or (t.reference_model and not t.generates)
    assert not t.scalar_head or not t.causal_lm_loss  # a scalar head has no vocabulary to take a cross-entropy over
    assert t.sequences_per_sample in (1, 2)
    assert not t.rlhf or t.sequences_per_sample == 1  # an RLHF sample is a prompt
    assert not t.trains_critic or t.rlhf


def test_trl_fused_head_kinds_have_an_lm_head() -> None:
    for kind in TRL_FUSED_HEAD_WORKLOADS:
        assert not traits(kind).scalar_head
        assert "log_probs" in TRL_HEAD_OUTPUTS[kind]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_workload_holds_the_models_its_kind_implies(kind: str) -> None:
    rlhf = kind in RLHF_WORKLOADS
    extra = {"prompt_len": 8, "gen_len": 8} if rlhf else {}
    workload = Workload(kind, get_model("opt-125m"), seq_len=16, global_batch=4, **extra)
    roles = workload.role_models()
    assert list(roles) == [role for role in MODEL_ROLES if role in roles]  # in MODEL_ROLES order
    assert ("critic" in roles) == ("critic_training" in PHASES[kind]) == workload.has_critic
    assert ("reference" in roles) == bool({"reference_forward", "scoring"} & set(PHASES[kind]))
    assert ("reward" in roles) == ("scoring" in PHASES[kind]) == workload.is_rlhf
    assert "actor" in roles
    assert workload.sequences_per_sample == traits(kind).sequences_per_sample
    # an RLHF document carries the RLHF fields, a single-model one does not
    assert ("samples_per_prompt" in workload.to_dict()) == rlhf


def test_the_documented_table_is_the_table() -> None:
    doc = workload_kinds.__doc__ or ""
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("====")]
    header, body = lines[rules[0] + 1].split(), lines[rules[1] + 1 : rules[2]]
    assert header[1:] == list(KINDS)
    documented = {row.split()[0]: row.split()[1:] for row in body}
    assert list(documented) == [f.name for f in fields(KindTraits)]
    for name, cells in documented.items():
        for kind, cell in zip(header[1:], cells, strict=True):
            value = getattr(KINDS[kind], name)
            shown = str(value) if type(value) is int else ("x" if value else ".")
            assert cell == shown, f"{name} of {kind}: the docstring says {cell}, the table {value!r}"


@pytest.mark.parametrize("kind", ["SFT", "rlhf", "", "dpo ", None, 3])
def test_an_unknown_kind_is_an_input_error_naming_the_kinds(kind: object) -> None:
    with pytest.raises(InputError, match="unknown workload kind .*; kinds: sft, reward, dpo, ppo, remax, grpo"):
        traits(kind)  # type: ignore[arg-type]


def test_the_table_cannot_be_changed_in_place() -> None:
    with pytest.raises(AttributeError):
        KINDS["ppo"].trains_critic = False  # type: ignore[misc]

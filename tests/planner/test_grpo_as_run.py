"""GRPO as run today (issue 32, item 2): rule-based rewards without a reward model, the reference dropped at a KL
coefficient of 0, and a rollout budget each framework's export carries for the engine it names.

Through the real CLI (``planner.cli.main``, the ``cli`` fixture) and the real TRL config class where installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from planner_helpers import CliResult, assert_one_error_line

Cli = Callable[..., CliResult]
JOB = ("--model", "opt-125m", "--workload", "grpo", "--gpu-mem", "24G", "--batch", "8")
STRATEGY = json.dumps(
    {
        "actor": {"zero_stage": 0, "gradient_checkpointing": True},
        "reference": {},
        "reward": {},
        "hybrid_engine": False,
        "generation_batch": 8,
        "micro_batch": 8,
        "grad_accum": 4,
    }
)


def _predict(cli: Cli, *extra: str) -> dict[str, Any]:
    result = cli("predict", *JOB, "--strategy", STRATEGY, "--json", *extra)
    assert result.rc == 0, result.err
    return result.json()


def _phase(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in doc["predicted"]["phases"] if p["name"] == name)


def test_rule_based_rewards_plan_without_a_reward_model(cli: Cli) -> None:
    """``--reward-model none`` was refused (it named no model); now the plan holds no reward model: no bytes,
    no scoring forward, no DeepSpeed config, and the JSON says so."""
    scored = _predict(cli)
    rules = _predict(cli, "--reward-model", "none")
    assert rules["workload"]["reward_model"] == "none"
    assert "reward" not in rules["workload"]["roles"] and "reward" in scored["workload"]["roles"]
    assert "reward_model" not in rules["predicted"]["breakdown"]
    assert "reward" not in rules["ds_configs"]
    reward_bytes = scored["predicted"]["breakdown"]["reward_model"]
    assert reward_bytes > 0
    # the same strategy: the reward model's weights leave every phase, its forward leaves the scoring time
    assert rules["predicted"]["peak_allocated_bytes"] <= scored["predicted"]["peak_allocated_bytes"] - reward_bytes
    assert _phase(rules, "scoring")["time_s"] < _phase(scored, "scoring")["time_s"]
    assert _phase(rules, "generation")["time_s"] == _phase(scored, "generation")["time_s"]


def test_a_kl_coefficient_of_zero_loads_no_reference(cli: Cli) -> None:
    """``--kl-coef 0`` (TRL's beta=0.0, OpenRLHF's init_coef 0, veRL without use_kl_*): no reference weights and
    no reference log-probs; with rule-based rewards too, the actor's own forward is all that scores."""
    held = _predict(cli)
    none = _predict(cli, "--kl-coef", "0")
    bare = _predict(cli, "--kl-coef", "0", "--reward-model", "none")
    assert none["workload"]["kl_coef"] == 0.0
    assert "reference" not in none["workload"]["roles"] and "reference" not in none["ds_configs"]
    assert "reference_model" not in none["predicted"]["breakdown"]
    reference_bytes = held["predicted"]["breakdown"]["reference_model"]
    assert none["predicted"]["peak_allocated_bytes"] <= held["predicted"]["peak_allocated_bytes"] - reference_bytes
    assert _phase(none, "scoring")["time_s"] < _phase(held, "scoring")["time_s"]
    assert set(bare["workload"]["roles"]) == {"actor"} and set(bare["ds_configs"]) == {"actor"}
    assert _phase(bare, "scoring")["time_s"] < _phase(none, "scoring")["time_s"]
    assert bare["predicted"]["step_time_s"] < held["predicted"]["step_time_s"]


def test_the_text_plan_says_what_it_does_not_hold(cli: Cli) -> None:
    out = " ".join(cli("predict", *JOB, "--strategy", STRATEGY, "--reward-model", "none", "--kl-coef", "0").out.split())
    assert "no reference (KL coefficient 0)" in out and "rule-based rewards (no reward model)" in out


def test_trl_plans_grpo_at_its_default_beta_without_a_reference(cli: Cli) -> None:
    """TRL 1.16's GRPOConfig defaults to beta=0.0 (GRPOTrainer then builds no ref_model): a plan made for TRL
    without --kl-coef holds no reference and exports beta 0.0; --kl-coef 0.04 brings the reference back."""
    from store.frameworks import DEFAULT_KL_COEF

    trl = pytest.importorskip("trl")
    assert trl.GRPOConfig.__dataclass_fields__["beta"].default == DEFAULT_KL_COEF["trl"] == 0.0
    doc = _predict(cli, "--framework", "trl")
    assert doc["workload"]["kl_coef"] == 0.0 and "reference" not in doc["workload"]["roles"]
    assert any("KL coefficient: 0 (TRL 1.16's default)" in line for line in doc["readings"])
    flags = doc["launch"]["trl"]
    assert flags[flags.index("--beta") + 1] == "0.0"
    kept = _predict(cli, "--framework", "trl", "--kl-coef", "0.04")
    assert "reference" in kept["workload"]["roles"]
    flags = kept["launch"]["trl"]
    assert flags[flags.index("--beta") + 1] == "0.04"


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (("--framework", "deepspeed-chat", "--workload", "ppo", "--reward-model", "none"), ("reward_model",)),
        (("--framework", "deepspeed-chat", "--workload", "ppo", "--kl-coef", "0"), ("kl_ctl = 0.1",)),
        (("--workload", "dpo", "--kl-coef", "0"), ("--kl-coef only applies to RLHF",)),
        (("--kl-coef", "-0.1"), ("--kl-coef must be a number >= 0",)),
        (("--kl-coef", "much"), ("Invalid value for '--kl-coef'",)),
        (("--kl-coef", "0", "--ref-model", "opt-350m"), ("--ref-model opt-350m", "no reference model is loaded")),
    ],
)
def test_where_the_algorithm_or_program_refuses_it_one_line(cli: Cli, extra: tuple[str, ...], fragments: Any) -> None:
    result = cli("predict", *JOB[:2], "--gpu-mem", "24G", *extra, "--strategy", STRATEGY)
    assert_one_error_line(result, *fragments)


SGLANG_JOB = ("--model", "qwen2.5-1.5b", "--workload", "grpo", "--gpu", "H100-80G", "--batch", "8")
SGLANG_PLAN = {
    "actor": {"zero_stage": 2, "gradient_checkpointing": True},
    "reference": {},
    "reward": {},
    "hybrid_engine": False,
    "generation_batch": 8,
    "micro_batch": 16,
    "grad_accum": 2,
    "allocator": "expandable-segments",
    "rollout": {"engine": "sglang", "placement": "colocate", "gpu_memory_utilization": 0.39},
}


def test_openrlhf_and_trl_get_vllms_own_budget_for_an_sglang_plan(cli: Cli, db: Any, tmp_path: Any) -> None:
    """An SGLang plan's ``mem_fraction_static`` 0.39 went to OpenRLHF and TRL as vLLM's gpu_memory_utilization;
    they now carry the utilization memplan solves for vLLM under the same plan (its own predict), and say so."""
    doc = cli("predict", *SGLANG_JOB, "--strategy", json.dumps(SGLANG_PLAN), "--json").json()
    vllm = {**SGLANG_PLAN, "allocator": "default", "rollout": {"engine": "vllm", "placement": "colocate"}}
    solved = cli("predict", *SGLANG_JOB, "--strategy", json.dumps(vllm), "--json").json()
    utilization = solved["predicted"]["rollout"]["gpu_memory_utilization"]
    assert solved["fits"] and utilization != 0.39
    openrlhf, trl = doc["launch"]["openrlhf"], doc["launch"]["trl"]
    assert openrlhf[openrlhf.index("--vllm.gpu_memory_utilization") + 1] == f"{utilization:g}"
    assert trl[trl.index("--vllm_gpu_memory_utilization") + 1] == f"{utilization:g}"
    for name in ("openrlhf", "trl"):
        line = doc["launch_gaps"][name][0]
        assert "mem_fraction_static 0.39" in line and f"gpu_memory_utilization {utilization:g}" in line
    verl = doc["launch"]["verl"]  # veRL runs SGLang itself: the plan's own number
    assert "actor_rollout_ref.rollout.name=sglang" in verl
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.39" in verl
    # planner export writes the same number into the files
    plan = cli("recommend", *SGLANG_JOB, "--db", db, "--json").json()
    if plan["strategy"].get("rollout", {}).get("engine") != "sglang":
        pytest.skip("the recommended plan runs vLLM here: nothing to carry over")
    out = tmp_path / "run_openrlhf.sh"
    exported = cli("export", "--db", db, "--format", "openrlhf", "-o", out)
    assert exported.rc == 0, exported.err
    text = " ".join(line.lstrip("# ") for line in out.read_text().splitlines())
    fraction = f"{plan['strategy']['rollout']['gpu_memory_utilization']:g}"  # the recommended plan's own SGLang share
    assert f"--vllm.gpu_memory_utilization {fraction}" not in text and f"mem_fraction_static {fraction}" in text
    assert f"--vllm.gpu_memory_utilization {fraction}" not in exported.out


def test_a_probe_request_rebuilds_the_rule_reward_workload() -> None:
    """A probe child rebuilds the workload from its JSON (``Workload.to_dict`` + HF configs): ``"reward_model":
    "none"`` was looked up as a model named "none"; it now means rule-based rewards, and the KL coefficient comes
    with it (the probe's step then loads neither model: ``probes.step.phases_rlhf``)."""
    from dataclasses import replace

    from planner.probing.plan import workload_payload
    from probes.model.build import workload_from_dict
    from store.models import get_model
    from store.records import Workload

    model = get_model("opt-125m")
    workload = Workload("grpo", model, 512, 8, prompt_len=256, gen_len=256, samples_per_prompt=4)
    workload = replace(workload, rule_reward=True, kl_coef=0.0)
    payload = json.loads(json.dumps(workload_payload(workload)))
    assert payload["reward_model"] == "none" and payload["kl_coef"] == 0.0
    again = workload_from_dict(payload)
    assert again.rule_reward and again.kl_coef == 0.0 and set(again.role_models()) == {"actor"}


def test_a_plan_without_reference_or_reward_model_is_labelled_so() -> None:
    """The strategy label names what the job holds: a frozen model it does not hold is absent, not placed."""
    from store.records import RLHFStrategy, TrainedModelStrategy

    strategy = RLHFStrategy(actor=TrainedModelStrategy(2), critic=None)
    assert "ref Z0" in strategy.describe() and "rm Z0" in strategy.describe()
    label = strategy.describe(roles={"actor": "qwen2.5-1.5b"})
    assert "no ref" in label and "no rm" in label and "ref Z0" not in label
    assert "no rm" in strategy.describe(roles=("actor", "reference")) and "ref Z0" in strategy.describe(
        roles=("actor", "reference")
    )


def test_probe_labels_name_only_the_models_the_job_holds(tmp_path: Any) -> None:
    """A probe's label (its progress line and its row) says "no ref, no rm" for rule-based rewards at KL 0, as the
    plan's label does, not the reference and reward blocks the strategy still carries."""
    from planner.job.inputs import JobSpec, resolve
    from planner.probing.plan import plan_probes
    from planner.probing.settings import ProbeSettings
    from search import DEFAULT_COEFFICIENTS
    from store.records import RLHFStrategy

    spec = JobSpec(model="opt-125m", workload="grpo", gpu_mem="24G", batch=8, reward_model="none", kl_coef=0.0)
    job = resolve(spec, str(tmp_path / "p.db"))
    strategy = RLHFStrategy.from_dict(json.loads(STRATEGY))
    assert "ref Z0" in strategy.describe() and "rm Z0" in strategy.describe()  # the blocks, without the job
    (planned,) = plan_probes(job, [strategy], ProbeSettings("cpu", 3, 60.0), layers=None, coef=DEFAULT_COEFFICIENTS)
    assert "no ref, no rm" in planned.label and "ref Z0" not in planned.label

"""The framework exports (launch.frameworks) say the plan in names the frameworks really have.

Every emitted OpenRLHF option, veRL key, TRL config field and accelerate config key is checked against the
names extracted from the released sources (``tests/data/framework_names.json``, written by
``scripts/extract_framework_names.py`` from the PyPI wheels: OpenRLHF 0.11.2 and 0.9.1.post1, TRL 1.16.0,
veRL 0.9.1, accelerate 1.15.0); transformers' ``TrainingArguments`` fields and the config keys its DeepSpeed
integration fills with ``"auto"`` are read with ``ast`` from the installed transformers. Nothing here imports
torch or deepspeed.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_models import make_hardware, make_rlhf_strategy, make_rlhf_workload, rough_spec

from launch import frameworks
from launch.frameworks import accelerate, hf, openrlhf, trl, verl
from store.errors import InputError
from store.records import Hardware, RLHFStrategy, Strategy, Workload
from store.rollout import RolloutStrategy

REPO = Path(__file__).resolve().parents[2]
NAMES: dict[str, Any] = json.loads((REPO / "tests" / "data" / "framework_names.json").read_text())
ACTOR, CRITIC = rough_spec("rough-actor", 2048), rough_spec("rough-critic", 1024)
HW = {"1x4": make_hardware(gpus=4, nodes=1), "2x4": make_hardware(gpus=4, nodes=2, nvme_path="/nvme")}
ROLLOUTS: dict[str, RolloutStrategy | None] = {
    "none": None,
    "colocate": RolloutStrategy(engine="vllm", gpu_memory_utilization=0.5),
    "colocate-sglang": RolloutStrategy(
        engine="sglang", tensor_parallel=2, sleep_level=2, offload_training=False, enforce_eager=True
    ),
    "colocate-open": RolloutStrategy(engine="vllm", sleep_level=0, offload_training=False),
    "separate": RolloutStrategy(
        engine="vllm",
        placement="separate",
        engine_gpus=2,
        sleep_level=0,
        offload_training=False,
        gpu_memory_utilization=0.9,
    ),
}
LAYOUTS: tuple[dict[str, Any], ...] = (
    {"zero_stage": 0},
    {"zero_stage": 1, "gradient_checkpointing": True},
    {"zero_stage": 2, "offload_optimizer": "cpu", "lora_rank": 8},
    {"zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme"},
)


def _workload(kind: str, dtype: str = "bf16") -> Workload:
    samples = 4 if kind == "grpo" else 1
    return make_rlhf_workload(
        kind, ACTOR, CRITIC, dtype=dtype, prompt_len=256, gen_len=256, global_batch=16, samples_per_prompt=samples
    )


def _strategy(kind: str, layout: dict[str, Any], rollout: str, **changes: Any) -> RLHFStrategy:
    """A plan's strategy: micro_batch x grad_accum x 4 GPUs = the step's sequences (global batch x k)."""
    k = 4 if kind == "grpo" else 1
    defaults: dict[str, Any] = {"micro_batch": 2, "grad_accum": 2 * k, "generation_batch": 2}
    defaults.update(changes)
    return make_rlhf_strategy(
        layout,
        layout,
        with_critic=kind == "ppo",
        hybrid_engine=rollout == "none",
        rollout=ROLLOUTS[rollout],
        **defaults,
    )


def _plans() -> list[tuple[RLHFStrategy, Workload, Hardware]]:
    plans = []
    for kind in ("ppo", "remax", "grpo"):
        for i, layout in enumerate(LAYOUTS):
            for rollout in ROLLOUTS:
                dtype = ("bf16", "fp16", "fp32")[i % 3]
                plans.append((_strategy(kind, layout, rollout), _workload(kind, dtype), HW["1x4"]))
    return plans


def _value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


# --- OpenRLHF ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("style,entry", [("dotted", "openrlhf"), ("classic", "openrlhf_classic")])
def test_openrlhf_flags_exist_in_its_argparse(style: str, entry: str) -> None:
    options: dict[str, dict[str, Any]] = NAMES[entry]["options"]
    for strategy, workload, hardware in _plans():
        flags = openrlhf.flags(strategy, workload, hardware, style=style)
        for i, word in enumerate(flags):
            if not word.startswith("--"):
                continue
            assert word in options, (word, NAMES[entry]["version"])
            following = flags[i + 1] if i + 1 < len(flags) else "--"
            if options[word]["store_true"]:
                assert following.startswith("--"), (word, following)
            else:
                assert not following.startswith("--"), word
                if options[word]["choices"]:
                    assert following in options[word]["choices"], (word, following)


def test_openrlhf_rollout_engine_flags() -> None:
    hardware = HW["2x4"]
    colocated = openrlhf.flags(_strategy("grpo", {"zero_stage": 2}, "colocate"), _workload("grpo"), hardware, "dotted")
    assert "--train.colocate_all" in colocated and "--vllm.enable_sleep" in colocated
    assert "--ds.enable_sleep" in colocated and "--vllm.enforce_eager" not in colocated
    assert (
        _value(colocated, "--vllm.num_engines") == "8" and _value(colocated, "--vllm.gpu_memory_utilization") == "0.5"
    )
    assert _value(colocated, "--actor.num_gpus_per_node") == "4"

    strategy = _strategy("ppo", {"zero_stage": 2}, "separate", grad_accum=1)
    separate = openrlhf.flags(strategy, _workload("ppo"), hardware, "dotted")
    assert "--train.colocate_all" not in separate and "--vllm.enable_sleep" not in separate
    assert {"--train.colocate_actor_ref", "--train.colocate_critic_reward"} <= set(separate)
    assert _value(separate, "--vllm.num_engines") == "4"  # 2 engine GPUs on each of 2 nodes, tp 1
    assert _value(separate, "--critic.num_gpus_per_node") == "2"
    assert _value(separate, "--train.batch_size") == str(2 * 1 * 2 * 2)  # micro x accum x training GPUs
    assert any("colocate_all" in g for g in openrlhf.gaps(strategy, _workload("ppo"), hardware, "dotted"))

    classic = openrlhf.flags(_strategy("grpo", {"zero_stage": 2}, "colocate-sglang"), _workload("grpo"), hardware)
    assert {"--colocate_all_models", "--vllm_enable_sleep", "--enforce_eager"} <= set(classic)
    assert "--deepspeed_enable_sleep" not in classic and _value(classic, "--vllm_tensor_parallel_size") == "2"


def test_openrlhf_gaps_name_what_it_cannot_do() -> None:
    hardware = HW["1x4"]
    hybrid = openrlhf.gaps(_strategy("remax", {"zero_stage": 2}, "none"), _workload("remax"), hardware, "dotted")
    assert any("no DeepSpeed hybrid engine" in g for g in hybrid)
    assert any("vLLM engines only" in g for g in hybrid)
    assert any("no ReMax estimator" in g for g in hybrid)
    sglang = openrlhf.gaps(
        _strategy("grpo", {"zero_stage": 2}, "colocate-sglang"), _workload("grpo"), hardware, "dotted"
    )
    assert any("sglang engine becomes vLLM" in g for g in sglang)
    assert any("level 1" in g and "level 2" in g for g in sglang)
    assert any("gpu_memory_utilization open" in g for g in sglang)


def test_openrlhf_script() -> None:
    strategy = _strategy(
        "ppo", {"zero_stage": 3, "gradient_checkpointing": True}, "colocate", allocator="expandable-segments"
    )
    rendered = openrlhf.script(strategy, _workload("ppo"), HW["1x4"])
    text = rendered.files["script"]
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0
    for placeholder in ("ACTOR_MODEL", "CRITIC_MODEL", "REWARD_MODEL", "PROMPT_DATA"):
        assert f'"${{{placeholder}:?' in text and f'"${placeholder}"' in text
    assert "--vllm.num_engines 4" in text and "--actor.gradient_checkpointing_enable" in text
    # a sleeping vLLM refuses expandable segments (CuMemAllocator): the setting is a gap, not exported
    assert "expandable_segments" not in text.split("\n\n", 1)[1].replace("# ", "#")
    assert any("CuMemAllocator" in g for g in rendered.gaps)
    for gap in rendered.gaps:
        assert f"# - {gap}" in text
    with pytest.raises(InputError, match="style"):
        openrlhf.flags(strategy, _workload("ppo"), HW["1x4"], style="ray")


# --- veRL --------------------------------------------------------------------------------------------


def test_verl_overrides_are_keys_of_its_config() -> None:
    keys = set(NAMES["verl"]["keys"])
    for strategy, workload, hardware in _plans():
        for override in verl.overrides(strategy, workload, hardware):
            key, _, value = override.partition("=")
            assert key in keys, (key, NAMES["verl"]["version"])
            assert value, override
    script = verl.script(*_plans()[0]).files["script"]
    for line in script.splitlines():
        if "=$" in line:
            assert line.strip().strip('\\ "').split("=")[0] in keys, line


def test_verl_maps_zero_stages_to_fsdp() -> None:
    hardware, workload = HW["1x4"], _workload("ppo")
    prefix = "actor_rollout_ref.actor.fsdp_config"
    z3 = verl.overrides(_strategy("ppo", LAYOUTS[3], "colocate"), workload, hardware)
    assert f"{prefix}.param_offload=True" in z3 and f"{prefix}.optimizer_offload=True" in z3
    assert "critic.fsdp.param_offload=True" in z3
    assert not any("reshard_after_forward" in o or "fsdp_size" in o.split("=")[0] and "actor." in o for o in z3)
    z0 = verl.overrides(_strategy("ppo", LAYOUTS[0], "colocate-open"), workload, hardware)
    assert f"{prefix}.fsdp_size=1" in z0 and f"{prefix}.optimizer_offload=False" in z0
    for layout, words in ((LAYOUTS[1], "no ZeRO-1"), (LAYOUTS[2], "no ZeRO-2")):
        strategy = _strategy("ppo", layout, "colocate")
        assert f"{prefix}.reshard_after_forward=False" in verl.overrides(strategy, workload, hardware)
        assert any(words in g for g in verl.gaps(strategy, workload, hardware))
    nvme = verl.gaps(_strategy("ppo", LAYOUTS[4], "colocate"), workload, hardware)
    assert any("not NVMe" in g for g in nvme) and any("host memory between phases" in g for g in nvme)


def test_verl_rollout_and_algorithm() -> None:
    hardware = HW["2x4"]
    grpo = verl.overrides(_strategy("grpo", LAYOUTS[3], "colocate"), _workload("grpo"), hardware)
    assert {
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.use_kl_loss=True",
    } <= set(grpo)
    assert "actor_rollout_ref.rollout.free_cache_engine=True" in grpo and "trainer.nnodes=2" in grpo
    remax = verl.overrides(_strategy("remax", LAYOUTS[0], "none"), _workload("remax"), hardware)
    assert "algorithm.adv_estimator=remax" in remax and "algorithm.use_kl_in_reward=True" in remax
    assert any(
        "vLLM, SGLang or TensorRT-LLM only" in g
        for g in verl.gaps(_strategy("remax", LAYOUTS[0], "none"), _workload("remax"), hardware)
    )
    strategy = _strategy("ppo", LAYOUTS[3], "separate", grad_accum=1)
    separate = verl.overrides(strategy, _workload("ppo"), hardware)
    assert {
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
        "trainer.n_gpus_per_node=2",
    } <= set(separate)
    assert any("asynchronous" in g for g in verl.gaps(strategy, _workload("ppo"), hardware))


# --- TRL ---------------------------------------------------------------------------------------------


@cache
def _training_arguments_fields() -> frozenset[str]:
    """The fields of the installed transformers' TrainingArguments, read with ast (not imported)."""
    import transformers

    source = (Path(transformers.__file__).parent / "training_args.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            return frozenset(
                i.target.id for i in node.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
            )
    raise AssertionError("no TrainingArguments in transformers/training_args.py")


def _trl_fields(cls: str) -> set[str]:
    fields = NAMES["trl"]["fields"]
    return set(fields[cls]) | set(fields["_BaseConfig"]) | _training_arguments_fields()


def _snippet_kwargs(text: str, name: str) -> dict[str, Any]:
    """The keywords of ``name = dict(...)`` in a Python snippet (literals only)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name:
            assert isinstance(node.value, ast.Call)
            return {k.arg: ast.literal_eval(k.value) for k in node.value.keywords if k.arg}
    raise AssertionError(f"no {name} = dict(...) in the snippet")


def _yaml_doc(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("rollout", list(ROLLOUTS))
def test_trl_grpo_config_fields_exist(rollout: str, tmp_path: Path) -> None:
    strategy = _strategy("grpo", {"zero_stage": 3, "gradient_checkpointing": True}, rollout)
    paths = frameworks.file_layout("trl", str(tmp_path / "grpo.py"))
    rendered = trl.render(strategy, _workload("grpo"), HW["1x4"], paths)
    kwargs = _snippet_kwargs(rendered.files["kwargs"], "config_kwargs")
    assert set(kwargs) <= _trl_fields("GRPOConfig"), set(kwargs) - _trl_fields("GRPOConfig")
    assert _yaml_doc(rendered.files["yaml"]) == kwargs
    assert kwargs["deepspeed"] == paths["ds_config"] and kwargs["num_generations"] == 4
    assert kwargs["use_vllm"] == (rollout != "none")
    if rollout.startswith("colocate"):
        assert kwargs["vllm_mode"] == "colocate"
    ds = json.loads(rendered.files["ds_config"])
    assert ds["train_micro_batch_size_per_gpu"] == "auto" and ds["zero_optimization"]["stage"] == 3
    serve = trl.server_command(strategy, _workload("grpo"))
    assert bool(serve) == (rollout == "separate")
    options = {w[2:] for w in serve if w.startswith("--")}
    assert options <= set(NAMES["trl"]["fields"]["ScriptArguments"])


@pytest.mark.parametrize("kind,cls", [("sft", "SFTConfig"), ("dpo", "DPOConfig"), ("reward", "RewardConfig")])
def test_trl_single_model_configs(kind: str, cls: str) -> None:
    strategy = Strategy(
        zero_stage=2, gradient_checkpointing=True, micro_batch=2, grad_accum=4, empty_cache="every-step"
    )
    workload = Workload(kind=kind, model=ACTOR, seq_len=1024, global_batch=32)
    rendered = trl.render(strategy, workload, HW["1x4"], frameworks.file_layout("trl", "x.py"))
    kwargs = _snippet_kwargs(rendered.files["kwargs"], "config_kwargs")
    assert set(kwargs) <= _trl_fields(cls) and kwargs["max_length"] == 1024
    assert kwargs["torch_empty_cache_steps"] == 1 and f"from trl import {cls}" in rendered.files["kwargs"]


@pytest.mark.parametrize("kind", ["ppo", "remax"])
def test_trl_has_no_ppo_or_remax_trainer(kind: str) -> None:
    with pytest.raises(InputError, match=f"no {kind} trainer") as info:
        trl.render(_strategy(kind, LAYOUTS[0], "none"), _workload(kind), HW["1x4"], {"ds_config": "x.json"})
    assert "\n" not in str(info.value)


def test_trl_gaps() -> None:
    hardware, workload = HW["1x4"], _workload("grpo")
    colocated = trl.gaps(_strategy("grpo", LAYOUTS[2], "colocate"), workload, hardware)
    assert any("level 2" in g for g in colocated) and any("offload_training" in g for g in colocated)
    sglang = trl.gaps(_strategy("grpo", LAYOUTS[2], "colocate-sglang"), workload, hardware)
    assert any("becomes vLLM" in g for g in sglang) and any("enforce_eager" in g for g in sglang)
    hybrid = trl.gaps(_strategy("grpo", LAYOUTS[2], "none"), workload, hardware)
    assert any("no DeepSpeed hybrid engine" in g for g in hybrid)
    frozen = trl.gaps(_strategy("grpo", LAYOUTS[0], "colocate", ema=True), workload, hardware)
    assert any("EMA" in g for g in frozen)
    z3 = make_rlhf_strategy(
        LAYOUTS[3],
        None,
        {"zero_stage": 0},
        {"zero_stage": 3, "offload": "cpu"},
        with_critic=False,
        hybrid_engine=False,
        rollout=ROLLOUTS["colocate"],
        micro_batch=2,
        grad_accum=8,
    )
    assert [g for g in trl.gaps(z3, workload, hardware) if "prepares the" in g] == [
        "TRL prepares the reference model with the trainer's DeepSpeed config (ZeRO-3, offload cpu); the plan holds "
        "it at ZeRO-0, offload none"
    ]
    multi = trl.gaps(_strategy("grpo", LAYOUTS[2], "separate", grad_accum=4), workload, HW["2x4"])
    assert any("one vLLM server" in g for g in multi)


# --- Hugging Face Trainer and accelerate -------------------------------------------------------------


def _trainer_config_process_keys() -> set[str]:
    """The config keys transformers' HfTrainerDeepSpeedConfig.trainer_config_process fills (fill_match)."""
    import transformers

    source = (Path(transformers.__file__).parent / "integrations" / "deepspeed.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "trainer_config_process":
            return {
                call.args[0].value
                for call in ast.walk(node)
                if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "fill_match"
                and isinstance(call.args[0], ast.Constant)
            }
    raise AssertionError("no trainer_config_process in transformers/integrations/deepspeed.py")


def _autos(config: Any, prefix: str = "") -> set[str]:
    if not isinstance(config, dict):
        return {prefix} if config == "auto" else set()
    return set().union(*(_autos(v, f"{prefix}.{k}" if prefix else k) for k, v in config.items()))


@pytest.mark.parametrize("layout", LAYOUTS[:4])
def test_hf_autos_are_what_transformers_fills(layout: dict[str, Any]) -> None:
    strategy = Strategy(**layout, micro_batch=2, grad_accum=3, loss="chunked")
    workload = Workload(kind="sft", model=ACTOR, seq_len=512, global_batch=24, dtype="fp16")
    rendered = hf.render(strategy, workload, HW["1x4"], frameworks.file_layout("hf", "ds.json"))
    autos = _autos(json.loads(rendered.files["ds_config"]))
    assert autos and autos <= _trainer_config_process_keys() and autos == set(hf.AUTO_KEYS)
    kwargs = _snippet_kwargs(rendered.files["training_args"], "training_kwargs")
    assert set(kwargs) <= _training_arguments_fields()
    assert kwargs["per_device_train_batch_size"] == 2 and kwargs["gradient_accumulation_steps"] == 3
    assert kwargs["fp16"] is True and kwargs["bf16"] is False and kwargs["use_liger_kernel"] is True
    assert kwargs["deepspeed"] == "ds.json"


def test_accelerate_config_keys_exist() -> None:
    names = NAMES["accelerate"]
    for nodes, layout in (("1x4", LAYOUTS[0]), ("2x4", LAYOUTS[3])):
        strategy = Strategy(**layout, micro_batch=2, grad_accum=2)
        workload = Workload(kind="reward", model=ACTOR, seq_len=512, global_batch=16 * HW[nodes].nodes)
        rendered = accelerate.render(strategy, workload, HW[nodes], frameworks.file_layout("accelerate", "acc.yaml"))
        config = _yaml_doc(rendered.files["config"])
        assert set(config) <= set(names["fields"]) and set(config["deepspeed_config"]) <= set(names["deepspeed_config"])
        assert config["deepspeed_config"]["deepspeed_config_file"] == "acc.ds_config.json"
        assert config["num_processes"] == HW[nodes].world_size and config["num_machines"] == HW[nodes].nodes
        # accelerate's DeepSpeedPlugin._deepspeed_config_checks refuses these beside a config file
        refused = {"gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device"}
        assert not refused & set(config["deepspeed_config"]) and "mixed_precision" not in config
        assert json.loads(rendered.files["ds_config"])["zero_optimization"]["stage"] == layout["zero_stage"]


# --- formats and layout -------------------------------------------------------------------------------


def test_formats_refuse_the_other_kind_of_plan_in_one_line() -> None:
    rlhf = (_strategy("grpo", LAYOUTS[0], "colocate"), _workload("grpo"), HW["1x4"])
    single = (Strategy(), Workload(kind="sft", model=ACTOR, seq_len=512, global_batch=4), HW["1x4"])
    for fmt, plan in (("hf", rlhf), ("accelerate", rlhf), ("openrlhf", single), ("verl", single)):
        with pytest.raises(InputError) as info:
            frameworks.render(fmt, *plan, frameworks.file_layout(fmt, "x"))
        assert "\n" not in str(info.value) and fmt in str(info.value)
    with pytest.raises(InputError, match="--format must be one of"):
        frameworks.file_layout("json", "x.json")


def test_file_layout_puts_companions_beside_the_output() -> None:
    assert frameworks.file_layout("trl", "out/cfg.py") == {
        "kwargs": "out/cfg.py",
        "yaml": "out/cfg.yaml",
        "ds_config": "out/cfg.ds_config.json",
    }
    assert frameworks.file_layout("trl", "cfg.yaml")["yaml"] == "cfg.yaml"
    assert frameworks.file_layout("hf", "x.json") == {"ds_config": "x.json", "training_args": "x.training_args.py"}
    assert frameworks.file_layout("openrlhf", "go")["script"] == "go"


def test_frameworks_import_no_torch() -> None:
    code = (
        "import sys; import launch.frameworks.openrlhf, launch.frameworks.trl, launch.frameworks.verl, "
        "launch.frameworks.hf, launch.frameworks.accelerate; "
        "heavy = [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

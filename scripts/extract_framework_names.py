#!/usr/bin/env python3
"""Extract the option, field and key names of the frameworks ``planner export`` writes for, from their real
sources, into ``tests/data/framework_names.json`` (the tests check every emitted name against it).

Sources: the PyPI wheels of the pinned versions (``pip download --no-deps``; no dependency is installed and
nothing is imported: the files are read with ``ast`` and PyYAML). Each entry records the package, version,
wheel file name and its sha256, and the file inside the wheel the names come from.

- OpenRLHF 0.11.2 and 0.9.1.post1: ``openrlhf/cli/train_ppo_ray.py``, every ``parser.add_argument`` option
  (f-strings of the ``for prefix in (...)`` loops expanded), with its ``choices`` and whether it is a
  ``store_true`` switch.
- TRL: the dataclass fields of ``GRPOConfig``, ``SFTConfig``, ``DPOConfig``, ``RewardConfig`` and their base
  ``_BaseConfig`` (``trl/trainer/*_config.py``), and of ``trl vllm-serve``'s ``ScriptArguments``
  (``trl/scripts/vllm_serve.py``). The fields they inherit from transformers' ``TrainingArguments`` are read by
  the tests from the installed transformers.
- veRL: every key path of ``verl/trainer/config/_generated_ppo_trainer.yaml``, the fully composed
  ``ppo_trainer.yaml`` that veRL generates from its Hydra defaults (dict-valued paths included), and those whose
  value is mandatory (``???``).
- accelerate: the fields of ``BaseConfig`` and ``ClusterConfig`` (``accelerate/commands/config/config_args.py``)
  and the ``deepspeed_config[...]`` keys ``accelerate config`` writes (``accelerate/commands/config/cluster.py``).

Usage: python scripts/extract_framework_names.py [--wheels DIR] [--out tests/data/framework_names.json]
(without --wheels the five wheels are downloaded into a temporary folder).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

# entry -> (package, version). "openrlhf_classic": the last release whose train_ppo_ray takes every flat option name
# of launch.frameworks.openrlhf's "classic" style (--zero_stage, --prompt_max_len, --bf16, --vllm_num_engines ...).
PINS: dict[str, tuple[str, str]] = {
    "openrlhf": ("openrlhf", "0.11.2"),
    "openrlhf_classic": ("openrlhf", "0.9.1.post1"),
    "trl": ("trl", "1.16.0"),
    "verl": ("verl", "0.9.1"),
    "accelerate": ("accelerate", "1.15.0"),
}
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "framework_names.json"


def _wheel(folder: Path, entry: str) -> Path:
    package, version = PINS[entry]
    found = sorted(folder.glob(f"{package}-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no {package}-{version} wheel in {folder}")
    return found[0]


def _member(wheel: Path, suffix: str) -> tuple[str, str]:
    """(path inside the wheel, text) of the one member whose path ends with ``suffix``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(suffix)]
        if len(names) != 1:
            raise SystemExit(f"{wheel.name}: expected one {suffix}, found {names}")
        return names[0], archive.read(names[0]).decode("utf-8")


def _provenance(wheel: Path, entry: str, files: list[str]) -> dict[str, Any]:
    package, version = PINS[entry]
    return {
        "package": package,
        "version": version,
        "wheel": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "files": files,
    }


def _text(node: ast.expr, loop: dict[str, str]) -> str | None:
    """A string constant, or an f-string over loop variables bound in ``loop``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts: list[str] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                if value.value.id not in loop:
                    return None
                parts.append(loop[value.value.id])
            else:
                return None
        return "".join(parts)
    return None


def argparse_options(source: str) -> dict[str, dict[str, Any]]:
    """Every ``add_argument("--x", ...)`` option of ``source``: its choices and whether it is store_true."""
    options: dict[str, dict[str, Any]] = {}

    def visit(node: ast.AST, loop: dict[str, str]) -> None:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
            for item in node.iter.elts:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    for child in node.body:
                        visit(child, {**loop, node.target.id: item.value})
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            name = _text(node.args[0], loop) if node.args else None
            if name and name.startswith("--"):
                keywords = {k.arg: k.value for k in node.keywords if k.arg}
                choices = keywords.get("choices")
                action = keywords.get("action")
                options[name] = {
                    "choices": ast.literal_eval(choices) if choices is not None else None,
                    "store_true": isinstance(action, ast.Constant) and action.value == "store_true",
                }
        for child in ast.iter_child_nodes(node):
            visit(child, loop)

    visit(ast.parse(source), {})
    return dict(sorted(options.items()))


def dataclass_fields(source: str, classes: tuple[str, ...]) -> dict[str, list[str]]:
    """The annotated fields declared in the body of each class of ``classes`` (not inherited ones)."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            found[node.name] = [
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
    return found


def subscript_keys(source: str, variable: str) -> list[str]:
    """The string keys assigned as ``variable["key"] = ...`` in ``source``."""
    keys: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == variable
                    and isinstance(target.slice, ast.Constant)
                ):
                    keys.add(str(target.slice.value))
    return sorted(keys)


def key_paths(data: Any, prefix: str = "") -> list[str]:
    """Every dotted key path of a nested mapping, dict-valued ones included."""
    paths: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.append(path)
            paths.extend(key_paths(value, path))
    return paths


def mandatory_paths(data: Any, prefix: str = "") -> list[str]:
    """The dotted key paths whose value is OmegaConf's ``???`` (MISSING: reading one unset raises
    ``MissingMandatoryValue``)."""
    if isinstance(data, dict):
        return sorted(
            path
            for key, value in data.items()
            for path in mandatory_paths(value, f"{prefix}.{key}" if prefix else str(key))
        )
    return [prefix] if data == "???" else []


def extract(folder: Path) -> dict[str, Any]:
    """The names of all four frameworks from the wheels in ``folder``."""
    out: dict[str, Any] = {}
    for entry in ("openrlhf", "openrlhf_classic"):
        wheel = _wheel(folder, entry)
        path, text = _member(wheel, "openrlhf/cli/train_ppo_ray.py")
        out[entry] = {**_provenance(wheel, entry, [path]), "options": argparse_options(text)}

    wheel = _wheel(folder, "trl")
    configs: dict[str, list[str]] = {}
    files = []
    for module, cls in (
        ("base_config", "_BaseConfig"),
        ("grpo_config", "GRPOConfig"),
        ("sft_config", "SFTConfig"),
        ("dpo_config", "DPOConfig"),
        ("reward_config", "RewardConfig"),
    ):
        path, text = _member(wheel, f"trl/trainer/{module}.py")
        files.append(path)
        configs.update(dataclass_fields(text, (cls,)))
    path, text = _member(wheel, "trl/scripts/vllm_serve.py")
    files.append(path)
    configs.update(dataclass_fields(text, ("ScriptArguments",)))
    out["trl"] = {**_provenance(wheel, "trl", files), "fields": configs}

    wheel = _wheel(folder, "verl")
    path, text = _member(wheel, "verl/trainer/config/_generated_ppo_trainer.yaml")
    config = yaml.safe_load(text)
    out["verl"] = {
        **_provenance(wheel, "verl", [path]),
        "keys": sorted(set(key_paths(config))),
        "mandatory": mandatory_paths(config),
    }

    wheel = _wheel(folder, "accelerate")
    path, text = _member(wheel, "accelerate/commands/config/config_args.py")
    fields = dataclass_fields(text, ("BaseConfig", "ClusterConfig"))
    cluster_path, cluster = _member(wheel, "accelerate/commands/config/cluster.py")
    out["accelerate"] = {
        **_provenance(wheel, "accelerate", [path, cluster_path]),
        "fields": sorted({*fields["BaseConfig"], *fields["ClusterConfig"]}),
        "deepspeed_config": subscript_keys(cluster, "deepspeed_config"),
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="folder holding the five wheels (default: download them)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.wheels:
        data = extract(args.wheels)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            pins = [f"{package}=={version}" for package, version in PINS.values()]
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *pins], check=True)
            data = extract(Path(tmp))
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

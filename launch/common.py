"""What every framework renderer shares: the result record, the plan's checks and counts, and text helpers.

Pure Python (no torch, deepspeed or transformers). PyYAML (a dependency of optuna) is imported where YAML
is written.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from store.errors import InputError
from store.records import Hardware, RLHFStrategy, Strategy, Workload
from store.rollout import refuses_expandable_segments

# How the scripts mark what the user fills in: shell variables that stop the script when unset.
MODEL_VARS: dict[str, str] = {
    "actor": "ACTOR_MODEL",
    "critic": "CRITIC_MODEL",
    "reference": "REF_MODEL",
    "reward": "REWARD_MODEL",
}
DATA_VAR = "PROMPT_DATA"


@dataclass(frozen=True)
class Rendered:
    """One framework's export of a plan: file texts by role, what it cannot express, and how to run it.

    ``files`` maps a role (``"script"``, ``"kwargs"``, ``"yaml"``, ``"ds_config"`` ...) to the file's text,
    in the order :data:`launch.frameworks.FILE_ROLES` names them; ``gaps`` are sentences on what of the plan
    the framework cannot express (also written into the files that take comments); ``notes`` say how to
    launch it.
    """

    format: str
    files: dict[str, str]
    gaps: tuple[str, ...]
    notes: tuple[str, ...] = ()


def check_rlhf(strategy: RLHFStrategy, workload: Workload) -> None:
    """InputError unless ``workload`` is RLHF with prompt and generation lengths and PPO has a critic block."""
    if not workload.is_rlhf:
        raise InputError(f"RLHF configs need a ppo, remax or grpo workload, not {workload.kind!r}")
    if not workload.prompt_len or not workload.gen_len:
        raise InputError("RLHF configs need the prompt and generation lengths (--prompt-len P --gen-len G)")
    if workload.has_critic and strategy.critic is None:
        raise InputError("strategy: ppo trains a critic; give the strategy a critic block")


def max_out_tokens(workload: Workload) -> int:
    """Prompt plus generation tokens of an RLHF workload."""
    return int(workload.prompt_len or 0) + int(workload.gen_len or 0)


def trainer_gpus_per_node(strategy: RLHFStrategy, hardware: Hardware) -> int:
    """GPUs of each node that train: all of them, less the engine's own under the separate placement."""
    rollout = strategy.rollout
    if rollout is not None and not rollout.colocated:
        if rollout.engine_gpus >= hardware.gpus:
            raise InputError(
                f"strategy: rollout: engine_gpus {rollout.engine_gpus} leaves none of the {hardware.gpus} GPUs per "
                "node to train on"
            )
        return hardware.gpus - rollout.engine_gpus
    return hardware.gpus


def train_sequences(strategy: RLHFStrategy, hardware: Hardware) -> int:
    """Sequences of one optimizer step over all training GPUs (micro_batch x grad_accum x trainer ranks)."""
    return strategy.micro_batch * strategy.grad_accum * trainer_gpus_per_node(strategy, hardware) * hardware.nodes


def single_model_only(fmt: str, workload: Workload) -> None:
    """InputError (one line) for an RLHF plan in a single-model format."""
    if workload.is_rlhf:
        raise InputError(
            f"--format {fmt} is for single-model plans (sft, reward, dpo); this plan is {workload.kind}: "
            "use --format openrlhf, verl, trl (grpo) or deepspeed"
        )


def rlhf_only(fmt: str, workload: Workload) -> None:
    """InputError (one line) for a single-model plan in an RLHF-only format."""
    if not workload.is_rlhf:
        raise InputError(
            f"--format {fmt} is for RLHF plans (ppo, remax, grpo); this plan is {workload.kind}: "
            "use --format hf, accelerate, trl or deepspeed"
        )


def allocator_gaps(strategy: Strategy | RLHFStrategy, framework: str, empty_cache: bool = True) -> list[str]:
    """The empty_cache (unless ``empty_cache`` is False: the caller says it) and allocator settings a framework
    has no knob for (none for the defaults)."""
    gaps: list[str] = []
    if empty_cache and strategy.empty_cache != "never":
        gaps.append(
            f"{framework} decides itself when to call torch.cuda.empty_cache(); the plan's empty_cache "
            f"{strategy.empty_cache!r} has no setting there"
        )
    if strategy.allocator == "expandable-segments" and refuses_expandable_segments(getattr(strategy, "rollout", None)):
        gaps.append(
            "vLLM's sleep mode (CuMemAllocator.__init__, vllm/device_allocator/cumem.py) asserts that "
            "PYTORCH_CUDA_ALLOC_CONF holds no expandable_segments:True, and the colocated engine shares the "
            f"trainers' environment in {framework}: the plan's allocator setting is not exported (plan again: the "
            "search keeps the default allocator beside a sleeping vLLM)"
        )
    return gaps


def allocator_env(strategy: Strategy | RLHFStrategy) -> dict[str, str]:
    """The environment the plan's allocator setting needs (``PYTORCH_CUDA_ALLOC_CONF``), empty for the default
    allocator and beside a sleeping colocated vLLM engine, which refuses expandable segments
    (:func:`store.rollout.refuses_expandable_segments`)."""
    if strategy.allocator != "expandable-segments":
        return {}
    if refuses_expandable_segments(getattr(strategy, "rollout", None)):
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def env_lines(strategy: Strategy | RLHFStrategy) -> list[str]:
    """``export`` lines of the environment the plan needs (:func:`allocator_env`), for shell scripts."""
    return [f"export {name}={value}" for name, value in allocator_env(strategy).items()]


def comment_block(lines: list[str] | tuple[str, ...], mark: str = "#") -> str:
    """``lines`` as comment lines (empty input: empty text)."""
    return "".join(f"{mark} {line}\n" if line else f"{mark}\n" for line in lines)


def gap_comments(gaps: list[str] | tuple[str, ...], framework: str, mark: str = "#") -> str:
    """The gaps as a comment block headed by what they are."""
    if not gaps:
        return comment_block([f"Everything of the plan is expressed for {framework}."], mark)
    return comment_block([f"What {framework} cannot express of this plan:", *(f"- {g}" for g in gaps)], mark)


def shell_command(head: list[str], args: list[str], pairs: bool = True) -> str:
    """A shell command, one option (and its value) per continued line. Words that end in a ``$VAR``
    placeholder are double-quoted (``"$VAR"``, ``"key=$VAR"``) so the script's placeholders expand."""

    def quote(word: str) -> str:
        if re.fullmatch(r"[\w.=/-]*\$[A-Z_]+", word):
            return f'"{word}"'
        return shlex.quote(word)

    lines = [" ".join(quote(w) for w in head)]
    i = 0
    while i < len(args):
        word = args[i]
        if pairs and word.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{quote(word)} {quote(args[i + 1])}")
            i += 2
        else:
            lines.append(quote(word))
            i += 1
    return " \\\n  ".join(lines) + "\n"


def require_vars(names: dict[str, str]) -> str:
    """Shell lines that stop the script with a message when a placeholder variable is unset."""
    return "".join(f': "${{{name}:?set {name} to {what}}}"\n' for name, what in names.items())


def python_value(value: Any) -> str:
    """A Python literal for a JSON-like value (True/False/None, numbers, strings, lists, dicts)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {python_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def python_kwargs(name: str, kwargs: dict[str, Any]) -> str:
    """``name = dict(key=value, ...)`` with one keyword a line."""
    body = "".join(f"    {key}={python_value(value)},\n" for key, value in kwargs.items())
    return f"{name} = dict(\n{body})\n"


def yaml_text(data: dict[str, Any]) -> str:
    """``data`` as block YAML in its own key order."""
    import yaml  # type: ignore[import-untyped, unused-ignore]  # PyYAML ships no types (types-PyYAML)

    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def json_text(data: Any) -> str:
    """Indented JSON with a final newline (as planner export writes DeepSpeed configs)."""
    return json.dumps(data, indent=2) + "\n"

"""Exports of a plan for the frameworks people run: OpenRLHF, TRL, veRL, the Hugging Face Trainer and
accelerate (``planner export --format``). DeepSpeed's own configs are :mod:`launch.ds_config` and
:mod:`launch.rlhf_config`.

Each framework is one module with pure functions of (strategy, workload, hardware): the text of its files
and the list of what it cannot express of the plan. Nothing here imports torch, deepspeed or transformers;
the modules are imported on first use so ``planner recommend`` stays fast.

The names every module emits (options, config fields, Hydra keys) are checked by ``tests/probes/
test_frameworks.py`` against ``tests/data/framework_names.json``, extracted from the frameworks' released
sources by ``scripts/extract_framework_names.py``.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from launch.common import Rendered
from store.errors import InputError
from store.records import Hardware, RLHFStrategy, Strategy, Workload

__all__ = ["DEFAULT_OUTPUTS", "FILE_ROLES", "FORMATS", "Rendered", "file_layout", "launch_entries", "render"]

FORMATS: tuple[str, ...] = ("deepspeed", "openrlhf", "trl", "verl", "hf", "accelerate")
# The files of each framework format: role -> suffix after the output's stem, the primary role first.
FILE_ROLES: dict[str, dict[str, str]] = {
    "openrlhf": {"script": ".sh"},
    "verl": {"script": ".sh"},
    "trl": {"kwargs": ".py", "yaml": ".yaml", "ds_config": ".ds_config.json"},
    "hf": {"ds_config": ".json", "training_args": ".training_args.py"},
    "accelerate": {"config": ".yaml", "ds_config": ".ds_config.json"},
}
DEFAULT_OUTPUTS: dict[str, str] = {
    "deepspeed": "ds_config.json",
    "openrlhf": "run_openrlhf.sh",
    "trl": "trl_config.py",
    "verl": "run_verl.sh",
    "hf": "hf_ds_config.json",
    "accelerate": "accelerate_config.yaml",
}


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of :data:`FORMATS`; one InputError line otherwise."""
    if fmt not in FORMATS:
        shown = fmt if len(fmt) <= 30 else fmt[:27] + "..."
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, not {shown!r}")
    return fmt


def file_layout(fmt: str, output: str) -> dict[str, str]:
    """Where each file of a framework format goes, given the ``-o`` path: the role whose suffix ends like
    ``output`` (else the first role) is ``output`` itself, the others ``<stem><suffix>`` beside it."""
    roles = FILE_ROLES[check_format(fmt)]
    path = PurePath(output)
    primary = next((role for role, suffix in roles.items() if path.suffix and suffix.endswith(path.suffix)), None)
    primary = primary or next(iter(roles))
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    layout = {role: str(path if role == primary else path.with_name(stem + suffix)) for role, suffix in roles.items()}
    if len(set(layout.values())) != len(layout):
        raise InputError(f"-o {output}: its companion files would take the same name; choose another name")
    return layout


def render(
    fmt: str,
    strategy: Strategy | RLHFStrategy,
    workload: Workload,
    hardware: Hardware,
    paths: dict[str, str],
    more_gaps: tuple[str, ...] = (),
) -> Rendered:
    """The files and gaps of ``fmt`` (not ``deepspeed``) for the plan; ``paths`` from :func:`file_layout`;
    ``more_gaps``: lines the caller found (an engine the framework runs in place of the plan's) put first among
    the gaps, in the files too.

    Raises:
        InputError: the format does not apply to the workload (one line saying which formats do).
    """
    check_format(fmt)
    if fmt in ("openrlhf", "verl"):
        if not isinstance(strategy, RLHFStrategy):
            raise InputError(
                f"--format {fmt} is for RLHF plans (ppo, remax, grpo); this plan is {workload.kind}: "
                "use --format hf, accelerate, trl or deepspeed"
            )
        if fmt == "openrlhf":
            from launch.frameworks import openrlhf

            return openrlhf.script(strategy, workload, hardware, more_gaps)
        from launch.frameworks import verl

        return verl.script(strategy, workload, hardware, more_gaps)
    if fmt == "trl":
        from launch.frameworks import trl

        return trl.render(strategy, workload, hardware, paths, more_gaps)
    if fmt in ("hf", "accelerate"):
        if isinstance(strategy, RLHFStrategy):
            raise InputError(
                f"--format {fmt} is for single-model plans (sft, reward, dpo); this plan is {workload.kind}: "
                "use --format openrlhf, verl, trl (grpo) or deepspeed"
            )
        if fmt == "hf":
            from launch.frameworks import hf

            return hf.render(strategy, workload, hardware, paths)
        from launch.frameworks import accelerate

        return accelerate.render(strategy, workload, hardware, paths)
    raise InputError("--format deepspeed writes the DeepSpeed configs themselves (planner.files.atomic.write_configs)")


def launch_entries(strategy: RLHFStrategy, workload: Workload, hardware: Hardware) -> dict[str, dict[str, Any]]:
    """The RLHF launch flags the plan's JSON ``launch`` and the printed "Launch flags" lines carry, each
    ``{"flags": [...], "gaps": [...]}`` and each from the code that writes that framework's files (one source per
    framework): ``deepspeed_chat`` (:func:`launch.frameworks.deepspeed_chat.deepspeed_chat_flags`, step 3's
    ``main.py``; PPO
    only), ``openrlhf`` (OpenRLHF 0.11's ``train_ppo_ray``, as ``--format openrlhf`` writes them), ``verl`` (Hydra
    overrides, as ``--format verl``) and ``trl`` (``trl grpo`` options, as ``--format trl``; GRPO only)."""
    from launch.frameworks import openrlhf, trl, verl
    from launch.frameworks.deepspeed_chat import deepspeed_chat_flags, deepspeed_chat_gaps

    def deepspeed_chat(s: RLHFStrategy, w: Workload, h: Hardware) -> dict[str, Any]:
        return {"flags": deepspeed_chat_flags(s, w, h), "gaps": deepspeed_chat_gaps(s, w, h)}

    entries: dict[str, dict[str, Any]] = {}
    for name, build in (
        ("deepspeed_chat", deepspeed_chat),
        ("openrlhf", openrlhf.launch),
        ("verl", verl.launch),
        ("trl", trl.launch),
    ):
        try:
            entries[name] = build(strategy, workload, hardware)
        except InputError as exc:  # a plan this framework cannot take: its reason, the others still given
            entries[name] = {"flags": [], "gaps": [str(exc)]}
    return entries

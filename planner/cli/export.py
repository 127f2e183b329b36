"""``planner export``: write a saved plan's DeepSpeed config, or the files of the framework that runs it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from planner.cli.options import Db

FORMAT_HELP = (
    "deepspeed (the DeepSpeed config(s), default), openrlhf or verl (RLHF launch script), trl (config as Python "
    "and YAML), hf (TrainingArguments and its DeepSpeed config), accelerate (accelerate config YAML)."
)


def export_command(
    plan_id: Annotated[
        str | None, typer.Argument(help="Plan id or a unique prefix (default: the latest plan).")
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write (default by format: ds_config.json, run_openrlhf.sh, trl_config.py, run_verl.sh, "
            "hf_ds_config.json, accelerate_config.yaml); companion files go beside it.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite existing files.")] = False,
    format_: Annotated[str, typer.Option("--format", help=FORMAT_HELP)] = "deepspeed",
    db: Db = None,
) -> int:
    """Write the DeepSpeed config of a plan (or a framework's files), and print what lives outside it.

    Example: planner export -o ds_config.json; planner export --format openrlhf -o run_openrlhf.sh
    """
    from planner import export

    paths, document = export(plan_id, output, force=force, db=db, format=format_)
    for path in paths:
        print(f"wrote {path} (plan {document.get('plan_id', plan_id)})")
    differences = document.get("framework_differences", [])
    if differences:
        planned = document.get("workload", {}).get("framework", "deepspeed")
        print(f"The plan was made for {planned}; --format {format_} runs otherwise (plan again with --framework):")
        for line in differences:
            print(f"  * {line}")  # "  - " lines are the gaps, written into the files too
    if "export" in document:
        _print_framework(document["export"])
        return 0
    outside = document.get("outside_settings", {})
    if outside:
        print("Also apply, outside the DeepSpeed config:")
        for name, text in outside.items():
            print(f"  {name}: {text or 'leave unset'}")
    env = outside.get("PYTORCH_CUDA_ALLOC_CONF")
    if env:
        print(f"  export PYTORCH_CUDA_ALLOC_CONF={env}")
    for framework, flags in document.get("launch", {}).items():
        print(f"Launch flags for {framework.replace('_', ' ')}:")
        print("  " + " ".join(flags))
    return 0


def _print_framework(block: dict[str, Any]) -> None:
    """How to run a framework export and what the framework cannot express of the plan."""
    for note in block["notes"]:
        print(f"  {note}")
    gaps = block["gaps"]
    if not gaps:
        print(f"{block['format']} expresses everything of the plan.")
        return
    print(f"Not expressible in {block['format']} (also written into the files):")
    for gap in gaps:
        print(f"  - {gap}")

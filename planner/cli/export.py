"""``planner export``: write a saved plan's DeepSpeed config."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Db


def export_command(
    plan_id: Annotated[
        str | None, typer.Argument(help="Plan id or a unique prefix (default: the latest plan).")
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write the DeepSpeed config.")] = (
        "ds_config.json"
    ),
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing file.")] = False,
    db: Db = None,
) -> int:
    """Write the DeepSpeed config of a plan, and print the settings that are not DeepSpeed keys.

    Example: planner export -o ds_config.json
    """
    from planner import export

    paths, document = export(plan_id, output, force=force, db=db)
    for path in paths:
        print(f"wrote {path} (plan {document.get('plan_id', plan_id)})")
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

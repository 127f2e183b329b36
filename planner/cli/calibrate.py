"""``planner calibrate``: fit the cost model to one device's stored probes; ``planner calibrations``: list fits."""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.options import Db, Json


def calibrate_command(
    device_fingerprint: Annotated[
        str | None,
        typer.Option(
            "--device-fingerprint",
            help="The device to calibrate: a target (H100-80G, cpu:<model>) or a word of its name. "
            "Default: the only device with stored probes, or this machine's.",
        ),
    ] = None,
    records: Annotated[
        list[str] | None,
        typer.Option("--records", help="Also fit the measurements of this records file (tests/data/gpu shape)."),
    ] = None,
    held_out: Annotated[
        bool,
        typer.Option("--held-out/--no-held-out", help="Refit without each probe in turn to report held-out error."),
    ] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Fit and report, but store nothing.")] = False,
    host_benchmark: Annotated[
        bool,
        typer.Option(
            "--host-benchmark/--no-host-benchmark",
            help="Measure this host's memory rates first (about a second) when calibrating this machine's device.",
        ),
    ] = True,
    json_out: Json = False,
    db: Db = None,
) -> int:
    """Fit the cost model's coefficients to the probes stored for one device, and store the calibration.

    recommend, predict, check and probe use the newest calibration of the job's GPU from then on.

    Example: planner calibrate --device-fingerprint H100
    """
    from planner import calibrate

    report = calibrate(
        device_fingerprint=device_fingerprint,
        records=records or (),
        db=db,
        held_out=held_out,
        save=not dry_run,
        host_benchmark=host_benchmark,
    )
    if json_out:
        print(report.to_json())
    else:
        from planner.report.calibration_text import render_calibration

        render_calibration(report)
    return 0


def calibrations_command(
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many calibrations to list.")] = 20,
    target: Annotated[str | None, typer.Option("--target", help="Only calibrations of this device.")] = None,
    json_out: Json = False,
    db: Db = None,
) -> int:
    """List the stored calibrations, newest first: id, time, device, probes and held-out error.

    Example: planner calibrations --target H100-80G
    """
    from planner import calibrations

    records = calibrations(db=db, limit=limit, target=target)
    if json_out:
        import json

        documents = [
            {
                "calibration_id": r.calibration_id,
                "created_at": r.created_at.isoformat(),
                "target": r.target,
                "device": r.device,
                "version": r.version,
                "fingerprint": r.fingerprint,
                "values": r.values,
                "probe_ids": list(r.probe_ids),
                "report": r.report,
            }
            for r in records
        ]
        print(json.dumps(documents, indent=2))
    else:
        from planner.report.calibration_text import render_calibrations

        render_calibrations(records)
    return 0

"""Your program against memplan's own probe, per program style, on DeepSpeed's CPU accelerator.

    .venv/bin/python benchmarks/program_styles.py [--styles plain,trainer,accelerate,torchrun] [--out DIR]

For each style of tests/probes/script/programs (a plain DeepSpeed loop, an HF Trainer with "auto" values,
Accelerate with a DeepSpeed plugin, the plain loop over two gloo ranks under torchrun), one database holds
memplan's own probe (``planner probe``) and the program's runs (``planner probe ... -- CMD``) of the same two
strategies, for the programs' tiny Llama (fp32, sequences of 32 tokens). Printed per style, strategy and phase:
the program's measured peak allocated and reserved against the prediction, memplan's probe beside it, and the
program's reserved spread (what ``recommend --program`` keeps free). The CPU backend's reserved is its
allocated (no caching allocator), so the spread here is the program's allocated difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "probes" / "script" / "programs"
# the programs' own model, as plain_loop.py, trainer_program.py and accelerate_program.py build it
TINY_LLAMA = json.loads((PROGRAMS / "tiny_llama.json").read_text())
STRATEGIES = [
    {"zero_stage": 1, "micro_batch": 2, "grad_accum": 2},
    {"zero_stage": 2, "micro_batch": 2, "grad_accum": 2, "gradient_checkpointing": True},
]


def _styles(folder: Path) -> dict[str, tuple[list[str], int]]:
    """Style -> (launch command, ranks)."""
    mb, ga = str(STRATEGIES[0]["micro_batch"]), str(STRATEGIES[0]["grad_accum"])
    py = [sys.executable]
    torchrun = [*py, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0"]
    return {
        "plain": ([*py, str(PROGRAMS / "plain_loop.py"), "--steps", "1000"], 1),
        "trainer": (
            [
                *py,
                str(PROGRAMS / "trainer_program.py"),
                "--output-dir",
                str(folder / "trainer"),
                "--per-device-train-batch-size",
                mb,
                "--gradient-accumulation-steps",
                ga,
            ],
            1,
        ),
        "accelerate": (
            [*py, str(PROGRAMS / "accelerate_program.py"), "--batch-size", mb, "--gradient-accumulation-steps", ga],
            1,
        ),
        "torchrun": ([*torchrun, str(PROGRAMS / "plain_loop.py"), "--steps", "1000"], 2),
    }


def _planner(folder: Path, ranks: int, command: list[str] | None) -> dict[str, Any]:
    args = [
        sys.executable,
        "-m",
        "planner",
        "probe",
        "--model",
        str(folder / "config.json"),
        "--device",
        "cpu",
        "--workload",
        "sft",
        "--seq-len",
        "32",
        "--batch",
        str(4 * ranks),
        "--gpus",
        str(ranks),
        "--dtype",
        "fp32",
        "--steps",
        "3",
        "--timeout",
        "900",
        "--strategies",
        str(folder / "strategies.json"),
        "--db",
        f"sqlite:///{folder / 'plans.db'}",
        "--json",
    ]
    if command:
        args += ["--", *command]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"planner probe failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _mib(value: int | None) -> str:
    return f"{value / 2**20:.2f}" if value else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--styles", default="plain,trainer,accelerate,torchrun")
    parser.add_argument("--out", help="write each style's program report (JSON) here")
    args = parser.parse_args()
    print(
        "| style | strategy | outcome | phase | program alloc MiB | predicted MiB | error | memplan probe MiB "
        "| reserved spread |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for style in args.styles.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
            (folder / "strategies.json").write_text(json.dumps(STRATEGIES))
            command, ranks = _styles(folder)[style]
            _planner(folder, ranks, None)  # memplan's own probe first: the program's spread is against it
            report = _planner(folder, ranks, command)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{style}.json").write_text(json.dumps(report, indent=1))
        for run in report["runs"]:
            for phase in run["phases"]:
                error = phase.get("allocated_error")
                spread = phase.get("reserved_spread")
                print(
                    f"| {style} | {run['label']} | {run['outcome']} | {phase['name']} "
                    f"| {_mib(phase['measured_allocated_bytes'])} | {_mib(phase['predicted_allocated_bytes'])} "
                    f"| {'-' if error is None else f'{error:+.1%}'} | {_mib(phase.get('builtin_reserved_bytes'))} "
                    f"| {'-' if spread is None else f'{spread:+.1%}'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

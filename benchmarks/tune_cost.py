"""Probes and device-seconds that ``planner tune`` spends to confirm a plan, against the DeepSpeed autotuner's
published cost (9-34 full experiments and 11-40 minutes per Hugging Face model on 16 V100s; target: a tenth).

Usage:
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/tune_cost.py [--skip-cpu] [-o benchmarks/results/tune_cost.md]

Two kinds of rows:
- *simulated H100*: OPT-1.3b sft and ppo on an H100 that behaves as its measurements say. A stand-in probe
  runner measures what the cost model predicts under the coefficients fitted to ``tests/data/gpu`` (the
  calibration of that H100), while the tune starts from the defaults, as on a new machine. A probe costs the
  device the median set-up of the recorded H100 probes plus its steps. No GPU runs: the row measures how
  many probes the tune needs, not how fast a GPU is.
- *CPU backend*: real probes of DeepSpeed's CPU accelerator (a small Llama, sft and ppo), timed for real.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibration.gather import gather, loop_row_observation, records_file_entries  # noqa: E402
from planner.job.target import device_target  # noqa: E402
from search.calibration import Observation, calibrate  # noqa: E402
from search.calibration.observations import prediction_under  # noqa: E402
from search.coefficients import DEFAULT_COEFFICIENTS  # noqa: E402
from store.measurements import DeviceFingerprint, PhaseMeasurement, ProbeRequest, ProbeResult  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "tests" / "data" / "gpu" / "h100-2026-11-23.json"
AUTOTUNER = {"experiments": (9, 34), "minutes": (11, 40), "gpus": 16}  # DeepSpeed autotuning blog/paper
STEPS = 4
SMALL_LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}  # fmt: skip


class SimulatedH100:
    """A probe runner measuring the cost model under the H100's fitted coefficients (see the docstring)."""

    def __init__(self, truth: dict[str, float], setup_s: float) -> None:
        self.truth = truth
        self.setup_s = setup_s
        self.fingerprint = DeviceFingerprint(device="cuda", name="unknown GPU", total_memory_bytes=0)

    def __call__(self, request: ProbeRequest) -> ProbeResult:
        from planner.calibration.gather import probe_observation

        blank = {"phases": [], "extra": {"warmup_steps": 2}}
        obs = probe_observation("sim", request.to_dict(), blank, device_target("cuda"))
        prediction = prediction_under(obs, self.truth, DEFAULT_COEFFICIENTS)
        step = prediction.step_time_s
        if prediction.peak_reserved_bytes > request.hardware["gpu_memory_bytes"]:
            return ProbeResult(
                outcome="oom", message="CUDA out of memory", fingerprint=self.fingerprint, wall_s=self.setup_s
            )
        phases = tuple(
            PhaseMeasurement(p.name, p.peak_allocated_bytes, p.peak_reserved_bytes, p.time_s * p.count)
            for p in prediction.phases
        )
        spread = {"min": 0.99 * step, "median": step, "max": 1.01 * step, "steps": STEPS - 1}
        extra = {"step_time_s": spread, "warmup_steps": 2}
        wall = self.setup_s + STEPS * step
        return ProbeResult(outcome="ok", phases=phases, wall_s=wall, fingerprint=self.fingerprint, extra=extra)


def h100_truth() -> tuple[dict[str, float], float]:
    """The coefficients fitted to the H100 records, and the median set-up seconds of its probes."""
    probes, rows = records_file_entries(str(RECORDS))
    observations: list[Observation] = list(gather(probes, "H100").observations)
    observations += [loop_row_observation(row, "H100-80G") for row in rows]
    fit = calibrate(observations, leave_one_out=False)
    setups = [float(r["extra"]["setup_s"]) for _, _, r in probes if r.get("extra", {}).get("setup_s")]
    return dict(fit.values), statistics.median(setups)


def tune_row(label: str, model: str, *, device: str, runner: Any, db: str, **job: Any) -> dict[str, Any]:
    from planner import tune

    start = time.perf_counter()
    report = tune(model, device=device, steps=STEPS, runner=runner, db=db, max_probes=12, timeout_s=3600, **job)
    return {
        "label": label,
        "probes": report.probes_run,
        "candidates": report.candidates,
        "device_s": report.device_seconds,
        "wall_s": time.perf_counter() - start,
        "confirmed": report.confirmed,
        "stop": report.stop_reason,
        "plan": report.plan.strategy if report.plan else None,
    }


def _cpu_rows(folder: Path) -> list[dict[str, Any]]:
    """The CPU backend's rows: a small Llama's sft and ppo tuned for real, in ``folder``."""
    model = folder / "llama-small"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMALL_LLAMA))
    cpu = {"gpu_mem": "2G", "cpu_mem": "64G"}
    return [
        tune_row(
            "small Llama sft, CPU backend",
            str(model),
            device="cpu",
            runner=None,
            db=str(folder / "cpu-sft.db"),
            workload="sft",
            seq_len=256,
            batch=8,
            **cpu,
        ),
        tune_row(
            "small Llama ppo, CPU backend",
            str(model),
            device="cpu",
            runner=None,
            db=str(folder / "cpu-ppo.db"),
            workload="ppo",
            prompt_len=64,
            gen_len=64,
            batch=2,
            **cpu,
        ),
    ]


def _markdown(rows: list[dict[str, Any]], setup_s: float) -> str:
    """The result table, with the autotuner's published cost beside it."""
    lo, hi = AUTOTUNER["experiments"]
    lines = [
        "# Cost of a confirmed plan: planner tune against the DeepSpeed autotuner",
        "",
        f"DeepSpeed autotuner (published): {lo}-{hi} full experiments, {AUTOTUNER['minutes'][0]}-"
        f"{AUTOTUNER['minutes'][1]} minutes per Hugging Face model on {AUTOTUNER['gpus']} V100s; target a tenth "
        f"({lo / 10:.1f}-{hi / 10:.1f} experiments).",
        "",
        "Command: `DS_ACCELERATOR=cpu .venv/bin/python benchmarks/tune_cost.py -o benchmarks/results/tune_cost.md`",
        f"(simulated H100 probes cost {setup_s:.1f} s of set-up, the median of the recorded H100 probes, plus "
        f"{STEPS} steps).",
        "",
        "| tune | probes | of candidates | device-seconds | wall (s) | confirmed | plan |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        plan = json.dumps(r["plan"], sort_keys=True) if r["plan"] else "-"
        lines.append(
            f"| {r['label']} | {r['probes']} | {r['candidates']} | {r['device_s']:.1f} | {r['wall_s']:.1f} | "
            f"{'yes' if r['confirmed'] else 'no: ' + r['stop']} | `{plan}` |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cpu", action="store_true", help="only the simulated H100 rows")
    parser.add_argument("-o", "--output", help="write the markdown here too")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    truth, setup_s = h100_truth()
    h100 = {"gpu": "H100", "cpu_mem": "128G"}
    rows = [
        tune_row(
            "OPT-1.3b sft, simulated H100",
            "opt-1.3b",
            device="cuda",
            runner=SimulatedH100(truth, setup_s),
            db=str(folder / "sft.db"),
            workload="sft",
            seq_len=512,
            batch=8,
            **h100,
        ),
        tune_row(
            "OPT-1.3b sft, simulated H100 held to 20 GiB",
            "opt-1.3b",
            device="cuda",
            runner=SimulatedH100(truth, setup_s),
            db=str(folder / "sft-20g.db"),
            workload="sft",
            seq_len=1024,
            batch=16,
            gpu="H100",
            gpu_mem="20G",
            cpu_mem="128G",
        ),
        tune_row(
            "OPT-1.3b/350m ppo, simulated H100",
            "opt-1.3b",
            device="cuda",
            runner=SimulatedH100(truth, setup_s),
            db=str(folder / "ppo.db"),
            workload="ppo",
            critic_model="opt-350m",
            prompt_len=256,
            gen_len=256,
            batch=4,
            **h100,
        ),
    ]
    if not args.skip_cpu:
        rows += _cpu_rows(folder)
    text = _markdown(rows, setup_s)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()

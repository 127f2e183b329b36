"""A CPU probe with no ``--dtype`` computes in the dtype this processor runs fast, and says which and why.

bf16 where oneDNN has bf16 kernels, fp32 where it has none (torch's reference bf16 kernel is about 75x slower
there); an explicit bf16 on such a processor is kept with a warning. The processor's answer is asked of torch
for real in a child with ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN then behaves as on a processor without the
kernels) and patched in-process to each answer to follow it through ``probe`` and ``tune``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO

from store.measurements import ProbeRequest, ProbeResult

TINY_LLAMA = {
    "model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256,
}  # fmt: skip
JOB: dict[str, Any] = dict(workload="sft", gpu_mem="24G", cpu_mem="64G", batch=2, seq_len=32, steps=2, device="cpu")
STRATEGY = [{"zero_stage": 0, "micro_batch": 2, "grad_accum": 1}]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ONEDNN_MAX_CPU_ISA=AVX2 is x86-64's")
def test_without_onednn_bf16_kernels_the_fast_dtype_is_fp32_and_bf16_warns() -> None:
    code = (
        "import json; from probes.measure.cpu_support import cpu_bf16_is_fast, cpu_fast_dtype, cpu_bf16_slow_reason; "
        "print(json.dumps([cpu_bf16_is_fast(), cpu_fast_dtype(), cpu_bf16_slow_reason()]))"
    )
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", DS_ACCELERATOR="cpu")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    fast, (dtype, line), warning = json.loads(out.stdout.strip().splitlines()[-1])
    assert fast is False and dtype == "fp32"
    assert line.startswith("dtype: fp32") and "_is_mkldnn_bf16_supported() is False" in line and "\n" not in line
    assert warning.startswith("warning: --dtype bf16") and "75x" in warning


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


def _recording_runner(seen: list[str]) -> Any:
    def runner(request: ProbeRequest) -> ProbeResult:
        seen.append(request.workload["dtype"])
        return ProbeResult(outcome="error", phases=(), failed_phase="init", message="not run in this test")

    return runner


@pytest.mark.parametrize(
    ("bf16_fast", "asked", "ran", "said"),
    [
        (False, None, "fp32", "dtype: fp32 (this processor has no oneDNN bf16 kernels"),
        (True, None, "bf16", "dtype: bf16 (oneDNN runs bf16 on this processor"),
        (False, "bf16", "bf16", "warning: --dtype bf16 on a processor without oneDNN bf16 kernels"),
        (True, "bf16", "bf16", None),
        (False, "fp32", "fp32", None),
    ],
    ids=["no-kernels", "kernels", "bf16-asked-no-kernels", "bf16-asked-kernels", "fp32-asked"],
)
def test_a_cpu_probe_runs_the_fast_dtype_unless_asked_and_says_so(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bf16_fast: bool, asked: str | None, ran: str,
    said: str | None,
) -> None:  # fmt: skip
    import probes.measure.cpu_support
    from planner import probe

    monkeypatch.setattr(probes.measure.cpu_support, "cpu_bf16_is_fast", lambda: bf16_fast)
    strategies = tmp_path / "one.json"
    strategies.write_text(json.dumps(STRATEGY))
    seen: list[str] = []
    notes: list[str] = []
    dtype = {} if asked is None else {"dtype": asked}
    report = probe(
        str(tiny), runner=_recording_runner(seen), on_note=notes.append, strategies=str(strategies), layers="2",
        db=str(tmp_path / "p.db"), **JOB, **dtype,
    )  # fmt: skip
    assert seen == [ran] and report.rows[0].outcome == "error"
    dtype_notes = [n for n in notes if "dtype" in n]
    assert dtype_notes == ([] if said is None else [dtype_notes[0]])
    if said is not None:
        assert dtype_notes[0].startswith(said)


def test_tune_on_the_cpu_chooses_and_states_the_dtype_as_probe_does(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import probes.measure.cpu_support
    from planner import tune

    monkeypatch.setattr(probes.measure.cpu_support, "cpu_bf16_is_fast", lambda: False)
    seen: list[str] = []
    notes: list[str] = []
    tune(str(tiny), runner=_recording_runner(seen), on_note=notes.append, max_probes=1, db=str(tmp_path / "t.db"),
         **JOB)  # fmt: skip
    assert seen == ["fp32"]
    assert [n for n in notes if n.startswith("dtype: fp32")]


def test_a_run_stopped_while_its_ops_build_is_marked_interrupted(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C or SIGTERM (a KeyboardInterrupt in the planner) during the op build marks the run interrupted, as a
    failed build does, so that it reads as stopped, not as still running."""
    import sqlite3

    import probes
    from planner import probe

    def stopped(requests: Any, on_note: Any = None) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(probes, "prepare_ops", stopped)
    strategies = tmp_path / "one.json"
    strategies.write_text(json.dumps(STRATEGY))
    db = tmp_path / "p.db"
    with pytest.raises(KeyboardInterrupt):
        probe(str(tiny), strategies=str(strategies), layers="2", db=str(db), dtype="fp32", **JOB)
    with sqlite3.connect(db) as connection:
        assert [row[0] for row in connection.execute("SELECT status FROM probe_runs")] == ["interrupted"]

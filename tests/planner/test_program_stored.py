"""``planner probe ... -- CMD``: the user's own program run under the plan and its next best, its runs stored and
used (issue 33, item 4), and ``planner tune ... -- CMD``.

The job describes the program's model (its config.json), the strategies come from the search, the program really
ran each one (the engine's stage and micro-batch as the program saw them), and each phase's prediction sits beside
the measurement, close to it (the program builds the model the job names); the program and the hook are tested on
their own in ``tests/probes/script``.

Each run of ``planner probe ... -- CMD`` is a probe row keyed by the program's fingerprint (command line, the
script's sha256, library versions): a second call reuses it, a changed script file runs again. Where memplan's
own probe of the same strategy is stored too, the report shows the program's spread of peak reserved, and
``planner recommend --program`` keeps that spread free on top of the measured records' (and says so). ``planner
calibrate`` gathers the program's rows like any probe; ``planner tune ... -- CMD`` runs the program for its
candidates and stores those runs. One probe of the plan and its next best serves every test of this module.

The real CLI (``planner.cli.main``, the console script's code, run in this process from the program's folder: no
test here is about the planner's process; the program runs in processes of its own, as ever), the CPU backend, a
real SQLite file; the program is a plain DeepSpeed loop as users write it
(``tests/probes/script/programs/plain_loop.py``), a tiny Llama. Nothing depends on speed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import run_main

from store.measurements import STORED_OUTCOMES, ProbeRequest, ProbeResult, program_id

PROGRAMS = Path(__file__).resolve().parents[1] / "probes" / "script" / "programs"
# the plain loop's model, as a config.json the job names (programs/tiny_llama.json: what the programs build)
TINY_LLAMA = json.loads((PROGRAMS / "tiny_llama.json").read_text())


def _planner(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``planner ARGS`` run from ``folder``: its exit code, stdout and stderr."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        result = run_main(list(args))
    return subprocess.CompletedProcess(["planner", *args], result.rc, result.out, result.err)


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def _job(folder: Path) -> list[str]:
    return [
        "--model", str(folder / "config.json"), "--workload", "sft", "--seq-len", "32", "--batch", "4",
        "--dtype", "fp32",
    ]  # fmt: skip


def _db(folder: Path) -> list[str]:
    return ["--db", f"sqlite:///{folder / 'plans.db'}"]


class Program:
    """The program folder (config, a copy of the loop that a test may change, the strategy file), in a module."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
        shutil.copy(PROGRAMS / "plain_loop.py", folder / "plain_loop.py")
        self.script = folder / "plain_loop.py"
        self.strategy_file = folder / "strategy.json"  # one strategy, written once the search's plan has run

    def probe(self, *, searched: bool = False) -> dict[str, Any]:
        """``planner probe [job] --strategies strategy.json -- python plain_loop.py`` (``searched``: no
        ``--strategies``, the search's plan and its next best)."""
        strategies = [] if searched else ["--strategies", str(self.strategy_file)]
        return _json(
            _planner(
                self.folder,
                "probe",
                *_job(self.folder),
                "--device",
                "cpu",
                "--steps",
                "3",
                "--timeout",
                "600",
                *strategies,
                *_db(self.folder),
                "--json",
                "--",
                sys.executable,
                str(self.script),
                "--steps",
                "1000",
            )  # fmt: skip
        )


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The program probed under the search's plan and its next best, then under the plan's strategy again (reused),
    memplan's own probe of that strategy, the program once more (the spread); recommend with and without
    ``--program`` in the tests."""
    pytest.importorskip("deepspeed")
    program = Program(tmp_path_factory.mktemp("stored"))
    first = program.probe(searched=True)
    program.strategy_file.write_text(json.dumps(first["runs"][0]["strategy"]))
    second = program.probe()
    builtin = _json(
        _planner(
            program.folder,
            "probe",
            *_job(program.folder),
            "--device",
            "cpu",
            "--steps",
            "3",
            "--timeout",
            "600",
            "--strategies",
            str(program.strategy_file),
            *_db(program.folder),
            "--json",
        )  # fmt: skip
    )
    third = program.probe()
    return {"program": program, "first": first, "second": second, "builtin": builtin, "third": third}


def _recommend(program: Program, *more: str) -> subprocess.CompletedProcess[str]:
    return _planner(program.folder, "recommend", *_job(program.folder), "--gpu-mem", "24G", *_db(program.folder), *more)


def test_a_run_is_stored_with_its_fingerprint_and_reused(stored: dict[str, Any]) -> None:
    first, second = stored["first"]["runs"][0], stored["second"]["runs"][0]
    assert first["outcome"] == "ok", first["message"] + first["log_tail"][-1500:]
    assert first["probe_id"] and not first["reused"]
    assert second["reused"] and second["probe_id"] == first["probe_id"]
    assert stored["second"]["program_id"] == stored["first"]["program_id"]

    from store.db import open_storage

    with open_storage(f"sqlite:///{stored['program'].folder / 'plans.db'}") as storage:
        record = storage.get_probe(first["probe_id"])
    program = record.request.program
    assert program is not None and program["script"].endswith("plain_loop.py")
    assert len(program["script_sha256"]) == 64 and program["versions"]["deepspeed"]
    assert record.request.program_id == stored["first"]["program_id"]
    strategy = stored["first"]["runs"][0]["strategy"]
    assert record.request.strategy["zero_stage"] == strategy["zero_stage"]
    assert record.result.extra["program_run"]["ran_with"]["micro_batch"] == strategy["micro_batch"]
    assert record.result.fingerprint is not None and record.result.fingerprint.device == "cpu"


def test_the_report_shows_the_spread_once_memplans_probe_is_stored(stored: dict[str, Any]) -> None:
    assert stored["first"]["runs"][0]["spread"] is None  # memplan's own probe was not stored yet
    builtin = stored["builtin"]["rows"][0]
    assert builtin["outcome"] == "ok"
    run = stored["third"]["runs"][0]
    assert run["reused"] and run["builtin_probe_id"] == builtin["probe_id"]
    spreads = [phase["reserved_spread"] for phase in run["phases"] if phase["reserved_spread"] is not None]
    assert {"forward", "backward", "optimizer_step"} <= {p["name"] for p in run["phases"]}
    assert len(spreads) == len(run["phases"])
    assert run["spread"] == pytest.approx(max(spreads))
    for phase in run["phases"]:  # the spread is the program's peak reserved over memplan's probe's
        ratio = phase["measured_reserved_bytes"] / phase["builtin_reserved_bytes"] - 1
        assert phase["reserved_spread"] == pytest.approx(ratio)
        # the same strategy of a plain loop sits near memplan's own (torch's AdamW and its loss are its own)
        assert abs(phase["reserved_spread"]) < 0.5


def test_recommend_keeps_the_programs_spread_free(stored: dict[str, Any]) -> None:
    """Without --program a plan keeps its measured records' spread (search.spread); with it, the program's
    measured spread on top: (1 + records') x (1 + program's) - 1."""
    program: Program = stored["program"]
    spread = stored["third"]["runs"][0]["spread"]
    ident = stored["third"]["program_id"]
    fixed = json.loads(_recommend(program, "--json").stdout)
    records_spread = fixed["predicted"]["reserved_uncertainty"]
    basis = fixed["predicted"]["reserved_spread_basis"]
    assert records_spread == pytest.approx(basis["spread"]) and basis["program_factor"] == 1.0
    for ref in (ident, str(program.script), ident[:6]):
        plan = json.loads(_recommend(program, "--json", "--program", ref).stdout)
        kept = plan["predicted"]["reserved_uncertainty"]
        assert 1 + kept == pytest.approx((1 + records_spread) * (1 + max(0.0, spread))), ref
        assert plan["predicted"]["reserved_spread_basis"]["program_factor"] == pytest.approx(1 + max(0.0, spread))
        lines = [line for line in plan["readings"] if line.startswith("reserved spread:")]
        assert len(lines) == 1 and f"your program {ident}" in lines[0]
        assert "on top of the measured records' spread" in lines[0]
        block = plan["search"]["program_spread"]
        assert block["program_id"] == ident and block["measured_spread"] == pytest.approx(spread)
    text = _recommend(program, "--program", ident).stdout
    plan = json.loads(_recommend(program, "--json", "--program", ident).stdout)
    tenths = round(100 * plan["predicted"]["reserved_uncertainty"], 1)
    shown = f"{tenths:.0f}" if tenths == round(tenths) else f"{tenths:.1f}"
    assert f"reserved spread (+/-{shown}%)" in text  # the plan's table shows the spread it keeps free
    assert f"your program {ident}" in " ".join(text.split())


def test_recommend_with_an_unknown_program_is_one_line_and_exit_2(stored: dict[str, Any]) -> None:
    result = _recommend(stored["program"], "--program", "ffffffffffff")
    assert result.returncode == 2
    assert "no stored run of such a program" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_calibrate_gathers_the_programs_rows(stored: dict[str, Any]) -> None:
    from planner.calibration.gather import gather, stored_entries

    db = f"sqlite:///{stored['program'].folder / 'plans.db'}"
    gathered = gather(stored_entries(db, "cpu"), "cpu", db=db)
    labels = {observation.label for observation in gathered.observations}
    assert stored["first"]["runs"][0]["probe_id"] in labels  # the program's run
    assert stored["builtin"]["rows"][0]["probe_id"] in labels  # memplan's own probe beside it
    assert not gathered.skipped


def test_the_program_runs_the_plan_and_its_next_best(stored: dict[str, Any]) -> None:
    runs = stored["first"]["runs"]
    assert len(runs) == 2
    assert runs[0]["strategy"] != runs[1]["strategy"]
    for run in runs:
        assert run["outcome"] == "ok", run["message"] + run["log_tail"][-1500:]
        strategy, ran = run["strategy"], run["ran_with"]
        assert ran["zero_stage"] == strategy["zero_stage"]
        assert ran["micro_batch"] == strategy["micro_batch"]
        assert ran["grad_accum"] == strategy["grad_accum"]


def test_the_program_is_stopped_after_its_timed_steps(stored: dict[str, Any]) -> None:
    for run in stored["first"]["runs"]:
        # the loop would print "finished" after its own 1000 steps
        assert "finished" not in run["log_tail"]
        assert run["exit_code"] == 0


def test_each_phase_sits_beside_its_prediction(stored: dict[str, Any]) -> None:
    for run in stored["first"]["runs"]:
        names = [phase["name"] for phase in run["phases"]]
        assert {"forward", "backward", "optimizer_step"} <= set(names)
        for phase in run["phases"]:
            assert phase["measured_allocated_bytes"] > 0
            assert phase["predicted_allocated_bytes"] is not None
            # the program is the user's, not the probes' loop: its optimizer (torch's AdamW here) and loss are
            # its own, which is the spread this command exists to show (ZeRO-3's optimizer step: about +12%)
            assert abs(phase["allocated_error"]) <= 0.15, (run["label"], phase)
        # the step's peak, which decides whether a plan fits: the 10% the built-in CPU probes meet
        measured = max(phase["measured_allocated_bytes"] for phase in run["phases"])
        predicted = max(phase["predicted_allocated_bytes"] for phase in run["phases"])
        assert abs(predicted / measured - 1.0) <= 0.10, (run["label"], measured, predicted)
        assert run["measured_step_s"] is not None and run["measured_step_s"] > 0


def test_the_report_names_the_program(stored: dict[str, Any]) -> None:
    assert stored["first"]["program"]["script"].endswith("plain_loop.py")
    assert stored["first"]["device"] == "cpu"


def test_no_command_after_the_separator_is_one_line_and_exit_2() -> None:
    from planner.probing.program import probe_program
    from store.errors import InputError

    with pytest.raises(InputError, match="after --"):
        probe_program("opt-125m", [], device="cpu")


def test_a_changed_script_is_not_reused(stored: dict[str, Any]) -> None:
    """Runs last in this module: it changes the script file."""
    program: Program = stored["program"]
    program.script.write_text(program.script.read_text() + "\n# changed: another program\n")
    refused = _recommend(program, "--program", str(program.script))
    assert refused.returncode == 2 and "the file changed since" in refused.stderr, refused.stderr
    again = program.probe()
    run = again["runs"][0]
    assert run["outcome"] == "ok", run["message"] + run["log_tail"][-1500:]
    assert not run["reused"] and run["probe_id"] != stored["first"]["runs"][0]["probe_id"]
    assert again["program_id"] != stored["first"]["program_id"]
    assert again["program"]["script_sha256"] != stored["first"]["program"]["script_sha256"]


def test_tune_runs_the_program_for_its_candidates(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    program = Program(tmp_path)
    report = _json(
        _planner(
            tmp_path,
            "tune",
            *_job(tmp_path),
            "--device",
            "cpu",
            "--steps",
            "3",
            "--timeout",
            "600",
            "--max-probes",
            "1",
            *_db(tmp_path),
            "--json",
            "--",
            sys.executable,
            str(program.script),
            "--steps",
            "1000",
        )  # fmt: skip
    )
    assert report["probes_run"] == 1 and report["rows"]
    row = report["rows"][0]
    assert row["outcome"] == "ok", row

    from store.db import open_storage

    with open_storage(f"sqlite:///{tmp_path / 'plans.db'}") as storage:
        record = storage.get_probe(row["probe_id"])
    assert record.request.program is not None and record.request.program["script"] == str(program.script)
    assert record.request.strategy == row["strategy"]
    ran = record.result.extra["program_run"]["ran_with"]
    assert ran["zero_stage"] == row["strategy"]["zero_stage"] and ran["micro_batch"] == row["strategy"]["micro_batch"]
    assert report["study"].startswith("memplan-tune-")


def test_the_key_of_memplans_own_probe_is_unchanged_and_a_program_is_part_of_it() -> None:
    request = ProbeRequest(workload={"kind": "sft", "model": "m"}, strategy={"zero_stage": 2}, hardware={})
    versions = {"torch": "2"}
    assert "program" not in request.to_dict()  # the JSON stored before programs were probed
    assert ProbeRequest.from_dict(request.to_dict()) == request
    program = {"command": ["python", "t.py"], "script": "/t.py", "script_sha256": "ab", "versions": versions}
    ran = ProbeRequest(**{**request.to_dict(), "program": program})
    changed = ProbeRequest(**{**request.to_dict(), "program": {**program, "script_sha256": "cd"}})
    assert len({request.key(versions), ran.key(versions), changed.key(versions)}) == 3
    assert ran.program_id == program_id(program) and len(program_id(program)) == 12
    assert ProbeRequest.from_dict(ran.to_dict()) == ran


def test_the_store_keeps_a_programs_own_outcomes(tmp_path: Path) -> None:
    from store.db import open_storage

    program = {"command": ["python", "t.py"], "script": "/t.py", "script_sha256": "ab", "versions": {}}
    request = ProbeRequest(workload={"kind": "sft", "model": "m"}, strategy={}, hardware={}, program=program)
    assert {"contradicts_plan", "not_applied", "no_initialize"} <= set(STORED_OUTCOMES)
    with open_storage(f"sqlite:///{tmp_path / 'p.db'}") as storage:
        saved = storage.save_probe(request, ProbeResult(outcome="no_initialize", message="m"), key="k1")
        found = storage.find_probe("k1")
        assert found is not None and found.probe_id == saved.probe_id and found.request.program == program
        with pytest.raises(ValueError):
            storage.save_probe(request, ProbeResult(outcome="bogus"), key="k2")


def test_the_applied_spread_without_a_pair_and_below_zero() -> None:
    from planner.planning.program_spread import PhaseSpread, ProgramSpread, RunSpread, applied_spread

    program = {"command": ["python", "t.py"], "script": "/x/t.py", "script_sha256": "ab", "versions": {}}
    alone = ProgramSpread("abcdef123456", program, runs_stored=2, pairs=())
    spread, line, block = applied_spread(alone, "H100-80G")
    assert spread == 0.0 and block["measured_spread"] is None  # the measured records' spread alone
    assert line.startswith("reserved spread: the measured records' only") and "run planner probe" in line
    less = RunSpread("p1", "b1", {"zero_stage": 2}, "H100-80G", (PhaseSpread("backward", 90, 100),))
    elsewhere = RunSpread("p2", "b2", {"zero_stage": 3}, "cpu:x", (PhaseSpread("backward", 130, 100),))
    found = ProgramSpread("abcdef123456", program, runs_stored=2, pairs=(less, elsewhere))
    spread, line, block = applied_spread(found, "H100-80G")
    assert spread == 0.0 and block["measured_spread"] == pytest.approx(-0.1)  # the job's GPU first
    assert "kept at 0" in line and "t.py" in line
    spread, line, _ = applied_spread(found, "A100-80G")  # none on it: every device's worst
    assert spread == pytest.approx(0.3) and "measured on cpu:x and applied to a job on A100-80G" in line


def test_a_programs_non_finite_values_are_stored_by_name() -> None:
    """A Trainer's resolved DeepSpeed config can carry ``inf``; the store keeps strict JSON, so the run is kept
    with the value's name instead of failing to save (seen with the Trainer style on the CPU backend)."""
    import json
    from types import SimpleNamespace

    from planner.probing.program import stored_result

    result = SimpleNamespace(
        outcome="ok", phases=(), failed_phase=None, message="", host_rss_peak_bytes=1, wall_s=1.0,
        reason="", ran_with={"gradient_clipping": float("inf")}, contradictions=(), not_applied=(), exit_code=0,
        log_tail="", failed_rank=None, steps_done=3, timed_out=False, step_time_s={"median": float("nan")},
        phase_time_s={}, world_size=1, worst_rank=0,
        ranks=[{"rank": 0, "program_config": {"max_grad_norm": float("-inf")}}],
    )  # fmt: skip
    stored = stored_result(result, "cpu")
    text = json.dumps(stored.extra, allow_nan=False)
    assert '"inf"' in text and '"-inf"' in text and '"nan"' in text

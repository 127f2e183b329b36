"""Fuzzing every ``planner`` command with bad input, with the promise as the oracle.

Each case is a command that would be valid but for one bad value drawn from a class: sizes, numbers, model
configs, DeepSpeed configs, database URLs and files, ids, formats and combinations of options. For every case
the promise is checked (``Promise``): exit code 2, exactly one ``planner: error:`` line on stderr and nothing
on stdout, no traceback, nothing written (no file created or changed in the case's folder, where
``$PLANNER_DB`` and the user data folder point too), no process left behind, and an answer within
``CPU_SECONDS`` of CPU time (a wall-clock alarm ends a hang).

Commands run in-process through ``planner.cli.main`` (fast); ``test_real_processes`` runs a few as real
processes (``python -m planner``), where stderr holds everything the user would see, libraries' logging
included. Probing commands never reach a probe: ``probes.run_probe`` and ``probes.prepare_ops`` are replaced
by a function that fails the case.

The classes that generation explores better than a list does use Hypothesis (derandomized, a bounded number
of examples, part of the normal suite); ``HYPOTHESIS_PROFILE=release`` runs 40 times as many. Set
``MEMPLAN_FUZZ_TOTALS=FILE`` to have the totals (cases tried, refused as promised) written there.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fault_processes import stat_fields
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from planner_helpers import REPO, subprocess_env

CPU_SECONDS = 5.0  # a refusal takes far less CPU time than this
WALL_ALARM_S = 120  # wall clock: ends a case that hangs (far above any answer on a loaded machine)
EXAMPLES = 40 if os.environ.get("HYPOTHESIS_PROFILE") == "release" else 1
TOTALS: Counter[str] = Counter()
H100_RECORDS = REPO / "tests" / "data" / "gpu" / "h100-2026-11-23.json"
H100_PROBES = [p for p in json.loads(H100_RECORDS.read_text())["probes"] if p["result"].get("outcome") == "ok"]

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 2048,
}
TINY_MIXTRAL: dict[str, Any] = {
    **TINY_LLAMA,
    "model_type": "mixtral",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
DS_OK: dict[str, Any] = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2},
}


def fuzz_settings(examples: int) -> Callable[[Any], Any]:
    """Hypothesis settings of one test: ``examples`` examples (x40 under the release profile), derandomized."""
    return settings(
        max_examples=examples * EXAMPLES,
        deadline=None,
        derandomize=os.environ.get("HYPOTHESIS_PROFILE") != "release",
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        database=None,
    )


# --- the promise -----------------------------------------------------------------------------------------


@dataclass
class Case:
    """One command to run in a fresh folder: its options (``None`` for a flag), positionals and files."""

    command: str
    options: dict[str, str | None]
    positionals: list[str] = field(default_factory=list)
    files: dict[str, bytes | dict[str, Any] | list[Any]] = field(default_factory=dict)
    fifo: str | None = None
    copy_plans: bool = False  # the folder starts with plans.db: a database holding one saved plan

    def with_option(self, name: str, value: str | None) -> Case:
        """The case with option ``name`` set (or replaced) to ``value``."""
        return Case(
            self.command,
            {**self.options, name: value},
            list(self.positionals),
            dict(self.files),
            self.fifo,
            self.copy_plans,
        )

    def argv(self, folder: Path) -> list[str]:
        """The command line, with ``@name`` standing for the file ``name`` of the case's folder."""

        def place(text: str) -> str:
            return str(folder / text[1:]) if text.startswith("@") else text

        args = [self.command, *(place(p) for p in self.positionals)]
        for name, value in self.options.items():  # --name=value: a value may start with '-'
            if value is None:
                args.append(name)
            else:
                args.extend([f"{name}={place(value)}"] if name.startswith("--") else [name, place(value)])
        return args


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder``: (size, modification time) by relative path."""
    found: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            info = path.lstat()
            found[str(path.relative_to(folder))] = (info.st_size if not path.is_dir() else 0, info.st_mtime_ns)
    return found


def _children() -> list[int]:
    """Processes whose parent is this one (Linux: read from /proc, fault_processes.stat_fields): two scans of every
    process a case, before and after."""
    me = str(os.getpid()).encode()
    found: list[int] = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        fields = stat_fields(int(entry)) if entry.isdigit() else []
        if len(fields) > 1 and fields[1] == me and fields[0] != b"Z":
            found.append(int(entry))
    return found


@dataclass
class Outcome:
    """What one case did."""

    argv: list[str]
    rc: int | str
    out: str
    err: str
    changed: list[str]
    children: list[int]
    cpu_s: float

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    def broken(self) -> list[str]:
        """The parts of the promise this outcome breaks (none: refused as promised)."""
        problems: list[str] = []
        if "Traceback" in self.out + self.err or isinstance(self.rc, str):
            problems.append(f"a traceback or an exception out of main: {self.rc}")
        if self.rc != 2:
            problems.append(f"exit code {self.rc}, not 2")
        if len(self.err_lines) != 1 or not self.err_lines[0].startswith("planner: error: "):
            problems.append(f"stderr is not one 'planner: error:' line: {self.err_lines[:4]}")
        if self.out.strip():
            problems.append(f"stdout is not empty: {self.out[:200]!r}")
        if self.changed:
            problems.append(f"files written: {self.changed}")
        if self.children:
            problems.append(f"processes left: {self.children}")
        if self.cpu_s > CPU_SECONDS:
            problems.append(f"{self.cpu_s:.1f} CPU seconds")
        return problems


class Promise:
    """Runs cases in fresh folders and checks the promise; counts what it tried and what held."""

    def __init__(self, plans_db: Path) -> None:
        self.plans_db = plans_db

    @contextlib.contextmanager
    def _folder(self, case: Case) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="fuzz-") as name:
            folder = Path(name)
            for file, content in case.files.items():
                data = content if isinstance(content, bytes) else json.dumps(content).encode()
                (folder / file).parent.mkdir(parents=True, exist_ok=True)
                (folder / file).write_bytes(data)
            if case.fifo:
                os.mkfifo(folder / case.fifo)
            if case.copy_plans:
                shutil.copy(self.plans_db, folder / "plans.db")
            yield folder

    def run(self, case: Case) -> Outcome:
        """Run ``case`` in-process in a fresh folder (its working folder, ``$PLANNER_DB`` and data folder)."""
        from planner.cli import main

        with self._folder(case) as folder, _environment(folder):
            argv = case.argv(folder)
            before, running = _tree(folder), set(_children())
            out, err = io.StringIO(), io.StringIO()
            start = time.process_time()
            rc: int | str
            try:
                with _alarm(WALL_ALARM_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    rc = main(argv)
            except BaseException as exc:  # noqa: BLE001 - any escape from main breaks the promise
                rc = f"{type(exc).__name__}: {exc}"
            spent = time.process_time() - start
            after = _tree(folder)
            changed = sorted(path for path in after if before.get(path) != after[path])
            left = sorted(set(_children()) - running)
            return Outcome(argv, rc, out.getvalue(), err.getvalue(), changed, left, spent)

    def refused(self, case: Case, *fragments: str) -> str:
        """Assert that ``case`` is refused as promised (its error line holding ``fragments``); the line."""
        outcome = self.run(case)
        TOTALS["tried"] += 1
        problems = outcome.broken()
        line = outcome.err_lines[0] if outcome.err_lines else ""
        problems += [f"{fragment!r} not in the error line" for fragment in fragments if fragment not in line]
        assert not problems, f"{outcome.argv}: {'; '.join(problems)}\nstderr: {outcome.err[-2000:]}"
        TOTALS["refused as promised"] += 1
        return line


@contextlib.contextmanager
def _environment(folder: Path) -> Iterator[None]:
    """The case's folder as working folder, default database and user data folder."""
    saved = {key: os.environ.get(key) for key in ("PLANNER_DB", "XDG_DATA_HOME")}
    cwd = os.getcwd()
    os.environ["PLANNER_DB"] = str(folder / "default.db")
    os.environ["XDG_DATA_HOME"] = str(folder / "xdg")
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def on_alarm(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"no answer within {seconds} s: the command hangs")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _no_probe(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("a fuzz case reached a real probe: it should have been refused before")


@pytest.fixture(scope="module")
def promise(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promise]:
    """The promise checker, with a database holding one saved plan (``copy_plans``), and no real probe."""
    from planner_helpers import run_main

    folder = tmp_path_factory.mktemp("fuzz-plans")
    plans_db = folder / "plans.db"
    made = run_main(["recommend", *JOB, "--db", str(plans_db), "--json"])
    assert made.rc == 0, made.err
    from transformers import AutoConfig

    AutoConfig.for_model("llama")  # transformers imported once, outside every case's CPU time
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("probes.run_probe", _no_probe)
        mp.setattr("probes.prepare_ops", _no_probe)
        yield Promise(plans_db)
    report = os.environ.get("MEMPLAN_FUZZ_TOTALS")
    if report:
        Path(report).write_text(json.dumps(dict(TOTALS)) + "\n")


# --- the commands and what each takes --------------------------------------------------------------------

JOB = ("--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G", "--workload", "sft")
JOB_OPTIONS: dict[str, str | None] = dict(zip(JOB[::2], JOB[1::2], strict=True))
PROBING = {**JOB_OPTIONS, "--device": "cpu", "--db": "@probes.db"}
BASES: dict[str, Case] = {
    "recommend": Case("recommend", {**JOB_OPTIONS, "--db": "@new.db"}),
    "predict": Case("predict", {**JOB_OPTIONS, "--zero": "2"}),
    "check": Case(
        "check", {k: v for k, v in JOB_OPTIONS.items() if k != "--workload"}, ["@ds.json"], {"ds.json": DS_OK}
    ),
    "probe": Case("probe", dict(PROBING)),
    "tune": Case("tune", dict(PROBING)),
    "export": Case("export", {"--db": "@plans.db", "-o": "@out.json"}, copy_plans=True),
    "explain": Case("explain", {"--db": "@plans.db"}, copy_plans=True),
    "plans": Case("plans", {"--db": "@plans.db"}, copy_plans=True),
    "probes": Case("probes", {"--db": "@plans.db"}, copy_plans=True),
    "calibrations": Case("calibrations", {"--db": "@plans.db"}, copy_plans=True),
    "calibrate": Case(
        "calibrate",
        {"--records": "@records.json", "--device-fingerprint": "H100", "--dry-run": None, "--db": "@plans.db"},
        files={"records.json": {"probes": H100_PROBES[:2]}},  # two probes: a fit in a second
        copy_plans=True,
    ),
}
JOB_COMMANDS = ("recommend", "predict", "check", "probe", "tune")
FORMATS = ("deepspeed", "openrlhf", "trl", "verl", "hf", "accelerate")
DB_COMMANDS = tuple(BASES)  # every command takes --db


def _base(command: str) -> Case:
    """A copy of the valid case of ``command``, to change one thing of."""
    base = BASES[command]
    return Case(base.command, dict(base.options), list(base.positionals), dict(base.files), base.fifo, base.copy_plans)


@pytest.mark.parametrize("command", sorted(BASES))
def test_every_base_case_is_valid(promise: Promise, command: str) -> None:
    """Each class changes one value of these cases: unchanged, each is accepted (a probing command goes as
    far as its first probe), so a refusal of a changed one is the changed value's."""
    case = _base(command)
    if command == "explain":
        with sqlite3.connect(promise.plans_db) as conn:
            case.positionals = [conn.execute("SELECT plan_id FROM plans").fetchone()[0]]
    outcome = promise.run(case)
    if command in ("probe", "tune"):
        assert outcome.rc == 1, (outcome.rc, outcome.err[-2000:])  # the stand-in's error: an internal error's line
        assert "planner: internal error: AssertionError: a fuzz case reached a real probe" in outcome.err
    else:
        assert outcome.rc == 0, outcome.err[-2000:]


# --- classes of bad values -------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*\d+(\.\d+)? *([KMGT](i?B)?|B)?\s*$", re.IGNORECASE | re.ASCII)


def _could_be_size(text: str) -> bool:
    """What docs/contracts.md calls a memory size (24G, 24GB, 24GiB, 24576MiB, 25769803776), read independently of
    ``store.sizes``; text that is not one must be refused."""
    return bool(_SIZE.match(text))


BAD_SIZES = st.one_of(
    st.text(max_size=20).filter(lambda t: not _could_be_size(t)),
    st.integers(max_value=0).map(str),
    st.integers(min_value=2**50 + 1, max_value=10**40).map(str),
    st.from_regex(r"\A[0-9]{1,4}(\.[0-9])? ?[AC-FH-JLN-SU-Z]i?B\Z"),  # a letter that is no unit
    st.sampled_from(["nan", "inf", "-inf", "1e3G", "24 G B", "\u0662\u0664G", "24G\x00", "0G", "0.0B", "-0", "2P"]),
)


def _not_int(text: str) -> bool:
    """Whether ``text`` is no whole number as the CLI reads one (``int()``, or a float with nothing after the
    point: ``8.0`` is 8)."""
    try:
        int(text)
    except ValueError:
        pass
    else:
        return False
    try:
        number = float(text)
    except ValueError:
        return True
    return not (math.isfinite(number) and number.is_integer())


NOT_INTS = st.one_of(
    st.text(max_size=12).filter(_not_int),
    st.sampled_from(["1.5", "0x10", "", "++1", "seven", "nan", "inf", "9" * 5000]),  # int() reads 4300 digits
)


def _bad_ints(lowest: int, highest: int | None) -> st.SearchStrategy[str]:
    """Text for a whole-number option of ``lowest`` to ``highest``: outside the range, or not a whole number."""
    outside = st.integers(max_value=lowest - 1)
    if highest is not None:
        outside = outside | st.integers(min_value=highest + 1, max_value=10**30)
    return outside.map(str) | NOT_INTS


# (command, option, lowest, highest): each whole-number option and its range
COUNTS: list[tuple[str, str, int, int | None]] = [
    *((c, "--gpus", 1, 1024) for c in JOB_COMMANDS),
    *((c, "--nodes", 1, 65536) for c in ("recommend", "predict", "check", "probe")),
    *((c, "--batch", 1, 2**20) for c in ("recommend", "predict", "probe", "tune")),
    *((c, "--seq-len", 1, 2048) for c in JOB_COMMANDS),  # opt-125m's context is 2048 tokens
    *((c, "--ppo-epochs", 1, 1000) for c in ("recommend", "predict", "probe", "tune")),
    ("recommend", "--top", 0, None),
    ("recommend", "--seed", 0, 2**32 - 1),
    ("recommend", "--lora-rank", 0, 2**20),
    ("predict", "--lora-rank", 0, 2**20),
    ("check", "--lora-rank", 0, 2**20),
    ("predict", "--zero", 0, 3),
    ("predict", "--micro-batch", 1, 8),  # it must divide the 8 samples per GPU
    ("plans", "-n", 1, 100_000),
    ("probes", "-n", 1, 100_000),
    ("calibrations", "--limit", 1, 100_000),
    ("probe", "--steps", 2, 1000),
    ("tune", "--steps", 2, 1000),
    ("tune", "--max-probes", 1, 50),
]
SIZE_SLOTS = [
    *((c, option) for c in JOB_COMMANDS for option in ("--gpu-mem", "--cpu-mem")),
    ("probe", "--memory-cap"),
    ("tune", "--memory-cap"),
]


def _not_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return True
    return False


def _bad_floats(lowest: float, highest: float, *, low_open: bool) -> st.SearchStrategy[str]:
    """Text for a number option of ``lowest`` to ``highest`` (``low_open``: ``lowest`` itself is out)."""

    def outside(x: float) -> bool:
        if math.isnan(x) or math.isinf(x):
            return True
        return x < lowest or x > highest or (low_open and x == lowest)

    return st.floats().filter(outside).map(repr) | st.text(max_size=10).filter(_not_float)


FLOAT_SLOTS = [
    ("probe", "--timeout", 0.0, 86_400.0, True),
    ("tune", "--timeout", 0.0, 86_400.0, True),
    *((c, "--safety-margin", 0.0, 0.4999, False) for c in ("recommend", "predict", "check", "tune")),
    *((c, "--inter-node-gbps", 0.0, 100_000.0, True) for c in ("recommend", "predict", "check")),
]

BAD_COUNTS_OF_A_MODEL = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=2**24 + 1, max_value=10**30),
    st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


NOT_MODEL_CONFIGS = [
    *(b"", b"{", b"[]", b'"llama"', b"\xff\xfe", b"[" * 5000, b'{"hidden_size": ' + b"9" * 500 + b"}"),
    *(b"{}", b'{"model_type": 7}', b'{"model_type": "nosuch"}'),
    # read by transformers (no formula): a field of the wrong type, an encoder, a text model out of bounds
    b'{"model_type": "qwen3", "hidden_size": "wide"}',
    b'{"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}',
    b'{"model_type": "llava", "text_config": {"model_type": "llama", "num_hidden_layers": 0}}',
]


@st.composite
def bad_model_configs(draw: st.DrawFn) -> dict[str, Any] | bytes:
    """A model config.json that must be refused: a dense config with one count out of bounds or of the wrong
    type, 10**7 layers, a mixture of experts with no expert or more experts per token than experts, a
    ``text_config`` that is not an object, or a file that is not a JSON object at all."""
    kind = draw(st.sampled_from(["dense", "layers", "moe", "text_config", "document"]))
    if kind == "dense":
        key = draw(
            st.sampled_from(
                [
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "vocab_size",
                    "max_position_embeddings",
                ]
            )
        )
        return {**TINY_LLAMA, key: draw(BAD_COUNTS_OF_A_MODEL)}
    if kind == "layers":
        base = draw(st.sampled_from([TINY_LLAMA, TINY_MIXTRAL]))
        return {**base, "num_hidden_layers": draw(st.integers(min_value=1025, max_value=10**9))}
    if kind == "moe":
        experts = draw(st.integers(min_value=-3, max_value=8))
        top_k = draw(st.integers(min_value=-2, max_value=12))
        assume(experts < 0 or top_k < 1 or top_k > experts)  # what no mixture of experts can route
        assume(not (experts == 0 and top_k == 0))  # transformers' dense reading of some families
        key = draw(st.sampled_from(["num_local_experts", "num_experts"]))
        model_type = "mixtral" if key == "num_local_experts" else "qwen2_moe"
        return {**TINY_MIXTRAL, "model_type": model_type, key: experts, "num_experts_per_tok": top_k}
    if kind == "text_config":
        value = draw(st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=5), st.integers()))
        return {"model_type": "llava", "text_config": value}
    return draw(st.sampled_from(NOT_MODEL_CONFIGS))


@st.composite
def bad_ds_configs(draw: st.DrawFn) -> dict[str, Any] | list[Any] | bytes:
    """A ds_config.json that DeepSpeed refuses: a bad batch, ZeRO stage or section, or not a JSON object."""
    kind = draw(st.sampled_from(["batch", "zero", "section", "document"]))
    if kind == "batch":
        key = draw(
            st.sampled_from(["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"])
        )
        value = draw(
            st.one_of(
                st.integers(max_value=0),
                st.sampled_from(["x", 1.5, [], {}]),
                st.integers(min_value=2**21, max_value=10**15),
            )
        )
        return {**DS_OK, key: value}
    if kind == "zero":
        stage = draw(
            st.one_of(
                st.integers(max_value=-1), st.integers(min_value=4, max_value=10**6), st.sampled_from(["x", [], 1.5])
            )
        )
        return {**DS_OK, "zero_optimization": {"stage": stage}}
    if kind == "section":
        section = draw(st.sampled_from(["zero_optimization", "bf16", "fp16", "optimizer"]))
        return {**DS_OK, section: draw(st.sampled_from([[], "yes", 3, [1, 2]]))}
    return draw(
        st.sampled_from(
            [b"", b"{", b"[]", b"7", b'"x"', b"[" * 5000, b"\xff", b'{"train_batch_size": ' + b"9" * 300 + b"}"]
        )
    )


@st.composite
def bad_databases(draw: st.DrawFn) -> tuple[str, dict[str, bytes]]:
    """A ``--db`` no command can use, and the files it needs: a URL or path that is refused as written, or a
    file that is not a plan database."""
    kind = draw(st.sampled_from(["query", "mode", "scheme", "not-a-database", "folder", "odd-path"]))
    letters = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=8)
    if kind == "query":
        key = draw(letters.filter(lambda k: k not in ("mode", "uri")))
        return f"@x.db?{key}={draw(letters)}", {}
    if kind == "mode":
        return f"@x.db?mode={draw(letters.filter(lambda m: m not in ('rwc', 'rw', 'ro')))}", {}
    if kind == "scheme":
        scheme = draw(
            letters.filter(lambda s: s not in ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql"))
        )
        return f"{scheme}://user@host/db", {}
    if kind == "not-a-database":
        data = draw(st.binary(min_size=1, max_size=300).filter(lambda b: not b.startswith(b"SQLite format 3")))
        return "@junk.db", {"junk.db": data}
    if kind == "folder":
        return "@sub", {"sub/keep": b""}
    return draw(
        st.sampled_from(
            [
                "",
                " ",
                "~nosuchuser/x.db",
                "x\ny.db",
                "sqlite://host/x.db",
                "y" * 300 + ".db",
                "postgresql://u@h:port/db",
                "sqlite:///x.db?mode=rw&mode=ro",
            ]
        )
    ), {}


# --- the property-based classes --------------------------------------------------------------------------


@fuzz_settings(60)
@given(slot=st.sampled_from(SIZE_SLOTS), value=BAD_SIZES)
def test_sizes(promise: Promise, slot: tuple[str, str], value: str) -> None:
    command, option = slot
    promise.refused(_base(command).with_option(option, value), option)


@fuzz_settings(120)
@given(data=st.data(), slot=st.sampled_from(COUNTS))
def test_whole_numbers(promise: Promise, data: st.DataObject, slot: tuple[str, str, int, int | None]) -> None:
    command, option, lowest, highest = slot
    value = data.draw(_bad_ints(lowest, highest), label="value")
    promise.refused(_base(command).with_option(option, value))


@fuzz_settings(40)
@given(data=st.data(), slot=st.sampled_from(FLOAT_SLOTS))
def test_numbers(promise: Promise, data: st.DataObject, slot: tuple[str, str, float, float, bool]) -> None:
    command, option, lowest, highest, low_open = slot
    value = data.draw(_bad_floats(lowest, highest, low_open=low_open), label="value")
    promise.refused(_base(command).with_option(option, value))


@fuzz_settings(80)
@given(command=st.sampled_from(JOB_COMMANDS), config=bad_model_configs())
def test_model_configs(promise: Promise, command: str, config: dict[str, Any] | bytes) -> None:
    case = _base(command).with_option("--model", "@model/config.json")
    case.files["model/config.json"] = config
    promise.refused(case)


@fuzz_settings(15)
@given(role=st.sampled_from(["--ref-model", "--critic-model", "--reward-model"]), config=bad_model_configs())
def test_model_configs_of_the_other_rlhf_models(promise: Promise, role: str, config: dict[str, Any] | bytes) -> None:
    case = _base("recommend").with_option("--workload", "ppo").with_option(role, "@other/config.json")
    case.files["other/config.json"] = config
    promise.refused(case)


@fuzz_settings(40)
@given(config=bad_ds_configs())
def test_deepspeed_configs(promise: Promise, config: dict[str, Any] | list[Any] | bytes) -> None:
    case = _base("check")
    case.files["ds.json"] = config
    promise.refused(case, "ds_config")


@fuzz_settings(80)
@given(command=st.sampled_from(DB_COMMANDS), target=bad_databases())
def test_databases(promise: Promise, command: str, target: tuple[str, dict[str, bytes]]) -> None:
    db, files = target
    case = _base(command).with_option("--db", db)
    case.files.update(files)
    if command in ("explain", "export"):
        case.positionals = ["0123456789ab"]  # explain reads a database only for a plan
    promise.refused(case, "database")


IDS = st.text(min_size=1, max_size=40).filter(lambda t: t.strip() and not t.startswith("-"))


def _device_words() -> set[str]:
    """The names a stored H100 probe's device answers to (``--device-fingerprint`` matches them)."""
    fingerprint = next(p["result"]["fingerprint"] for p in H100_PROBES if p["result"].get("fingerprint"))
    return {"cuda", "h100-80g", *str(fingerprint.get("name", "")).lower().split()}


@fuzz_settings(40)
@given(command=st.sampled_from(["export", "explain", "probes", "calibration", "device"]), given_id=IDS)
def test_ids(promise: Promise, command: str, given_id: str) -> None:
    if command == "device":
        assume(given_id.strip().lower() not in _device_words())
        case = _base("calibrate").with_option("--device-fingerprint", given_id)
    elif command == "probes":
        case = _base("probes").with_option("--snapshot", given_id)
    elif command == "calibration":
        assume(given_id.strip().lower() not in ("auto", "none"))
        case = _base("recommend").with_option("--db", "@plans.db").with_option("--calibration", given_id)
        case.copy_plans = True
    else:
        with sqlite3.connect(promise.plans_db) as conn:
            saved = conn.execute("SELECT plan_id FROM plans").fetchone()[0]
        assume(not saved.startswith(given_id.strip().lower()))
        case = _base(command)
        case.positionals = [given_id]
    promise.refused(case)


@fuzz_settings(20)
@given(fmt=st.text(max_size=12).filter(lambda f: f.strip().lower() not in FORMATS))
def test_export_formats(promise: Promise, fmt: str) -> None:
    promise.refused(_base("export").with_option("--format", fmt), "--format")


@fuzz_settings(10)
@given(
    suffix=st.text(alphabet=string.ascii_letters + string.digits, max_size=5).filter(
        lambda s: s.lower() not in ("html", "svg", "png")
    )
)
def test_plot_formats(promise: Promise, suffix: str) -> None:
    case = _base("explain").with_option("--plot", f"@memory.{suffix}")
    with sqlite3.connect(promise.plans_db) as conn:
        case.positionals = [conn.execute("SELECT plan_id FROM plans").fetchone()[0]]
    promise.refused(case, "--plot")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
NOT_OBJECTS = JSON_VALUES.filter(lambda v: not isinstance(v, dict)).map(json.dumps)


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


ROW_COMMANDS = {
    "export": (["export"], {}),
    "explain": (["explain", "@id"], {}),
    "plot": (["explain", "@id"], {"--plot": "@m.html"}),
    "plans": (["plans"], {}),
}


@fuzz_settings(40)
@given(
    command=st.sampled_from(sorted(ROW_COMMANDS)),
    column=st.sampled_from(["document", "workload", "hardware", "strategy", "predicted", "ds_config"]),
    text=NOT_OBJECTS | st.text(min_size=1, max_size=12).filter(_not_json),
    block=st.none() | st.sampled_from(["workload", "hardware", "strategy", "outside_settings"]),
)
def test_damaged_plan_rows(promise: Promise, command: str, column: str, text: str, block: str | None) -> None:
    """A saved plan changed by hand: a JSON column that is no object or no JSON at all, or (for the commands
    that read a plan's document) a document whose blocks are not objects."""
    with sqlite3.connect(promise.plans_db) as conn:
        saved, document = conn.execute("SELECT plan_id, document FROM plans").fetchone()
    if block is not None and column == "document" and command != "plans" and text != "null" and not _not_json(text):
        text = json.dumps({**json.loads(document), block: json.loads(text)})
    words, options = ROW_COMMANDS[command]
    with tempfile.TemporaryDirectory() as name:
        damaged = Path(name) / "plans.db"
        shutil.copy(promise.plans_db, damaged)
        with sqlite3.connect(damaged) as conn:
            conn.execute(f"UPDATE plans SET {column} = ?", (text,))
        data = damaged.read_bytes()
    case = Case(words[0], {"--db": "@plans.db", **options}, [saved if w == "@id" else w for w in words[1:]])
    case.files["plans.db"] = data
    promise.refused(case, "damaged")


# --- lists: combinations, files and the cases of the hardening reviews ----------------------------------


def _case(command: str, **changes: Any) -> Case:
    """A base case with options changed (``options``: {name: value}; ``drop``: names) and files added."""
    case = _base(command)
    for name, value in changes.get("options", {}).items():
        case = case.with_option(name, value)
    for name in changes.get("drop", ()):
        case.options.pop(name, None)
    case.files.update(changes.get("files", {}))
    case.positionals = changes.get("positionals", case.positionals)
    case.fifo = changes.get("fifo")
    if case.fifo:
        case.files.pop(case.fifo, None)
    return case


RLHF = {"--workload": "ppo"}
LISTED: list[tuple[str, Case, str]] = [
    # combinations of options that contradict each other
    ("rlhf-with-seq-len", _case("recommend", options={**RLHF, "--seq-len": "256"}), "--prompt-len"),
    ("prompt-without-gen", _case("recommend", options={"--prompt-len": "128"}), "--gen-len"),
    ("critic-without-rlhf", _case("predict", options={"--critic-model": "opt-125m"}), "--critic-model"),
    ("remax-with-critic", _case("recommend", options={"--workload": "remax", "--critic-model": "opt-125m"}), "critic"),
    ("samples-without-grpo", _case("recommend", options={**RLHF, "--samples-per-prompt": "4"}), "grpo"),
    ("batch-over-gpus", _case("recommend", options={"--batch": "7", "--gpus": "2"}), "--batch 7"),
    ("tune-on-two-nodes", _case("tune", options={"--nodes": "2"}), ""),
    ("probe-more-ranks-than-cpu", _case("probe", options={"--gpus": "64", "--batch": "64"}), "--gpus"),
    ("neither-gpu-nor-gpu-mem", _case("recommend", drop=("--gpu-mem",)), "--gpu"),
    (
        "nvme-offload-without-path",
        _case("predict", options={"--zero": "3", "--offload-optimizer": "nvme"}),
        "--nvme-path",
    ),
    ("dtype-contradicts-config", _case("check", options={"--dtype": "fp16"}), "--dtype"),
    ("explain-db-without-plan", _case("explain"), "--db"),
    ("export-over-a-file", _case("export", files={"out.json": b"mine"}), "exists"),
    ("export-into-a-folder", _case("export", options={"-o": "@sub"}, files={"sub/keep": b""}), "folder"),
    ("export-into-a-missing-folder", _case("export", options={"-o": "@missing/ds.json"}), "missing"),
    ("plot-into-a-missing-folder", _case("explain", options={"--plot": "@missing/m.html"}, positionals=["@id"]), ""),
    ("unknown-gpu", _case("recommend", options={"--gpu": "H900"}), "H900"),
    ("unknown-node", _case("recommend", options={"--node": "dgx-h900"}), "dgx-h900"),
    ("node-without-network", _case("predict", options={"--node": "workstation-4090", "--nodes": "2"}), "--inter"),
    ("node-with-more-gpus", _case("check", options={"--node": "dgx-h100", "--gpus": "9"}), "--gpus 9"),
    ("unknown-workload", _case("recommend", options={"--workload": "pretrain"}), "pretrain"),
    ("unknown-device", _case("probe", options={"--device": "tpu"}), "--device"),
    ("tune-unknown-device", _case("tune", options={"--device": "tpu"}), "--device"),
    ("tune-study-empty", _case("tune", options={"--study": " "}), "--study"),
    ("tune-study-long", _case("tune", options={"--study": "s" * 600}), "--study"),
    ("tune-study-control", _case("tune", options={"--study": "a\x01b"}), "--study"),
    # issue 29 item 5: tune checks what probe checks, before anything runs
    *((f"tune-timeout-{t}", _case("tune", options={"--timeout": t}), "--timeout") for t in ("0", "-1", "nan", "inf")),
    ("tune-steps-10^12", _case("tune", options={"--steps": str(10**12)}), "--steps"),
    *((f"probe-timeout-{t}", _case("probe", options={"--timeout": t}), "--timeout") for t in ("0", "-1", "nan", "inf")),
    # issue 29 item 3: an explicit calibration is never ignored, and reading a missing database creates none
    *(
        (f"{c}-calibration-id-no-db", _case(c, options={"--calibration": "abcd1234", "--db": "@new.db"}), "abcd1234")
        for c in ("recommend", "predict", "check")
    ),
    ("tune-calibration-id-no-db", _case("tune", options={"--calibration": "abcd1234"}), "abcd1234"),
    ("export-mistyped-db", _case("export", options={"--db": "@typo.db"}), "no plans"),
    ("explain-mistyped-db", _case("explain", options={"--db": "@typo.db"}, positionals=["0123abcd"]), "0123abcd"),
    ("snapshot-mistyped-db", _case("probes", options={"--db": "@typo.db", "--snapshot": "0123abcd"}), "0123abcd"),
    ("calibrate-nothing-stored", _case("calibrate", options={"--db": "@typo.db"}, drop=("--records",)), "probe"),
    # issue 29 item 4: records files of every wrong kind
    ("records-missing", _case("calibrate", options={"--records": "@nope.json"}), "does not exist"),
    ("records-not-json", _case("calibrate", options={"--records": "@r.json"}, files={"r.json": b"not json"}), "JSON"),
    ("records-deep", _case("calibrate", options={"--records": "@r.json"}, files={"r.json": b"[" * 100_000}), "nested"),
    ("records-shape", _case("calibrate", options={"--records": "@r.json"}, files={"r.json": {"a": 1}}), "records"),
    (
        "records-probes-ints",
        _case("calibrate", options={"--records": "@r.json"}, files={"r.json": {"probes": [1]}}),
        "probes",
    ),
    (
        "records-sft-dict",
        _case("calibrate", options={"--records": "@r.json"}, files={"r.json": {"sft": {"a": 1}}}),
        "sft",
    ),
    ("records-fifo", _case("calibrate", options={"--records": "@r.json"}, fifo="r.json"), "regular"),
    # issue 29 items 4 and 7: model configs transformers cannot read, and mixtures of experts that cannot route
    *(
        (f"model-{name}", _case("recommend", options={"--model": "@m.json"}, files={"m.json": config}), fragment)
        for name, config, fragment in [
            ("text-config-list", {"model_type": "llava", "text_config": []}, "text_config"),
            ("field-of-wrong-type", {**TINY_MIXTRAL, "model_type": "qwen3", "hidden_size": "64"}, "hidden_size"),
            ("10^7-layers", {**TINY_MIXTRAL, "num_hidden_layers": 10**7}, "num_hidden_layers"),
            ("0-experts", {**TINY_MIXTRAL, "num_local_experts": 0}, "num_local_experts"),
            ("more-per-token-than-experts", {**TINY_MIXTRAL, "num_experts_per_tok": 8}, "num_experts_per_tok"),
            (
                "default-per-token-over-experts",
                {**TINY_MIXTRAL, "num_local_experts": 1, "num_experts_per_tok": None},
                "num_experts_per_tok",
            ),
        ]
    ),
    # issue 29 item 7: files that are not regular files are refused without waiting on them
    ("check-fifo", _case("check", positionals=["@ds.json"], fifo="ds.json", files={}), "regular"),
    ("check-dev-zero", _case("check", positionals=["/dev/zero"]), "regular"),
    ("check-folder", _case("check", positionals=["@sub"], files={"sub/keep": b""}), "folder"),
    ("strategy-fifo", _case("predict", options={"--strategy": "@s.json"}, fifo="s.json"), "regular"),
    ("probe-strategies-fifo", _case("probe", options={"--strategies": "@s.json"}, fifo="s.json"), "regular"),
]


@pytest.mark.parametrize(("name", "case", "fragment"), LISTED, ids=[c[0] for c in LISTED])
def test_listed(promise: Promise, name: str, case: Case, fragment: str) -> None:
    if "@id" in case.positionals:
        with sqlite3.connect(promise.plans_db) as conn:
            case.positionals = [conn.execute("SELECT plan_id FROM plans").fetchone()[0]]
    promise.refused(case, fragment)


# --- real processes --------------------------------------------------------------------------------------

PROCESS_CASES: list[tuple[str, list[str], dict[str, bytes], str]] = [
    ("tune-timeout-nan", ["tune", *JOB, "--device", "cpu", "--timeout", "nan", "--db", "@p.db"], {}, "--timeout"),
    (
        "ppo-lora-rank-10^12",  # an RLHF search that failed one Optuna trial per rank logged its traceback
        [
            "recommend",
            "--model",
            "opt-125m",
            "--gpu-mem",
            "24G",
            "--workload",
            "ppo",
            "--lora-rank",
            str(10**12),
            "--db",
            "@p.db",
        ],
        {},
        "--lora-rank",
    ),
    (
        "moe-without-experts",
        ["probe", "--model", "@m.json", "--gpu-mem", "24G", "--device", "cpu", "--workload", "sft", "--db", "@p.db"],
        {"m.json": json.dumps({**TINY_MIXTRAL, "num_local_experts": 0}).encode()},
        "expert",
    ),
]


@pytest.mark.parametrize(("name", "argv", "files", "fragment"), PROCESS_CASES, ids=[c[0] for c in PROCESS_CASES])
def test_real_processes(tmp_path: Path, name: str, argv: list[str], files: dict[str, bytes], fragment: str) -> None:
    """As a user runs it: one line on stderr (libraries' logging included), exit 2, nothing written, no child."""
    for file, data in files.items():
        (tmp_path / file).write_bytes(data)
    env = subprocess_env({"PLANNER_DB": str(tmp_path / "default.db"), "XDG_DATA_HOME": str(tmp_path / "xdg")})
    before = _tree(tmp_path)
    args = [str(tmp_path / a[1:]) if a.startswith("@") else a for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "planner", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WALL_ALARM_S,
        check=False,
        start_new_session=True,
    )
    TOTALS["tried"] += 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("planner: error: "), proc.stderr[-3000:]
    assert fragment in lines[0] and "Traceback" not in proc.stderr and not proc.stdout.strip()
    assert _tree(tmp_path) == before
    TOTALS["refused as promised"] += 1

"""``planner --verbose`` (issue 43: one line is one line, long causes are cut, with the rest in ``--verbose``).

Without the flag a refusal is one ``planner: error:`` line that says when it was cut, and an error memplan did
not expect is one ``planner: internal error:`` line; with it, the whole line, the whole cause and the traceback
are printed. The exit codes are the same either way: 2 for bad input, 1 for an internal error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest
from planner_helpers import CliResult, assert_one_error_line

Cli = Callable[..., CliResult]
REST = "[--verbose prints the rest]"


def _unknown_model_type(tmp_path: Path) -> list[Any]:
    """A recommend whose refusal repeats transformers' message: every model type it knows (kilobytes)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "nosuch", "hidden_size": 64}))
    return ["recommend", "--model", config, "--gpu-mem", "24G", "--db", tmp_path / "plans.db"]


def _known_model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return list(CONFIG_MAPPING_NAMES)


def test_a_long_cause_is_one_cut_line_and_whole_with_verbose(cli: Cli, tmp_path: Path) -> None:
    args = _unknown_model_type(tmp_path)
    known = _known_model_types()
    short = cli(*args)
    line = assert_one_error_line(short, "model_type 'nosuch' is unknown to transformers")
    assert line.endswith(REST)  # it says that it was cut, and how to see the rest
    assert len(line) < len(", ".join(known)) / 4  # far shorter than the list transformers gives
    assert [name for name in known if name not in line]  # the list is cut
    for verbose in (["--verbose", *args], [*args, "--verbose"]):  # before or after the subcommand
        whole = cli(*verbose)
        assert whole.rc == 2 and not whole.out and "Traceback" not in whole.err
        assert whole.err.startswith("planner: error: ") and REST not in whole.err
        assert not [name for name in known if name not in whole.err]  # every model type transformers named
    assert not (tmp_path / "plans.db").exists()  # refused either way: nothing written


def _failing_recommend(exc: BaseException) -> Callable[..., NoReturn]:
    def recommend(*args: Any, **kwargs: Any) -> NoReturn:
        raise exc

    return recommend


def test_a_cause_cut_at_its_source_is_whole_with_verbose(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """An InputError that repeats the first line of a library's message keeps the whole as its detail."""
    import planner.api
    from store.errors import InputError

    cause = "first line of the library's message\n" + "\n".join(f"class {i} it also knows" for i in range(40))
    monkeypatch.setattr(
        planner.api, "recommend", _failing_recommend(InputError("m: refused (first line...)", detail=cause))
    )
    short = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G")
    line = assert_one_error_line(short, "m: refused (first line...)")
    assert line.endswith(REST) and "class 39" not in short.err
    whole = cli("recommend", "--model", "opt-125m", "--gpu-mem", "24G", "--verbose")
    assert whole.rc == 2 and "class 0 it also knows" in whole.err and "class 39 it also knows" in whole.err


def test_an_internal_error_is_one_line_and_its_traceback_with_verbose(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import planner.api

    monkeypatch.setattr(planner.api, "recommend", _failing_recommend(RuntimeError("unexpected state\nsecond line")))
    args = ("recommend", "--model", "opt-125m", "--gpu-mem", "24G")
    short = cli(*args)
    assert short.rc == 1 and not short.out  # the exit code of an uncaught exception, as before
    lines = short.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in short.err
    assert lines[0].startswith("planner: internal error: RuntimeError: unexpected state")
    assert "--verbose" in lines[0] and "second line" not in lines[0]
    whole = cli("--verbose", *args)
    assert whole.rc == 1
    assert "Traceback (most recent call last)" in whole.err and "in recommend" in whole.err  # where it was raised
    assert whole.err.splitlines()[-1].startswith("planner: internal error: RuntimeError: unexpected state")


def test_verbose_is_never_taken_from_the_users_command_or_an_options_value() -> None:
    from planner.cli import app
    from planner.cli.argv_check import take_verbose

    program = ["probe", "--model", "opt-125m", "--", "python", "train.py", "--verbose"]
    assert take_verbose(app, program) == (False, program)  # the program's own flag
    study = ["tune", "--study", "--verbose", "--model", "opt-125m"]
    assert take_verbose(app, study) == (False, study)  # a study named --verbose
    assert take_verbose(app, ["--verbose", *study]) == (True, study)
    assert take_verbose(app, [*program[:3], "--verbose", *program[3:]]) == (True, program)


def test_help_names_verbose_and_a_bad_whole_number_is_still_refused_with_it(cli: Cli) -> None:
    assert "--verbose" in cli("--help").out
    refused = cli("--verbose", "recommend", "--model", "opt-125m", "--gpu-mem", "24G", "--batch", "2.0")
    assert_one_error_line(refused, "--batch must be a whole number")

"""The ``planner`` command line: a thin loop over ``planner.api`` (one module per subcommand).

Bad input of any kind prints one line on stderr and exits with code 2 (a long line cut; the global ``--verbose``
prints it whole, and an internal error's traceback: :mod:`planner.cli.failing`). Each command imports the API
inside its function, on purpose: ``planner --help`` and a mistyped option load typer and nothing else of memplan's.
"""

from __future__ import annotations

import gc
import sys
from typing import Annotated, Any

import typer

from planner.cli import calibrate as calibrate_cmd
from planner.cli import check as check_cmd
from planner.cli import explain as explain_cmd
from planner.cli import export as export_cmd
from planner.cli import gpus as gpus_cmd
from planner.cli import plans as plans_cmd
from planner.cli import predict as predict_cmd
from planner.cli import probe as probe_cmd
from planner.cli import probes as probes_cmd
from planner.cli import recommend as recommend_cmd
from planner.cli import tune as tune_cmd
from planner.cli.argv_check import argv_error, click_command, take_verbose
from planner.cli.collector import collector_paused
from planner.cli.failing import internal_error, refuse
from planner.cli.stopping import stop_on_signals
from planner.job.inputs import shapes_saved_on_success
from store.errors import InputError

click_errors: Any
try:  # typer >= 0.25 vendors click as typer._click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_errors

app = typer.Typer(
    name="planner",
    help="memplan: pick the GPU memory strategy (ZeRO, offload, checkpointing, LoRA, micro-batch, "
    "empty_cache) that fits at the least time, and export it as a DeepSpeed config.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("recommend")(recommend_cmd.recommend_command)
app.command("predict")(predict_cmd.predict_command)
app.command("check")(check_cmd.check_command)
app.command("export")(export_cmd.export_command)
app.command("plans")(plans_cmd.plans_command)
app.command("probe")(probe_cmd.probe_command)
app.command("probes")(probes_cmd.probes_command)
app.command("explain")(explain_cmd.explain_command)
app.command("calibrate")(calibrate_cmd.calibrate_command)
app.command("calibrations")(calibrate_cmd.calibrations_command)
app.command("tune")(tune_cmd.tune_command)
app.command("gpus")(gpus_cmd.gpus_command)


@app.callback()
def _global_options(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Before or after the command: print a cut error line whole (with the whole cause it repeats) "
            "and an internal error's traceback.",
        ),
    ] = False,
) -> None:
    """Options of every command (``--verbose`` is read by :func:`main`, before typer)."""


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 'does not fit' for check or an internal error, 2 bad input)."""
    verbose, args = take_verbose(app, [str(a) for a in (sys.argv[1:] if argv is None else argv)])
    with collector_paused(args):  # planner.cli.collector: a quarter of recommend's CPU seconds went to it
        return _command(verbose, args)


def _command(verbose: bool, args: list[str]) -> int:
    """Run the command in ``args`` (the words after ``planner``, ``--verbose`` taken out): :func:`main`."""
    refused = argv_error(app, args)
    if refused is not None:  # what typer would let through: 2.0 for a whole number, a bare -- before nothing
        return refuse(refused, verbose=verbose)
    try:
        with shapes_saved_on_success():  # a refused command writes no traced model shape
            result = click_command(app)(args=args, standalone_mode=False, prog_name="planner")
    except InputError as exc:
        return refuse(str(exc), detail=exc.detail, verbose=verbose)
    except click_errors.NoArgsIsHelpError:
        return 0  # typer has printed the help already
    except click_errors.ClickException as exc:  # a usage error among them
        return refuse(exc.format_message(), verbose=verbose)
    except (typer.Exit, getattr(click_errors, "Exit", typer.Exit)) as exc:
        return int(getattr(exc, "exit_code", getattr(exc, "code", 0)) or 0)
    except (typer.Abort, KeyboardInterrupt):
        return refuse("aborted", verbose=verbose)
    except Exception as exc:  # noqa: BLE001 - a bug: one line, its traceback with --verbose
        return internal_error(exc, verbose=verbose)
    return result if isinstance(result, int) else 0


def run() -> None:
    """Console-script entry point (and ``python -m planner``)."""
    code = 2
    with stop_on_signals() as stop:  # SIGTERM, SIGHUP: stop as on Ctrl-C, exit 128 + signum (planner.cli.stopping)
        code = main()
    code = stop.finish(code)
    # The process ends here. Without freezing, the interpreter's final full collection walks and frees every
    # object of the ~800 modules a command imports (SQLAlchemy, pydantic, optuna, ...): about a quarter of the
    # time of `planner recommend` (benchmarks/latency.py). Open files and the database are closed by now.
    gc.freeze()
    sys.exit(code)

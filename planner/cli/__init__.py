"""The ``planner`` command line: a thin loop over ``planner.api`` (one module per subcommand).

Bad input of any kind prints one line on stderr and exits with code 2.
"""

from __future__ import annotations

import sys

import click
import typer

from planner.cli import check as check_cmd
from planner.cli import explain as explain_cmd
from planner.cli import export as export_cmd
from planner.cli import plans as plans_cmd
from planner.cli import predict as predict_cmd
from planner.cli import recommend as recommend_cmd
from store.errors import InputError

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
app.command("explain")(explain_cmd.explain_command)


def _fail(message: str) -> int:
    print(f"planner: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 'does not fit' for check, 2 bad input)."""
    try:
        result = app(args=argv, standalone_mode=False, prog_name="planner")
    except InputError as exc:
        return _fail(str(exc))
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.ctx.command.get_help(exc.ctx) if exc.ctx else None
        print(exc.ctx.get_help() if exc.ctx else "", file=sys.stdout)
        return 0
    except click.UsageError as exc:
        return _fail(exc.format_message().replace("\n", " "))
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        return _fail("aborted")
    except click.ClickException as exc:
        return _fail(exc.format_message())
    return result if isinstance(result, int) else 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())

"""How the ``planner`` command says that it failed: one line on stderr, and the whole with ``--verbose``.

Bad input is one ``planner: error:`` line (exit code 2). A line longer than :data:`LINE_CHARS` is cut (a
library's message can be kilobytes: transformers lists every model type it knows after an unknown one), and it
says so; ``planner --verbose`` prints it whole, with the whole cause the line repeats cut (``InputError.detail``).
An error memplan did not expect (a bug) is one ``planner: internal error:`` line with exit code 1, as an
uncaught exception's; ``--verbose`` prints its traceback before it.
"""

from __future__ import annotations

import sys
import traceback

LINE_CHARS = 400  # the longest refusal memplan words itself is about 330 characters (a database name's)
CAUSE_CHARS = 200  # an unexpected error's message, as its line repeats it
REST = " [--verbose prints the rest]"


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """(``text`` on one line, at most ``limit`` characters, whether something was cut)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat, False
    return flat[: limit - 3] + "...", True


def refuse(message: str, *, detail: str | None = None, verbose: bool = False) -> int:
    """Print the refusal of bad input on stderr; its exit code, 2. ``detail``: the whole cause that ``message``
    repeats cut (printed with ``verbose``)."""
    if verbose:
        print(f"planner: error: {' '.join(message.split())}", file=sys.stderr)
        if detail and detail.strip():
            print(f"planner: the whole cause: {detail.strip()}", file=sys.stderr)
        return 2
    line, cut = _cut(message, LINE_CHARS - len(REST))
    print(f"planner: error: {line}{REST if cut or detail else ''}", file=sys.stderr)
    return 2


def internal_error(exc: BaseException, *, verbose: bool = False) -> int:
    """Print an unexpected error (a bug in memplan) on stderr, with its traceback when ``verbose``; exit code 1."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    lines = str(exc).strip().splitlines()
    cause, _ = _cut(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__, CAUSE_CHARS)
    hint = "" if verbose else "; planner --verbose prints its traceback"
    print(f"planner: internal error: {cause} (a bug in memplan{hint})", file=sys.stderr)
    return 1

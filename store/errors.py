"""The one exception type that means "the user gave bad input"."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user: the CLI prints its message on one line and exits with code 2.

    The message is complete on its own (what was wrong, and what would be right); it never needs a
    traceback to be understood.
    """

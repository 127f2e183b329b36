"""The one exception type that means "the user gave bad input"."""

from __future__ import annotations

from collections.abc import Iterable


class InputError(ValueError):
    """Bad input from the user: the CLI prints its message on one line and exits with code 2.

    The message is complete on its own (what was wrong, and what would be right); it never needs a
    traceback to be understood. ``detail`` is the whole of a cause the message shows cut (a library's error of
    many lines, of which the message repeats the first): ``planner --verbose`` prints it below the line.
    """

    def __init__(self, message: object = "", *, detail: str | None = None) -> None:
        # One line whatever the user typed: control characters of quoted input are shown escaped.
        text = str(message)
        for char, shown in (("\r", "\\r"), ("\n", "\\n"), ("\t", " ")):
            text = text.replace(char, shown)
        super().__init__(text)
        self.detail = detail


def refuse_unknown_keys(data: Iterable[str], known: Iterable[str], where: str) -> None:
    """An InputError naming the keys of ``data`` that are not ``known`` (and listing those that are)."""
    names = set(known)
    unknown = sorted(set(data) - names)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")

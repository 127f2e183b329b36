"""The tokenizer of ``PYTORCH_CUDA_ALLOC_CONF`` strings (``ConfigTokenizer`` of ``c10/core/AllocatorConfig.h``).

Keys, values and the characters ``, : [ ]`` are tokens; whitespace is dropped. Every failed check raises a
ValueError naming the string and the problem.
"""

from __future__ import annotations


def _tokenize(text: str) -> list[str]:
    """Split on ``, : [ ]`` (kept as tokens), dropping whitespace (``ConfigTokenizer``)."""
    tokens: list[str] = []
    buffer = ""
    for ch in text:
        if ch in ",:[]":
            if buffer:
                tokens.append(buffer)
                buffer = ""
            tokens.append(ch)
        elif not ch.isspace():
            buffer += ch
    if buffer:
        tokens.append(buffer)
    return tokens


class Tokens:
    """The token list with the checks of ``ConfigTokenizer`` (each failure a ValueError)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.items = _tokenize(text)

    def fail(self, message: str) -> ValueError:
        """The error to raise for ``message``, naming the whole string."""
        return ValueError(f"bad PYTORCH_CUDA_ALLOC_CONF {self.text!r}: {message}")

    def at(self, i: int, what: str) -> str:
        """Token ``i``; ``what`` names the missing token when the string ends before it."""
        if i >= len(self.items):
            raise self.fail(f"expected {what} at the end")
        return self.items[i]

    def expect(self, i: int, token: str) -> None:
        """Token ``i`` must be ``token`` (``ConfigTokenizer::checkToken``)."""
        found = self.at(i, repr(token))
        if found != token:
            raise self.fail(f"expected {token!r}, got {found!r}")

    def number(self, i: int, key: str) -> int:
        """Token ``i`` as a non-negative integer (``toSizeT``, without ``stoull``'s leniency)."""
        token = self.at(i, f"a value for {key}")
        if not token.isdigit():
            raise self.fail(f"{key} needs a non-negative integer, got {token!r}")
        return int(token)

    def real(self, i: int, key: str) -> float:
        """Token ``i`` as a float (``toDouble``)."""
        token = self.at(i, f"a value for {key}")
        try:
            return float(token)
        except ValueError:
            raise self.fail(f"{key} needs a number, got {token!r}") from None

    def boolean(self, i: int, key: str) -> bool:
        """Token ``i`` as exactly ``True`` or ``False`` (``toBool``)."""
        token = self.at(i, f"a value for {key}")
        if token not in ("True", "False"):
            raise self.fail(f"{key} needs True or False, got {token!r}")
        return token == "True"

    def skip_value(self, i: int, key: str) -> int:
        """Index of the last token of ``key``'s value, a list included (``ConfigTokenizer::skipKey``)."""
        self.expect(i + 1, ":")
        i += 2
        if self.at(i, f"a value for {key}") != "[":
            return i
        while i + 1 < len(self.items) and self.items[i + 1] != "]":
            i += 1
        self.expect(i + 1, "]")
        return i + 1

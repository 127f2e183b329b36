"""JSON documents as users give them (configs, strategies, ds_configs): parsed with bounds, errors in one line.

A file is read only when it is a regular file of at most MAX_DOCUMENT_BYTES: a FIFO, a terminal or a device
(``/dev/zero``) named where a document is expected would block the reader or never end.

Python's parser recurses once per nesting level and converts integers of any length, so a document nested
thousands deep or holding a 5000-digit number raises RecursionError or ValueError deep inside it. Real
documents (HF configs, DeepSpeed configs, strategies) nest a few levels and hold numbers below 2**63.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from store.errors import InputError

__all__ = ["MAX_DEPTH", "MAX_DOCUMENT_BYTES", "MAX_INT_DIGITS", "check_document", "parse_json", "read_document"]

MAX_DEPTH = 32  # nesting levels: an HF config or a DeepSpeed config uses fewer than 6
MAX_INT_DIGITS = 19  # 2**63 has 19 digits
MAX_DOCUMENT_BYTES = 64 * 2**20  # a config, strategy or records file is kilobytes; a larger file is not one


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise InputError(f"the number {shown} has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
    return deepest


def check_document(value: Any, what: str) -> Any:
    """``value`` when it nests at most MAX_DEPTH levels (a document handed over as Python objects)."""
    if _depth(value) > MAX_DEPTH:
        raise InputError(f"{what}: nested more than {MAX_DEPTH} levels deep; no document needs that")
    return value


def parse_json(text: str, what: str) -> Any:
    """The JSON value in ``text``; InputError (one line, naming ``what``) when it is not valid or not bounded."""
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InputError(
            f"{what}: nested more than {MAX_DEPTH} levels deep; no config or strategy needs that"
        ) from None
    return check_document(value, what)


def read_document(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON value in the file ``path``; InputError (one line starting ``what: path``, or just the path
    when ``what`` is empty) when it is missing, not a regular file (a FIFO or a device is refused without
    waiting on it), larger than MAX_DOCUMENT_BYTES, not UTF-8 or not valid and bounded JSON (``parse_json``)."""
    p = Path(path)
    where = f"{what}: {p}" if what else str(p)
    try:  # O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InputError(f"{where}: does not exist") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{where}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(f"{where}: is a folder, not a JSON file")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{where}: not a regular file (a pipe or a device); give a JSON file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_DOCUMENT_BYTES:  # a file that grows while read stops one byte past the bound
            chunk = os.read(fd, MAX_DOCUMENT_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if size > MAX_DOCUMENT_BYTES:
        raise InputError(f"{where}: larger than {MAX_DOCUMENT_BYTES} bytes; a JSON document here is far smaller")
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_json(text, where)

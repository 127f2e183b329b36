"""JSON documents as users give them (configs, strategies, ds_configs): parsed with bounds, errors in one line.

Python's parser recurses once per nesting level and converts integers of any length, so a document nested
thousands deep or holding a 5000-digit number raises RecursionError or ValueError deep inside it. Real
documents (HF configs, DeepSpeed configs, strategies) nest a few levels and hold numbers below 2**63.
"""

from __future__ import annotations

import json
from typing import Any

from store.errors import InputError

__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "check_document", "parse_json"]

MAX_DEPTH = 32  # nesting levels: an HF config or a DeepSpeed config uses fewer than 6
MAX_INT_DIGITS = 19  # 2**63 has 19 digits


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

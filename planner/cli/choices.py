"""The closed sets the CLI offers, read from ``store.choices``: each option's metavar and help list its enum.

The store refuses a value outside the set with one line (``store.records``, ``store.rollout``, ...); the CLI
shows the same set in ``--help`` (``--offload-optimizer [none|cpu|nvme]``), so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["AUTO", "choices_metavar", "choices_text"]

AUTO = "auto"  # a few options also take "auto": the planner chooses


def choices_metavar(choices: Iterable[str]) -> str:
    """``[a|b|c]``: the metavar that shows an option's choices in ``--help``."""
    return "[" + "|".join(str(choice) for choice in choices) + "]"


def choices_text(choices: Iterable[str]) -> str:
    """``a, b or c``: the choices in words, for an option's help."""
    names = [str(choice) for choice in choices]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

"""One line saying what a plan's spread of peak reserved rests on (``predicted.reserved_spread_basis``)."""

from __future__ import annotations

from typing import Any

_MECHANISMS = {
    "zero_stage": "ZeRO stage",
    "offload": "offload",
    "checkpointing": "checkpointing",
    "large_vocab": "vocabulary size",
    "rlhf": "RLHF phases",
}


def kind_words(kind: dict[str, Any]) -> str:
    """A plan's mechanisms in words: ``ZeRO-2, no offload, checkpointing, vocabulary < 100k, SFT``."""
    offload = kind.get("offload", "none")
    return ", ".join(
        (
            f"ZeRO-{kind.get('zero_stage')}",
            "no offload" if offload == "none" else f"{offload} offload",
            "checkpointing" if kind.get("checkpointing") else "no checkpointing",
            "vocabulary >= 100k" if kind.get("large_vocab") else "vocabulary < 100k",
            "RLHF" if kind.get("rlhf") else "single model",
        )
    )


def spread_basis_line(basis: dict[str, Any]) -> str:
    """Which measured records the spread rests on, how many, their worst under-prediction and the margin; or that
    no record is near (the widest kept), or that none is shipped (the fixed spread)."""
    if not basis:
        return "the spread is the fixed one (plan saved before spreads came from measured records)"
    factor = basis.get("program_factor") or 1.0
    extra = f", x {factor:.3f} for your program" if factor != 1.0 else ""
    margin = f"{100 * basis.get('margin', 0.0):.0f}% margin"
    under = f"{100 * basis.get('under_predicted', 0.0):.1f}%"
    kind = kind_words(basis.get("kind", {}))
    if basis.get("distance") is None:
        return f"spread: the fixed one{extra}; no measured records are shipped"
    if not basis.get("near"):
        return (
            f"spread: no measured record is near this plan ({kind}; the nearest differ in {basis['distance']} "
            f"mechanisms): the widest under-prediction of all records, {under} ({basis.get('worst_record')}), "
            f"+ {margin}{extra}"
        )
    count = basis.get("count", 0)
    which = (
        "of its kind"
        if not basis.get("differs_in")
        else ("nearest, differing in " + ", ".join(_MECHANISMS.get(n, n) for n in basis["differs_in"]))
    )
    shown = ", ".join(basis.get("records", [])[:4]) + (", ..." if count > 4 else "")
    return (
        f"spread rests on {count} measured record{'s' if count != 1 else ''} {which} ({kind}): worst "
        f"under-prediction {under} ({basis.get('worst_record')}) + {margin}{extra}; {shown}"
    )

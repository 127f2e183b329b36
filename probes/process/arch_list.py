"""``TORCH_CUDA_ARCH_LIST`` as DeepSpeed's JIT op builder can read it.

PyTorch 2.11 accepts arch-specific targets such as ``9.0a`` (set in common H100 images), ``10.0a`` and
``12.0a``, and names such as ``Hopper``. DeepSpeed 0.19.8 does not: ``CUDAOpBuilder.compute_capability_args``
(``deepspeed/ops/op_builder/builder.py``) splits each entry on ``.`` and calls ``int()`` on both parts
(after dropping a ``+PTX``), so ``9.0a`` fails with ``ValueError: invalid literal for int() with base 10:
'0a'`` and every op it JIT-builds (FusedAdam for a GPU Adam, the hybrid engine's inference op) fails with
it (DeepSpeed issue 7589). The probes hand their children the list :func:`sanitize_arch_list` returns:
``major.minor`` entries with their ``+PTX``, the suffix dropped (the ``sm_90`` code of ``9.0`` runs on every
Hopper GPU; the ops the probes build use nothing arch-specific). A list with no readable entry is removed,
and DeepSpeed then builds for the compute capability of the visible device, as it does when the variable
is unset. Pure Python.
"""

from __future__ import annotations

import re

__all__ = ["ARCH_VARIABLE", "arch_list_env", "sanitize_arch_list"]

ARCH_VARIABLE = "TORCH_CUDA_ARCH_LIST"

# PyTorch's own names (torch.utils.cpp_extension._get_cuda_arch_flags); combined names before single ones.
NAMED_ARCHES: tuple[tuple[str, str], ...] = (
    ("Kepler+Tesla", "3.7"),
    ("Kepler", "3.5+PTX"),
    ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"),
    ("Pascal", "6.0;6.1+PTX"),
    ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"),
    ("Turing", "7.5+PTX"),
    ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"),
    ("Ada", "8.9+PTX"),
    ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"),
    ("Blackwell", "10.0;10.3;12.0;12.1+PTX"),
)
_DOTTED = re.compile(r"^(\d{1,2})\.(\d)[a-z]?(\+ptx)?$", re.IGNORECASE)  # 9.0, 9.0a, 10.0f+PTX
_COMPACT = re.compile(r"^(?:sm_|compute_)?(\d{1,2})(\d)[a-z]?(\+ptx)?$", re.IGNORECASE)  # 90a, sm_90, 100


def sanitize_arch_list(text: str | None) -> str | None:
    """The entries of ``text`` DeepSpeed can parse, as ``major.minor[+PTX]`` joined by ``;``; None if none.

    Separators ``;``, ``,`` and whitespace; PyTorch's arch names are expanded; ``9.0a`` -> ``9.0``,
    ``90a`` / ``sm_90`` -> ``9.0``; duplicates merge (``+PTX`` kept if any copy had it), first-seen order;
    unreadable entries are dropped. ``native`` or nothing readable gives None.
    """
    if text is None:
        return None
    expanded = text
    for name, value in NAMED_ARCHES:
        expanded = expanded.replace(name, value)
    arches: dict[str, bool] = {}
    for token in re.split(r"[;,\s]+", expanded.strip()):
        match = _DOTTED.match(token) or _COMPACT.match(token)
        if match is None:
            continue
        arch = f"{int(match.group(1))}.{match.group(2)}"
        arches[arch] = arches.get(arch, False) or match.group(3) is not None
    if not arches:
        return None
    return ";".join(arch + ("+PTX" if ptx else "") for arch, ptx in arches.items())


def arch_list_env(env: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """``env`` with a readable ``TORCH_CUDA_ARCH_LIST``, and a one-line note when it had to change it.

    Unset stays unset; a list that is already clean stays as it was (same text, same note: None).
    """
    raw = env.get(ARCH_VARIABLE)
    if raw is None:
        return dict(env), None
    clean = sanitize_arch_list(raw)
    out = dict(env)
    if clean is None:
        out.pop(ARCH_VARIABLE, None)
        note = (
            f"{ARCH_VARIABLE}={raw!r} has no entry DeepSpeed can parse: unset for the probes "
            "(DeepSpeed builds its ops for the device's compute capability)"
        )
        return out, note
    if clean == raw.strip() or _same_entries(clean, raw):
        out[ARCH_VARIABLE] = raw
        return out, None
    out[ARCH_VARIABLE] = clean
    return out, f"{ARCH_VARIABLE}={raw!r} read as {clean!r} (DeepSpeed's op builder cannot parse arch suffixes)"


def _same_entries(clean: str, raw: str) -> bool:
    """Whether ``raw`` already is ``clean`` up to its separators (``8.0 8.6+PTX`` and ``8.0;8.6+PTX``)."""
    return [t for t in re.split(r"[;\s]+", raw.strip()) if t] == clean.split(";")

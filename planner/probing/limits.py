"""The run options every command that starts probes checks the same way (``planner probe``, ``planner tune``):
the device, the steps of a probe, a probe's timeout and the study name; each bad value is one InputError line,
raised before anything is opened, written or run."""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from store.errors import InputError

DEVICES = ("cuda", "cpu")
MIN_STEPS = 2  # warm-up comes first: 1 step, 2 under ZeRO-3
MAX_STEPS = 1000
MAX_TIMEOUT_S = 86_400  # a day
MAX_STUDY_NAME_CHARS = 512  # Optuna's studies.study_name column


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


def check_device(device: Any) -> str:
    """``device`` when it is ``cuda`` or ``cpu``."""
    if device not in DEVICES:
        raise InputError(f"--device must be cuda or cpu, not {_shown(device)}")
    return str(device)


def check_steps(steps: Any) -> int:
    """``steps`` when it is a whole number from MIN_STEPS to MAX_STEPS."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < MIN_STEPS:
        raise InputError(
            f"--steps must be a whole number >= {MIN_STEPS} (warm-up comes first: 1 step, 2 under ZeRO-3), "
            f"not {_shown(steps)}"
        )
    if steps > MAX_STEPS:
        raise InputError(f"--steps must be at most {MAX_STEPS} (a probe measures a few steps), not {_shown(steps)}")
    return steps


def check_timeout(timeout_s: Any) -> float:
    """``timeout_s`` as seconds when it is a finite number above 0 and at most MAX_TIMEOUT_S (not nan or inf)."""
    valid = not isinstance(timeout_s, bool) and isinstance(timeout_s, (int, float))
    if not valid or not math.isfinite(timeout_s) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise InputError(
            f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S} (a day), "
            f"not {_shown(timeout_s)}"
        )
    return float(timeout_s)


def check_device_present(device: str) -> None:
    """InputError (one line) for ``cuda`` on a machine where torch sees no CUDA device: refused before the
    database is opened or DeepSpeed's ops are built (imports torch for ``cuda`` only)."""
    if device != "cuda":
        return
    from probes.model.build import max_ranks  # lazy on purpose: probes loads torch

    if max_ranks(device) < 1:
        raise InputError(
            "--device cuda: torch sees no CUDA device on this machine (torch.cuda.device_count() is 0); "
            "--device cpu probes on DeepSpeed's CPU backend"
        )


def check_run(device: Any, steps: Any, timeout_s: Any) -> tuple[str, int, float]:
    """(device, steps, timeout in seconds) of a probing command, each checked (see the functions above)."""
    return check_device(device), check_steps(steps), check_timeout(timeout_s)


def check_study_name(name: Any) -> str | None:
    """An Optuna study name: None (the default), or 1 to MAX_STUDY_NAME_CHARS printable characters."""
    if name is None:
        return None
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"--study must name a study (a non-empty text), not {_shown(name)}")
    if len(name) > MAX_STUDY_NAME_CHARS:
        raise InputError(f"--study: a study name has at most {MAX_STUDY_NAME_CHARS} characters, not {len(name)}")
    bad = next((ch for ch in name if unicodedata.category(ch) in ("Cc", "Cs")), None)
    if bad is not None:
        raise InputError(f"--study: a study name cannot contain the character {ascii(bad)}")
    return name

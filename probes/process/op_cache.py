"""Where the probes build DeepSpeed's ops: a folder of this environment, not torch's shared default.

torch builds JIT extensions under ``TORCH_EXTENSIONS_DIR`` or, unset, ``~/.cache/torch_extensions``: one
folder for every virtualenv of the same Python. DeepSpeed's op builders record their sources and flags, so a
user's training environment with another DeepSpeed and memplan's probes rebuilt each other's CPU-Adam and
shared-memory allreduce on every alternation (minutes each, holding torch's build lock). The probe children
therefore get ``TORCH_EXTENSIONS_DIR`` set (:func:`op_cache_env`, from :func:`probes.process.isolation.child_env`):
to the user's own value when they set one, else to :func:`default_ops_folder`,
``<sys.prefix>/var/cache/memplan/torch_extensions/<py>_<device>`` (the environment memplan runs in), or,
where that cannot be written (a system Python), ``memplan/torch_extensions/<name>-<hash>/<py>_<device>`` in
the user's cache folder, ``<name>-<hash>`` naming the environment. Pure Python: no torch here.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["VARIABLE", "default_ops_folder", "op_cache_env", "ops_folder"]

VARIABLE = "TORCH_EXTENSIONS_DIR"


def _usable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def default_ops_folder(device: str, env: Mapping[str, str] | None = None, prefix: str | None = None) -> Path:
    """The folder the probes of ``device`` (cpu, cuda) build DeepSpeed's ops in when the user set none
    (module docstring); made if missing. ``prefix`` defaults to ``sys.prefix``."""
    env = os.environ if env is None else env
    prefix = sys.prefix if prefix is None else prefix
    leaf = f"py{sys.version_info.major}{sys.version_info.minor}_{'cuda' if device == 'cuda' else 'cpu'}"
    own = Path(prefix) / "var" / "cache" / "memplan" / "torch_extensions" / leaf
    if _usable(own):
        return own
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = f"{Path(prefix).name or 'python'}-{hashlib.sha1(str(Path(prefix).resolve()).encode()).hexdigest()[:10]}"
    return Path(cache) / "memplan" / "torch_extensions" / name / leaf


def ops_folder(env: Mapping[str, str]) -> Path | None:
    """The folder a child with environment ``env`` builds ops in, when set there."""
    return Path(env[VARIABLE]) if env.get(VARIABLE) else None


def op_cache_env(env: dict[str, str], device: str) -> dict[str, str]:
    """``env`` with ``TORCH_EXTENSIONS_DIR`` set to this environment's folder, unless it is set already."""
    if not env.get(VARIABLE):
        env[VARIABLE] = str(default_ops_folder(device, env))
    return env

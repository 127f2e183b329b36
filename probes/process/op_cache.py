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

One ninja builds that folder (:func:`pin_ninja`): torch runs ``ninja`` from ``PATH``
(``torch.utils.cpp_extension._run_ninja_build``), and a venv holds pip's ninja (1.13 here) beside the system's
(1.11). Each ninja hashes a build's command line its own way in ``.ninja_log``, so each found the other's objects
"command line changed" (``ninja -d explain``) and rebuilt them: an activated shell's ``planner probe`` rebuilt
FusedAdam and the shared-memory allreduce (minutes on 2 cores) after the suite had built them with the system
ninja, and back. The children's ``PATH`` finds this environment's ninja first, whatever the caller's ``PATH``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

__all__ = ["VARIABLE", "default_ops_folder", "op_cache_env", "ops_folder", "pin_ninja"]

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
    return pin_ninja(env)


def environment_ninja() -> Path | None:
    """The ninja of the environment memplan runs in (pip's ``ninja``, torch's build tool), where it has one."""
    ninja = Path(sysconfig.get_path("scripts")) / "ninja"
    return ninja if ninja.is_file() and os.access(ninja, os.X_OK) else None


def pin_ninja(env: dict[str, str], prefix: str | None = None) -> dict[str, str]:
    """``env`` whose ``PATH`` finds :func:`environment_ninja` first (module docstring): a folder holding only a link
    to it, ``<prefix>/var/cache/memplan/ninja``, goes first, so no other program the child runs changes. ``env`` is
    returned as it is where the environment has no ninja, its ``PATH`` finds that one already, or the folder cannot
    be written."""
    ninja = environment_ninja()
    path = env.get("PATH", os.defpath)
    found = shutil.which("ninja", path=path)
    if ninja is None or (found is not None and Path(found).resolve() == ninja.resolve()):
        return env
    folder = Path(sys.prefix if prefix is None else prefix) / "var" / "cache" / "memplan" / "ninja"
    link = folder / "ninja"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not (link.is_symlink() and Path(os.readlink(link)) == ninja):
            staged = folder / f".ninja-{os.getpid()}"
            staged.unlink(missing_ok=True)
            staged.symlink_to(ninja)
            os.replace(staged, link)  # atomic: a concurrent child sees the old link or the new one
    except OSError:
        return env
    env["PATH"] = os.pathsep.join([str(folder), path])
    return env

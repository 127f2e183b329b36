"""`pip install -e .` (scripts/setup.sh) lets a type checker outside the repository find memplan and its types.

setuptools installs a flat layout without ``package-dir`` through an import hook (a meta-path finder) that mypy
cannot follow: "Cannot find implementation or library stub for module named 'planner'" (issue 44 item 2). With
``package-dir = {"" = "."}`` (pyproject.toml) the editable install is a plain ``.pth`` entry for the repository,
which mypy reads (PEP 561: it takes a package from an installed path only where it ships ``py.typed``). Checked
with mypy's own module finder on an editable install of a copy of the repository into a fresh venv: the finder
is what answers "cannot find" (a full ``mypy --strict`` run over memplan is the wheel test's, test_user_type_check).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from planner_helpers import REPO

PACKAGES = ("planner", "search", "probes", "launch", "store")


def test_an_editable_install_is_found_by_mypy_with_its_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mypy")
    from mypy.build import default_data_dir
    from mypy.modulefinder import FindModuleCache, compute_search_paths
    from mypy.options import Options

    source = tmp_path / "memplan"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # setuptools (the build backend, run without isolation) and memplan's dependencies from this venv
    (Path(site) / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--python", str(python)]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-e", str(source)],
        check=True,
        capture_output=True,
    )
    monkeypatch.chdir(tmp_path)  # a user's project outside the repository (mypy searches the working folder first)
    options = Options()
    options.python_executable = str(python)
    finder = FindModuleCache(compute_search_paths([], options, default_data_dir()), None, options)
    for package in ("planner", "search", "launch", "store"):
        found = finder.find_module(package)
        assert found == str(source / package / "__init__.py"), (package, found)
    assert (source / "planner" / "py.typed").is_file()

"""``planner`` re-exports every public name of ``planner.api`` (docs/layout.md), lazily."""

from __future__ import annotations

import subprocess
import sys

import planner
import planner.api as api


def test_the_package_exports_every_public_api_name() -> None:
    assert sorted(planner.__all__) == sorted(api.__all__)
    for name in api.__all__:
        assert getattr(planner, name) is getattr(api, name), name


def test_probe_program_imports_from_the_package_face() -> None:
    from planner import gpu_catalog, probe_program

    assert probe_program is api.probe_program and gpu_catalog is api.gpu_catalog


def test_importing_the_package_stays_light() -> None:
    code = "import sys, planner; print(any(m in sys.modules for m in ('torch', 'deepspeed', 'planner.api')))"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "False"

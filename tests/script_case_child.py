"""The child :func:`script_cases.run_script_case` starts: ``python -m script_case_child SCRIPT CASE_JSON``.

It runs SCRIPT as ``__main__`` (as ``python SCRIPT CASE_JSON`` would), with SCRIPT's folder first on ``sys.path``.
Started in this folder, it finds the tests' helpers (``tiny_models``, ``script_cases``) as its own folder's
modules, so the child's environment is a probe child's own (``child_env``) and the preloaded starter that forks
it is the one the probes of the session are forked from.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    """Run the script named by the first argument as ``__main__``, the case JSON its one argument."""
    script, case = sys.argv[1], sys.argv[2]
    sys.path.insert(0, str(Path(script).resolve().parent))
    sys.argv = [script, case]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

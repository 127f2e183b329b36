#!/usr/bin/env bash
# Creates .venv if missing and installs memplan into it. Safe to run again: it only does what is missing.
# The postgres extra (psycopg 3) comes along, so that the tests run the store on a real PostgreSQL server
# where its binaries (initdb, pg_ctl) are installed; they skip, saying why, where they are not. The frameworks
# extra (accelerate, TRL, PEFT, bitsandbytes) lets the tests run each `planner export --format` file through its
# framework and QLoRA's layers on the CPU. The plot extra (matplotlib, for `planner explain --plot x.png`) is not
# installed: `.venv/bin/pip install -e '.[plot]'` adds it.
# The editable install is a plain .pth entry for the repository (package-dir in pyproject.toml), so a type checker
# outside the repository finds the packages and their py.typed (mypy --python-executable .venv/bin/python).
#
# torch: when the venv cannot import torch, install the pinned CPU build torch==2.13.0 first (pip's
# configured find-links / index serve it; on a CPU machine without such a source, set
# PIP_EXTRA_INDEX_URL to PyTorch's CPU wheel index first). A torch that is already importable (a CUDA
# build, say) is kept: nothing below upgrades it, since every requirement admits 2.x.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
stamp="$VENV/.memplan-installed"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch in $VENV; installing $TORCH_SPEC (CPU build)"
  "$VENV/bin/pip" install --quiet "$TORCH_SPEC"
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing memplan and its dependencies into $VENV"
  "$VENV/bin/pip" install --quiet -e ".[dev,postgres,frameworks]"
  touch "$stamp"
fi
# Byte-compile the project once, so `planner` starts fast even where PYTHONDONTWRITEBYTECODE is set.
"$VENV/bin/python" -m compileall -q planner search probes launch store >/dev/null

# The two Quickstart commands: `make demo` and `make test`. Each sets up .venv first (scripts/setup.sh).
VENV ?= .venv
BIN := $(VENV)/bin
export DS_ACCELERATOR ?= cpu
# the suite's pytest-xdist workers: two halve the wall time on a 2-core machine (docs/development.md); 0 runs it serially.
# --dist loadscope keeps each module's tests in one worker, so a module's fixture (the accuracy probes) runs once.
# The first run builds DeepSpeed's CPU ops into the venv before the tests (tests/op_builds.py, about 5 min on 2 cores).
TEST_WORKERS ?= 2

.PHONY: setup demo test lint bench

setup:
	@bash scripts/setup.sh

demo: setup
	$(BIN)/planner recommend --model opt-1.3b --gpu-mem 24G --workload sft

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports  # the import layering: [tool.importlinter] in pyproject.toml (docs/layout.md)

bench: setup
	$(BIN)/python benchmarks/latency.py

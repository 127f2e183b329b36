# The two Quickstart commands: `make demo` and `make test`. Each sets up .venv first (scripts/setup.sh).
VENV ?= .venv
BIN := $(VENV)/bin
export DS_ACCELERATOR ?= cpu

.PHONY: setup demo test lint bench

setup:
	@bash scripts/setup.sh

demo: setup
	$(BIN)/planner recommend --model opt-1.3b --gpu-mem 24G --workload sft

test: setup
	$(BIN)/python -m pytest -q

# The import-flow check lives beside a developer's checkout, not in the repository: skipped where absent.
LAYERS_CHECK ?= ../shared/tools/check_layers.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@if [ -f "$(LAYERS_CHECK)" ]; then \
		echo "$(BIN)/python $(LAYERS_CHECK)"; $(BIN)/python "$(LAYERS_CHECK)"; \
	else \
		echo "lint: $(LAYERS_CHECK) not found; skipping the import-flow check (it lives beside a developer's checkout)"; \
	fi

bench: setup
	$(BIN)/python benchmarks/latency.py

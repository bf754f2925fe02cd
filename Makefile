# The README's two commands: `make demo` (set up and run the main job) and `make test`.
# Everything runs in the project's virtual environment, created by scripts/setup.sh.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PYTEST_ARGS ?=
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test lint bench

setup:
	bash scripts/setup.sh

# The demo ends with one verdict line whatever fails, its own setup included.
demo:
	@bash scripts/setup.sh || { rc=$$?; echo "VERDICT: FAIL — before step 1 (setup): scripts/setup.sh exited $$rc (its error is above)"; exit 1; }
	$(PYTHON) demo/run.py

test: setup
	$(PYTHON) -m pytest -ra $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy
	$(VENV)/bin/lint-imports

bench:
	$(PYTHON) bench/host_bench.py
	$(PYTHON) bench/plugin_bench.py
	$(PYTHON) bench/webhook_bench.py
	$(PYTHON) bench/compare_tools.py
	$(PYTHON) bench/dra_bench.py

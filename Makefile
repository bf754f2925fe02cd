# The README's two commands: `make demo` (set up and run the main job) and `make test`.
# Everything runs in the project's virtual environment, created by scripts/setup.sh.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PYTEST_ARGS ?=
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test lint bench bench-detail bench-tools image wheel

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

# Every row of the performance table with its goal (met / NOT met); `bench/against.py REF`
# compares the same rows with a git ref in one run. The per-area scripts print more detail;
# bench-tools runs the QEMU guest comparison with driverctl and dpdk-devbind (minutes).
bench:
	$(PYTHON) bench/goals.py

bench-detail:
	$(PYTHON) bench/host_bench.py
	$(PYTHON) bench/plugin_bench.py
	$(PYTHON) bench/webhook_bench.py
	$(PYTHON) bench/dra_bench.py
	$(PYTHON) bench/dra_prepare_bench.py
	$(PYTHON) bench/dra_health_bench.py
	$(PYTHON) bench/holders_bench.py

bench-tools:
	$(PYTHON) bench/compare_tools.py

# The container image as one OCI archive in dist/ (load it on nodes without a registry:
# docs/install.md). IMAGE_ARGS=--debian-base builds with no registry at all.
image:
	bash scripts/build-image.sh $(IMAGE_ARGS)

# The CLI as a wheel in dist/, for `pipx install dist/vfio_dp-*.whl` on a node.
wheel: setup
	$(PYTHON) -m pip wheel --no-deps -w dist .

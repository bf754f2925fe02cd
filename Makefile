# The README's two commands: `make demo` (set up and run the main job) and `make test`.
# Everything runs in the project's virtual environment, created by scripts/setup.sh.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PYTEST_ARGS ?=
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test lint bench image wheel

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
	$(PYTHON) bench/dra_health_bench.py

# The container image as one OCI archive in dist/ (load it on nodes without a registry:
# docs/install.md). IMAGE_ARGS=--debian-base builds with no registry at all.
image:
	bash scripts/build-image.sh $(IMAGE_ARGS)

# The CLI as a wheel in dist/, for `pipx install dist/vfio_dp-*.whl` on a node.
wheel: setup
	$(PYTHON) -m pip wheel --no-deps -w dist .

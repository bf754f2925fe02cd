# The README's two commands: `make demo` (set up and run the main job) and `make test`.
# Everything runs in the project's virtual environment, created by scripts/setup.sh.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PYTEST_ARGS ?=
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Python keeps its bytecode caches here even when the caller's environment says not to
# (PYTHONDONTWRITEBYTECODE): without them each pytest worker rewrites the asserts of every
# test module again (~5 s of CPU per worker) and every process a test starts recompiles
# each module changed since scripts/setup.sh byte-compiled the tree (docs/development.md).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help setup demo test check lint bench bench-detail bench-tools image wheel

# `make help`: every target, with the text after its `##`.
help: ## list the targets
	@awk '/^[a-z][a-z-]*:([^=]|$$)/ { t = $$0; sub(/:.*/, "", t); d = ""; \
	  if (index($$0, "## ")) { d = substr($$0, index($$0, "## ") + 3) }; \
	  printf "  make %-13s %s\n", t, d }' $(MAKEFILE_LIST)

setup: ## install what everything needs (Debian packages, .venv with the test extra)
	bash scripts/setup.sh

# The demo ends with one verdict line whatever fails, its own setup included.
demo: ## set up, then run the main job end to end (one VERDICT line)
	@bash scripts/setup.sh || { rc=$$?; echo "VERDICT: FAIL — before step 1 (setup): scripts/setup.sh exited $$rc (its error is above)"; exit 1; }
	$(PYTHON) demo/run.py

# The unit tests (CHECK_MARKERS) on UNIT_WORKERS workers (pytest-xdist; a test file stays on
# one worker), then the guest, image, benchmark-harness and clean-install tests serially: they
# boot QEMU, build images and time things. pytest's exit status 5 (no test selected, e.g.
# PYTEST_ARGS named one file) is not a failure; either part failing fails the target.
CHECK_MARKERS ?= not guest and not image and not bench and not install
# Two workers per CPU core, at most 8: a unit test spends about 40 % of its time waiting
# without a CPU (deadlines, timeouts, retries, servers and processes it talks to), and a
# second worker per core runs meanwhile (docs/development.md, "The fast tier").
UNIT_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); n=$$((n * 2)); echo $$((n > 8 ? 8 : n)))
test: setup ## every test: unit tests on two workers per core, then guest/image/bench/install serially
	@rc=0; \
	$(PYTHON) -m pytest -ra -n $(UNIT_WORKERS) --dist loadfile -m "$(CHECK_MARKERS)" $(PYTEST_ARGS) || rc=$$?; \
	[ $$rc -eq 5 ] && rc=0; rc2=0; \
	$(PYTHON) -m pytest -ra -m "not ($(CHECK_MARKERS))" $(PYTEST_ARGS) || rc2=$$?; \
	[ $$rc2 -eq 5 ] && rc2=0; \
	[ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]

# The fast tier for developers (docs/development.md): lint, types and import contracts, then
# the unit tests on UNIT_WORKERS workers without the guest, image, benchmark-harness and
# clean-install tests, which `make test` and CI still run.
check: lint ## lint, then the unit tests on two workers per core (no guest, image, bench, install)
	$(PYTHON) -m pytest -q -n $(UNIT_WORKERS) --dist loadfile -m "$(CHECK_MARKERS)" $(PYTEST_ARGS)

lint: ## ruff, mypy --strict and the import contracts
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy
	$(VENV)/bin/lint-imports

# Every row of the performance table with its goal (met / NOT met); `bench/against.py REF`
# compares the same rows with a git ref in one run. The per-area scripts print more detail;
# bench-tools runs the QEMU guest comparison with driverctl and dpdk-devbind (minutes).
bench: ## every row of the performance table against its goal
	$(PYTHON) bench/goals.py

bench-detail: ## the per-area benchmark scripts, in detail
	$(PYTHON) bench/host_bench.py
	$(PYTHON) bench/plugin_bench.py
	$(PYTHON) bench/webhook_bench.py
	$(PYTHON) bench/dra_bench.py
	$(PYTHON) bench/dra_prepare_bench.py
	$(PYTHON) bench/dra_health_bench.py
	$(PYTHON) bench/holders_bench.py

bench-tools: ## the QEMU guest comparison with driverctl and dpdk-devbind (minutes)
	$(PYTHON) bench/compare_tools.py

# The container image as one OCI archive in dist/ (load it on nodes without a registry:
# docs/install.md). IMAGE_ARGS=--debian-base builds with no registry at all.
image: ## the container image as one OCI archive in dist/ (needs only buildah)
	bash scripts/setup.sh --for image
	bash scripts/build-image.sh $(IMAGE_ARGS)

# The CLI as a wheel in dist/, for `pipx install dist/vfio_dp-*.whl` on a node.
wheel: ## the CLI as a wheel in dist/ (needs only python3-venv)
	bash scripts/setup.sh --for wheel
	$(PYTHON) -m pip wheel --no-deps -w dist .

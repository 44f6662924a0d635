# Set-up on a fresh machine needs only Python 3.11 and the package registries.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
DATA   ?= $(firstword $(wildcard ../shared/data/real /work/shared/data/real) ../shared/data/real)
LAKE   ?= lake
SAMPLES ?= samples
# the command the demo runs (the tests point it at tests/bin/cubelake, the same command started warm)
CUBELAKE ?= $(BIN)/cubelake

.PHONY: demo samples test check affected record-count lint bench mutate clean

# Every package comes from requirements/lock.txt (exact versions, sha256 hashes); the build tools first, from
# requirements/build.txt (the same versions), so that the few source packages and cubelake itself build with
# locked tools. A fresh machine installs exactly what the last green CI ran. `make lock` refreshes both.
LOCK         := requirements/lock.txt
BUILD_LOCK   := requirements/build.txt
UV_VERSION   := 0.13.10
TORCH_WHEELS ?= /opt/wheels
# -qq: errors only (this machine's pip configuration warns about every package its local mirror lacks)
PIP_INSTALL  := $(BIN)/python -m pip install -qq --require-hashes --no-deps --no-build-isolation

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(LOCK) $(BUILD_LOCK) pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -r $(BUILD_LOCK)
	$(PIP_INSTALL) -r $(LOCK)
	$(BIN)/python -m pip install -qq --no-deps --no-build-isolation -e .
	@$(BIN)/python -m pip check || { echo "a requirement of pyproject.toml is not in $(LOCK): run make lock"; exit 1; }
	touch $@

# `make lock` follows pyproject.toml (a new requirement or range is resolved, every other pin kept);
# `make lock-upgrade` resolves everything anew, to the newest releases the ranges and
# requirements/constraints.txt allow. Then `make test`, and commit the lock with what it passed with.
# TORCH_WHEELS: where the CPU torch wheel is (a folder, or https://download.pytorch.org/whl/cpu/torch/).
UV_COMPILE := $(BIN)/uv pip compile --generate-hashes --python-version 3.11 --custom-compile-command 'make lock' --quiet

.PHONY: lock lock-upgrade
lock: | $(BIN)/python
	$(BIN)/python -m pip install -qq 'uv==$(UV_VERSION)'
	$(UV_COMPILE) pyproject.toml requirements/build.in --extra torch --extra test --extra bench \
	  --constraint requirements/constraints.txt --find-links $(TORCH_WHEELS) $(UV_UPGRADE) -o $(LOCK)
	$(UV_COMPILE) requirements/build.in --constraint $(LOCK) -o $(BUILD_LOCK)

lock-upgrade: UV_UPGRADE := --upgrade
lock-upgrade: lock

# the versions the tests run with (CI prints them first, so a break after a release shows at once)
.PHONY: versions
versions: $(VENV)/.installed
	@$(BIN)/python .ci/versions.py

demo: $(VENV)/.installed
	@echo "== cubelake demo: the job manifests/demo.yaml ingests the real scenes of $(DATA) into ./$(LAKE)"
	@CUBELAKE_DATA=$(abspath $(DATA)) CUBELAKE_LAKE=$(abspath $(LAKE)) $(CUBELAKE) jobs run manifests/demo.yaml; \
	  rc=$$?; if [ $$rc -gt 1 ]; then exit $$rc; fi; \
	  echo "== exit code $$rc (1 = some inputs were rejected, as the bad inputs must be)"
	@$(CUBELAKE) lake --lake $(LAKE)
	@echo "== the catalog: every collection, then scenes over Potsdam in summer 2022 covering 450-1300 nm"
	@$(CUBELAKE) catalog stats --lake $(LAKE)
	@$(CUBELAKE) catalog search --lake $(LAKE) --bbox 12.9,52.3,13.2,52.5 --datetime 2022-06/2022-08 --wavelength 450:1300
	@echo "== a scene's kerchunk references, checked (targets allowed, unchanged) and opened through zarr"
	@$(CUBELAKE) refs check $$(ls -d $(LAKE)/scenes/*/*.refs.* | head -1) --lake $(LAKE)

# small EMIT, PRISMA, EnMAP, DESIS and CF-NetCDF products built to each format's specification
samples: $(VENV)/.installed
	@$(BIN)/python -m cubelake.testing.samples $(abspath $(SAMPLES))

# make test: the whole suite, on every core (xdist; a test file stays on one worker, so its module fixtures are
# built once), then the few tests that time a link or a race alone; the 25 slowest are printed, and the run fails
# if fewer tests are collected than tests/COLLECTED records. Every test has a timeout (pyproject: 120 s).
PYTEST := $(BIN)/python -m pytest
test: versions lint
	$(PYTEST) -q -n auto --dist loadfile -m "not serial" --durations=25 --check-count
	$(PYTEST) -q -m serial

# the inner loop: lint, types, and the tests that start no process and no server, in a few minutes
check: lint
	$(PYTEST) -q -n auto --dist loadfile -m "not integration and not slow and not serial"

# only the tests the uncommitted change reaches (pytest-testmon; the first run records what each test runs)
affected: $(VENV)/.installed
	$(PYTEST) -q --testmon -m "not serial"

# after merging or removing tests on purpose: record the new count, and why
record-count: $(VENV)/.installed
	@test -n "$(REASON)" || { echo "say which tests and why: make record-count REASON='...'"; exit 2; }
	@n=$$($(PYTEST) --collect-only -q -p no:cacheprovider | tail -1 | grep -oE '^[0-9]+') && \
	  echo "$$n $$(date -u +%F) $(REASON)" >> tests/COLLECTED && echo "tests/COLLECTED: $$n"

lint: $(VENV)/.installed
	$(BIN)/ruff check cubelake ingest catalog loaders tests bench mutation .ci
	$(BIN)/mypy cubelake ingest catalog loaders

bench: $(VENV)/.installed
	$(BIN)/python bench/ingest_throughput.py
	$(BIN)/python bench/refs.py
	$(BIN)/python bench/catalog.py --items 1000000 --queries 200
	$(BIN)/python bench/loader.py

# mutation testing (Cosmic Ray) of the pure and security-critical modules: mutation/modules.toml lists them with
# their tests; a module unchanged since its last run is not run again; fails if a score falls (mutation/scores.json)
mutate: $(VENV)/.installed
	$(BIN)/python mutation/run.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) $(LAKE) $(SAMPLES) .pytest_cache .mutation

# re-fetch the map view's vendored Leaflet (npm pack) and check it against catalog/web/vendor/leaflet/SHA256SUMS
.PHONY: vendor-web
vendor-web: $(VENV)/.installed
	$(BIN)/python catalog/web/vendor.py

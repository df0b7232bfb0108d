# stratoflow: `make run` retrains a pipeline once through Airflow; `make test` runs the tests.
#   make run PIPELINE=digits CONF='{"strategy": "mirrored", "replicas": 2, "epochs": 3}'
#   make test PYTEST_ARGS='tests/unit/test_dags.py -q'
#   make docs (the docs site into site/), make docs-serve (on http://127.0.0.1:8000)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Touched after a successful install; pyproject.toml (or this file) changing makes it stale.
INSTALLED := $(VENV)/.stratoflow-installed

PIPELINE ?= mnist
CONF ?= {}
PYTEST_ARGS ?=

.PHONY: install run test lint bench clean-state services services-status services-stop system-packages \
	docs docs-serve

install: $(INSTALLED)

# Bytecode compiled once, here: where PYTHONDONTWRITEBYTECODE is set (as on the machines this
# was measured on), every process would otherwise recompile TensorFlow's sources on each
# import, about three times slower (docs/BENCHMARKS.md, "Facts").
$(INSTALLED): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/pip install uv
	$(BIN)/uv pip install --python $(BIN)/python -e '.[dev]'
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null
	touch $@

run: $(INSTALLED)
	$(BIN)/stratoflow run $(PIPELINE) --conf '$(CONF)'

# Two pytest-xdist workers, one per core: the suite keeps both cores busy while one test waits on
# a server or a scheduler (tests/conftest.py groups the tests that share fixtures). A third worker
# gained about a minute of 22, within the runs' spread, and the Ray hosts module took twice as
# long (714-855 s against 348-361 s), closer to its deadlines on a slower host (docs/BENCHMARKS.md).
TEST_WORKERS ?= 2
test: $(INSTALLED)
	$(BIN)/pytest -n $(TEST_WORKERS) --no-loadscope-reorder $(PYTEST_ARGS)

# The unit suite: every test but those marked `integration` (a training process, an Airflow
# run or command, a server): under 2 minutes on 2 cores.
.PHONY: test-unit
test-unit: $(INSTALLED)
	$(BIN)/pytest -m "not integration" $(PYTEST_ARGS)

# The system programs the tests need, from Debian's packages (needs root when one is missing):
# PostgreSQL's server (the services stack and the compose scripts' tests run their own cluster)
# and chromium (the MLflow UI browser test, driven by Playwright). Nothing to do when present.
SYSTEM_PACKAGES = $(if $(wildcard /usr/lib/postgresql/*/bin/initdb),,postgresql) \
	$(if $(shell command -v chromium),,chromium)
system-packages:
	$(if $(strip $(SYSTEM_PACKAGES)),apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends $(SYSTEM_PACKAGES),@echo "system packages present")

# Benchmarks: figures and ratios, written to docs/BENCHMARKS.md (not timed tests).
bench: $(INSTALLED)
	$(BIN)/python -m benchmarks.run

# The deployment as local processes: PostgreSQL, MLflow server, Airflow api-server, scheduler,
# dag-processor, triggerer (all on 127.0.0.1, free ports; state in .stratoflow/services).
# RAY=1 also starts a single-node Ray head on 127.0.0.1 for `launcher: ray` runs.
services: $(INSTALLED)
	$(BIN)/stratoflow services up $(if $(RAY),--ray)

services-status: $(INSTALLED)
	$(BIN)/stratoflow services status

services-stop: $(INSTALLED)
	$(BIN)/stratoflow services down

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The docs site (mkdocs.yml, docs/): built strictly, so a broken link, anchor or reference fails,
# as tests/test_docs.py builds it in CI; served on loopback only. NO_MKDOCS_2_WARNING silences
# Material's notice about its end of life, printed on every build.
DOCS_ENV := NO_MKDOCS_2_WARNING=1
DOCS_PORT ?= 8000
docs: $(INSTALLED)
	$(DOCS_ENV) $(BIN)/mkdocs build --strict

docs-serve: $(INSTALLED)
	$(DOCS_ENV) $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

# The local state of `make run`: Airflow home and metadata DB, MLflow store, TFDS data, run dirs.
clean-state:
	rm -rf .stratoflow

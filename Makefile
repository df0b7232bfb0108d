# stratoflow: `make run` retrains a pipeline once through Airflow; `make test` runs the tests.
#   make run PIPELINE=digits CONF='{"strategy": "mirrored", "replicas": 2, "epochs": 3}'
#   make test PYTEST_ARGS='tests/dags -q'

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Touched after a successful install; pyproject.toml changing makes it stale, so deps reinstall.
INSTALLED := $(VENV)/.stratoflow-installed

PIPELINE ?= mnist
CONF ?= {}
PYTEST_ARGS ?=

.PHONY: install run test lint bench clean-state services services-status services-stop chromium

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/pip install uv
	$(BIN)/uv pip install --python $(BIN)/python -e '.[dev]'
	touch $@

run: $(INSTALLED)
	$(BIN)/stratoflow run $(PIPELINE) --conf '$(CONF)'

test: $(INSTALLED)
	$(BIN)/pytest $(PYTEST_ARGS)

# The headless browser of the MLflow UI test (Debian's chromium, driven by Playwright); needs root
# when it is missing. The test skips, saying so, where it is not installed.
chromium:
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)

# Benchmarks: figures and ratios, written to docs/BENCHMARKS.md (not timed tests).
bench: $(INSTALLED)
	$(BIN)/python -m benchmarks.run

# The deployment as local processes: PostgreSQL, MLflow server, Airflow api-server, scheduler,
# dag-processor, triggerer (all on 127.0.0.1, free ports; state in .stratoflow/services).
services: $(INSTALLED)
	$(BIN)/stratoflow services up

services-status: $(INSTALLED)
	$(BIN)/stratoflow services status

services-stop: $(INSTALLED)
	$(BIN)/stratoflow services down

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The local state of `make run`: Airflow home and metadata DB, MLflow store, TFDS data, run dirs.
clean-state:
	rm -rf .stratoflow

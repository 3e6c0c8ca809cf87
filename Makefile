# Bothy Notify: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= config/dev.toml

.PHONY: run test lint typecheck unit bench migrate demo clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

## run: create the venv if missing, install, migrate, start the daemon (role all, embedded PostgreSQL, fake provider)
run: $(STAMP)
	$(VENV)/bin/bothy-notify migrate --config $(CONFIG)
	$(VENV)/bin/bothy-notify run --config $(CONFIG)

## test: ruff, mypy --strict and the whole suite
test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(VENV)/bin/ruff check bothy_notify gateway tests bench
	$(VENV)/bin/ruff format --check bothy_notify gateway tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -q

migrate: $(STAMP)
	$(VENV)/bin/bothy-notify migrate --config $(CONFIG)

demo: $(STAMP)
	$(VENV)/bin/bothy-notify demo --config $(CONFIG)

## bench: every benchmark, each alone
bench: $(STAMP)
	@for b in bench/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

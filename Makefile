# Bothy Notify: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= config/dev.toml

.PHONY: run test lint typecheck unit contract install-check bench migrate demo clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

## run: create the venv if missing, install, migrate, start the daemon (role all, embedded PostgreSQL, fake provider)
run: $(STAMP)
	$(VENV)/bin/bothy-notify migrate --config $(CONFIG)
	$(VENV)/bin/bothy-notify run --config $(CONFIG)

## test: ruff, the layering contracts, mypy --strict, the install check, the whole suite
## (pytest last, so its summary closes the output)
test: $(STAMP) lint typecheck install-check unit

## lint: ruff, and the import-linter contracts of .importlinter (docs/architecture.md's layers)
lint: $(STAMP)
	$(VENV)/bin/ruff check bothy_notify gateway tests bench
	$(VENV)/bin/ruff format --check bothy_notify gateway tests bench
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## unit: the suite in PYTEST_WORKERS processes (pytest-xdist; each worker has its own embedded
## PostgreSQL); PYTEST_WORKERS=0 runs it in this process
PYTEST_WORKERS ?= 2
unit: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS)

## contract: schemathesis with every phase and check against `bothy-notify run`, on the document
## it serves (GET /v1/openapi.json): zero failures, every operation reaching a 2xx (tests/contract,
## also part of `unit`); CONTRACT_SEED=random tries a new run, CONTRACT_EXAMPLES=N a longer one
contract: $(STAMP)
	$(PY) -m pytest -q -s tests/contract

## install-check: build the sdist and the wheel, install the wheel without extras in a fresh
## virtualenv, and from another directory run check-config, run (embedded PostgreSQL), one
## append over HTTP, SIGTERM, and the demo (tests/install/smoke.py)
install-check: $(STAMP)
	$(PY) tests/install/smoke.py

migrate: $(STAMP)
	$(VENV)/bin/bothy-notify migrate --config $(CONFIG)

demo: $(STAMP)
	$(VENV)/bin/bothy-notify demo --config $(CONFIG)

## bench: every benchmark, each alone
bench: $(STAMP)
	@for b in bench/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

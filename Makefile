# Bothy Notify: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= config/dev.toml

.PHONY: run test lint typecheck unit contract autobahn interop install-check client-test browser bench soak failover migrate demo schemas clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

## run: create the venv if missing, install, migrate, start the daemon (role all, embedded PostgreSQL, fake provider)
run: $(STAMP)
	$(VENV)/bin/bothy-notify migrate --config $(CONFIG)
	$(VENV)/bin/bothy-notify run --config $(CONFIG)

## test: ruff, the layering contracts, mypy --strict, the install check, the TypeScript
## client's tests, the whole suite (pytest last, so its summary closes the output)
test: $(STAMP) lint typecheck install-check client-test unit

## lint: ruff, and the import-linter contracts of .importlinter (docs/architecture.md's layers)
lint: $(STAMP)
	$(VENV)/bin/ruff check bothy_notify gateway testkit tests bench
	$(VENV)/bin/ruff format --check bothy_notify gateway testkit tests bench
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

## autobahn: the Autobahn testsuite's fuzzing client, sections 1-7 (framing, pings, reserved
## bits, opcodes, fragmentation, UTF-8, closing), against an echo server on the gateway's own
## transport and frame code (tests/gateway/compliance). wstest is Python 2.7 only: it is
## installed pinned into .autobahn/py2 (needs a Python 2.7, e.g. pyenv's). Not part of `test`;
## the same cases run as a table test in `unit` (tests/gateway/compliance/test_autobahn_cases.py)
autobahn: $(STAMP)
	$(PY) -m tests.gateway.compliance.autobahn

## interop: the Matrix push gateway against a real homeserver (tests/interop): matrix-synapse
## (pinned in tests/interop/synapse.py) is installed from the package registry into its own
## cached virtualenv (.interop/synapse), a homeserver on SQLite with two users, a pusher at the
## daemon, a message, the fake APNs. Separate from `test` because the first install takes
## minutes (Twisted, Synapse's crypto and database drivers); reruns reuse the virtualenv and
## take about a minute. .ci/run runs it after `make test`. The deadline covers Synapse's start.
INTEROP_DEADLINE ?= 600
INTEROP_INSTALL_TIMEOUT ?= 1800
interop: $(STAMP)
	timeout $(INTEROP_INSTALL_TIMEOUT) $(PY) -m tests.interop.synapse
	BOTHY_INTEROP=1 BOTHY_TEST_DEADLINE=$(INTEROP_DEADLINE) timeout $$(( $(INTEROP_DEADLINE) + 120 )) \
		$(PY) -m pytest -q -n 0 -p no:cacheprovider --timeout $(INTEROP_DEADLINE) tests/interop

## install-check: build the sdist and the wheel, install the wheel without extras in a fresh
## virtualenv, and from another directory run check-config, run (embedded PostgreSQL), one
## append over HTTP, SIGTERM, and the demo (tests/install/smoke.py)
install-check: $(STAMP)
	$(PY) tests/install/smoke.py

## client-test: the TypeScript client (clients/typescript): npm ci from its lockfile, tsc, and
## node's test runner: unit tests on a fake clock and a fake gateway, then one daemon
## (`bothy-notify run` on the embedded PostgreSQL) for the client and one headless Chromium for
## a page using the client and the status page. Skipped, saying why, only without npm.
CLIENT := clients/typescript
CLIENT_STAMP := $(CLIENT)/node_modules/.installed
client-test: $(STAMP) browser
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "client-test: SKIPPED: npm is not installed (Node 18 or later is needed)"; exit 0; fi; \
	$(MAKE) --no-print-directory $(CLIENT_STAMP) && cd $(CLIENT) && npm test

# npm ci again only when the lockfile changed (a fresh clone always installs).
$(CLIENT_STAMP): $(CLIENT)/package-lock.json
	cd $(CLIENT) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	@touch $@

## browser: Debian's chromium for the browser tests, installed with apt-get where it is missing
## (as root); where it cannot be installed the browser tests are skipped and say so
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "browser: installing Debian's chromium"; \
			(apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium) >/dev/null \
				|| echo "browser: apt-get could not install chromium: the browser tests are skipped"; \
		else echo "browser: chromium is missing and cannot be installed here (not root or no apt-get)"; fi; }

## schemas: write schemas/config.schema.json from the configuration's definitions
## (bothy_notify/config/keys.py), and a new generated migration with the event checks of
## bothy.append_event when schemas/events/*.json changed (bothy_notify/store/eventsql.py);
## a test fails while either differs
schemas: $(STAMP)
	$(PY) -m bothy_notify.config.schema schemas/config.schema.json
	$(PY) -m bothy_notify.store.eventsql

migrate: $(STAMP)
	$(VENV)/bin/bothy-notify migrate --config $(CONFIG)

demo: $(STAMP)
	$(VENV)/bin/bothy-notify demo --config $(CONFIG)

## bench: every benchmark, each alone, but the soak (bench/soak.py: a long run of its own,
## `make soak`) and the failover run (`make failover`)
bench: $(STAMP)
	@for b in bench/[!_]*.py; do \
		case "$$b" in bench/soak.py|bench/failover.py) continue;; esac; \
		echo "== $$b"; $(PY) $$b || exit 1; done

## soak: memory over a long run of two nodes (bench/soak.py; minutes as its --help says)
soak: $(STAMP)
	$(PY) bench/soak.py

## failover: bench/failover.py: a three-node Patroni cluster (etcd, PostgreSQL 15, installed
## with apt-get when missing, as root) under load, and a killed, a switched-over and a frozen
## leader at each position of the multi-host URL (docs/operations.md, "High availability").
## About 17 minutes on 2 cores; not part of CI (see bench/results/2026-12-05-failover.md).
failover: $(STAMP)
	$(PY) bench/failover.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .autobahn .interop
	rm -rf $(CLIENT)/node_modules $(CLIENT)/dist $(CLIENT)/build

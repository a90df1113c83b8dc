# The README's two commands. Each sets itself up: venv, packages, servers.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# `make lock`: newest versions within setup.cfg's ranges, with hashes, for
# every Python 3.11 and platform (markers where they differ: Debian's 3.11.2
# needs async-timeout, 3.11.3+ does not). uv writes no index or find-links.
UV_COMPILE := $(BIN)/uv pip compile --quiet --upgrade --universal --python-version 3.11 --generate-hashes

.PHONY: run cluster test test-unit test-core test-deploy check lint bench lock clean

# The exact versions of requirements-test.lock, hash-checked; then the
# package itself, editable (its dependencies are already there, unless
# setup.cfg gained one since the last `make lock`: tests/test_requirements.py
# says so).
$(VENV)/.installed: setup.cfg pyproject.toml requirements-test.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements-test.lock
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# exec: make passes a SIGTERM on to run.py (not to a shell), which stops what it started.
run: $(VENV)/.installed
	exec $(BIN)/python scripts/run.py

# haproxy, 3 gunicorn hosts, PgBouncer, PostgreSQL and a Redis Cluster on loopback.
cluster: $(VENV)/.installed
	$(BIN)/python -m devservers.packages cluster
	exec $(BIN)/python scripts/cluster.py

# The whole suite, every tier in one session, on TEST_WORKERS pytest-xdist
# workers, each with its own servers and ports (docs/testing.md, "Workers").
# Installs the Debian packages the tests need when missing.
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadgroup
# app/'s bytecode, written once rather than by each process a test starts.
BYTECODE := $(BIN)/python -m compileall -q app devservers scripts wsgi.py
# pytest keeps the bytecode of the modules it rewrites (the tests', its plugins') even where the environment sets
# PYTHONDONTWRITEBYTECODE: rewriting them again cost each worker 4.5 s of CPU per run (docs/testing.md).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest
test: $(VENV)/.installed
	$(BIN)/python -m devservers.packages test
	$(BYTECODE)
	$(PYTEST) $(XDIST) $(PYTEST_ARGS)

# The tiers, by what they need (docs/testing.md). A test of a core or deploy
# module that is marked unit is in the unit tier alone.
# The unit tier runs on every core (pytest-xdist): its tests share nothing.
test-unit: $(VENV)/.installed
	$(BYTECODE)
	$(PYTEST) -m unit -n auto $(PYTEST_ARGS)

# A throwaway PostgreSQL and Redis, the README's prerequisites: no root, no apt.
test-core: $(VENV)/.installed
	$(BYTECODE)
	$(PYTEST) -m 'core and not unit' $(XDIST) $(PYTEST_ARGS)

test-deploy: $(VENV)/.installed
	$(BIN)/python -m devservers.packages test
	$(BYTECODE)
	$(PYTEST) -m 'deploy and not unit' $(XDIST) $(PYTEST_ARGS)

# The fast tier: lint, then the unit tier (docs/testing.md gives its time, as measured).
check: lint test-unit

# ruff, then mypy over app/ (their settings are in pyproject.toml), then
# sqlfluff over the schema and the money rule (.sqlfluff).
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/sqlfluff lint schema.sql money.sql

# The image's (requirements.lock, the runtime alone) and CI's
# (requirements-test.lock, with the test extra), the first constrained by the
# second so that both pin the same versions.
lock: $(VENV)/.installed
	$(UV_COMPILE) --extra test --output-file requirements-test.lock setup.cfg
	$(UV_COMPILE) --constraint requirements-test.lock --output-file requirements.lock setup.cfg

clean:
	rm -rf $(VENV) .run *.egg-info .mypy_cache

bench: $(VENV)/.installed
	$(BIN)/python scripts/bench.py

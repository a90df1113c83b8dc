# The README's two commands. Each sets itself up: venv, packages, servers.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run cluster test lint bench clean

# Reinstall when the package metadata changes.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# exec: make passes a SIGTERM on to run.py (not to a shell), which stops what it started.
run: $(VENV)/.installed
	exec $(BIN)/python scripts/run.py

# haproxy, 3 gunicorn hosts, PgBouncer, PostgreSQL and a Redis Cluster on loopback.
cluster: $(VENV)/.installed
	exec $(BIN)/python scripts/cluster.py

test: $(VENV)/.installed
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .run *.egg-info

bench: $(VENV)/.installed
	$(BIN)/python scripts/bench.py

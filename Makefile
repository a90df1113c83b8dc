# The README's two commands. Each sets itself up: venv, packages, servers.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test bench clean

# Reinstall when the package metadata changes.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(VENV)/.installed
	# exec: a SIGTERM to make reaches run.sh, which stops what it started.
	PATH="$(abspath $(BIN)):$$PATH" exec scripts/run.sh

test: $(VENV)/.installed
	$(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .run *.egg-info

bench: $(VENV)/.installed
	$(BIN)/python scripts/bench.py

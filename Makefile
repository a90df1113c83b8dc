# The README's two commands. Each sets itself up: venv, packages, servers.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# `make lock`'s pip-compile options: hashes, no local paths (find-links, a
# private index), pip and setuptools pinned too.
PIP_COMPILE := $(BIN)/pip-compile --quiet --upgrade --generate-hashes --strip-extras --allow-unsafe \
	--no-emit-find-links --no-emit-index-url

.PHONY: run cluster test lint bench lock clean

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

# Installs the Debian packages the tests need when missing (devservers/packages.py).
test: $(VENV)/.installed
	$(BIN)/python -m devservers.packages test
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check .

# Newest versions within setup.cfg's ranges: the image's (requirements.lock,
# the runtime alone) and CI's (requirements-test.lock, with the test extra),
# the first constrained by the second so that both pin the same versions.
lock: $(VENV)/.installed
	$(PIP_COMPILE) --extra test --output-file requirements-test.lock setup.cfg
	$(PIP_COMPILE) --constraint requirements-test.lock --output-file requirements.lock setup.cfg

clean:
	rm -rf $(VENV) .run *.egg-info

bench: $(VENV)/.installed
	$(BIN)/python scripts/bench.py

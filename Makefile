# Attune developer commands. `make demo` runs the embedded demo; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The suite runs on the local PostgreSQL and Redis unless told otherwise (CI exports its own).
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/attune
REDIS_URL ?= redis://127.0.0.1:6379/15
PYTEST_ARGS ?=

.PHONY: venv demo test lint migrate clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-profiling.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	# The CPU build of PyTorch, for the real profiling target (agent/torch_workload.py) and its test.
	$(PY) -m pip install --quiet -r requirements-profiling.txt
	touch $@

# Embedded zero-setup mode: SQLite file under var/, no Redis needed; web, rounds and three fake-GPU agents.
demo: venv
	env -u DATABASE_URL $(PY) manage.py migrate --noinput
	env -u DATABASE_URL DEBUG=1 $(PY) manage.py demo

lint: venv
	$(VENV)/bin/ruff check .

test: venv lint
	DATABASE_URL=$(DATABASE_URL) REDIS_URL=$(REDIS_URL) $(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var/*.sqlite3 .pytest_cache .ruff_cache

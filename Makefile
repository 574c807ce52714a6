# Attune developer commands. `make demo` runs the embedded demo; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The suite runs on the local PostgreSQL and Redis unless told otherwise (CI exports its own); the
# cache gets a Redis database of its own, since tests clear it.
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/attune
REDIS_URL ?= redis://127.0.0.1:6379/15
CACHE_URL ?= redis://127.0.0.1:6379/13
PYTEST_ARGS ?=
# `make demo PORT=9100`: the demo's web server port on 127.0.0.1.
PORT ?= 8000

.PHONY: venv venv-demo demo test lint migrate clean browser faults dist signin-deps

venv: $(VENV)/.installed $(VENV)/bin/attune

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-ldap.txt requirements-profiling.txt
	$(MAKE) --no-print-directory signin-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	# The CPU build of PyTorch, for the real profiling target (agent/torch_workload.py) and its test.
	$(PY) -m pip install --quiet -r requirements-profiling.txt
	touch $@ $(VENV)/.installed-service

# What the service and its agents need, nothing more (no test tools, no torch): the demo's environment.
# `make venv` (and so `make test`) installs everything on top.
venv-demo: $(VENV)/.installed-service $(VENV)/bin/attune

$(VENV)/.installed-service: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# `.venv/bin/attune`, the command line as installed on a login node (packaging/cli), usable from any
# directory (a job runs where it is submitted from) and reading this checkout's cli/ (editable).
$(VENV)/bin/attune: $(VENV)/.installed-service packaging/cli/pyproject.toml
	$(PY) -m pip install -qq --no-deps --editable ./packaging/cli
	rm -rf packaging/cli/attune_cli.egg-info
	touch $@

# Embedded zero-setup mode: SQLite file under var/, no Redis needed; web, rounds and three fake-GPU agents.
demo: venv-demo
	env -u DATABASE_URL $(PY) manage.py migrate --noinput --verbosity 0
	env -u DATABASE_URL DEBUG=1 $(PY) manage.py demo --addr 127.0.0.1:$(PORT)

# Style and formatting; the import contracts (pyproject.toml [tool.importlinter]: layers, pure core, agent
# and CLI apart); no import circle and no private name imported across files (tests/test_import_graph.py).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) tests/test_import_graph.py

# The suite in two runs: the tests that start no process in TEST_WORKERS pytest-xdist workers (each
# with its own test database and Redis databases: tests/xdist_services.py), then the `serial` ones
# (real service, agent, browser and job processes; tests/conftest.py) one at a time. A run that
# PYTEST_ARGS leaves without tests (exit status 5) is not a failure.
TEST_WORKERS ?= 2
TEST_ENV = DATABASE_URL=$(DATABASE_URL) REDIS_URL=$(REDIS_URL) CACHE_URL=$(CACHE_URL)
test: venv lint browser signin-deps
	$(TEST_ENV) $(PY) -m pytest -p tests.xdist_services -n $(TEST_WORKERS) --dist loadfile --serial exclude \
		$(PYTEST_ARGS) || [ $$? = 5 ]
	$(TEST_ENV) $(PY) -m pytest --serial only $(PYTEST_ARGS) || [ $$? = 5 ]

# Fault tests (docs/faults.md): the service as real processes on a private PostgreSQL and Redis that the
# tests start themselves, then stop, restart and kill. As root, with PostgreSQL's server binaries and
# redis-server; they skip, saying why, elsewhere. DATABASE_URL only configures pytest-django.
faults: venv
	DATABASE_URL=$(DATABASE_URL) REDIS_URL=$(REDIS_URL) CACHE_URL=$(CACHE_URL) \
		$(PY) -m pytest -q -p no:cacheprovider -m faults tests/faults -s $(PYTEST_ARGS)

# The browser tests drive Debian's chromium (playwright's own download needs the internet). Installed
# here when missing and apt-get can run (root); otherwise those tests are skipped, saying why.
browser:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium for the browser tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
		|| (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null); \
	fi

# Sign-in (tests/auth/, docs/auth.md): python-ldap builds against OpenLDAP's and SASL's headers; the tests
# start a private slapd and a real OpenID Connect provider (Node.js's oidc-provider, pinned by
# tests/auth/oidc_provider's lock file). Installed here when missing and apt-get can run (root);
# otherwise python-ldap needs them installed first, and those tests are skipped, saying why.
signin-deps:
	@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		missing=""; \
		[ -f /usr/include/ldap.h ] || missing="$$missing libldap-dev"; \
		[ -f /usr/include/sasl/sasl.h ] || missing="$$missing libsasl2-dev"; \
		[ -x /usr/sbin/slapd ] || missing="$$missing slapd ldap-utils"; \
		command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
		if [ -n "$$missing" ]; then \
			echo "installing$$missing for the sign-in tests"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null \
			|| (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null); \
		fi; \
	fi
	@if [ ! -d tests/auth/oidc_provider/node_modules/oidc-provider ] && command -v npm >/dev/null 2>&1; then \
		echo "installing the OpenID Connect provider for the sign-in tests"; \
		npm ci --prefix tests/auth/oidc_provider --no-audit --no-fund --silent; \
	fi

# The command line and the node agent as wheels in dist/ (packaging/cli, packaging/agent): installable
# with pip or pipx where there is neither Django nor this repository (docs/cli.md, docs/agent.md).
dist: venv-demo
	$(PY) -m pip install --quiet "setuptools>=69"
	mkdir -p dist
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir dist ./packaging/cli ./packaging/agent
	rm -rf packaging/cli/build packaging/agent/build packaging/*/*.egg-info

clean:
	rm -rf $(VENV) var/*.sqlite3 .pytest_cache .ruff_cache

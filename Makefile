# Switchyard: `make demo` runs the stack on embedded defaults, `make test` runs every check.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Two locks: requirements.txt is what the app runs on (the Docker image, `make demo`);
# requirements-dev.txt adds what `make test` runs (pytest, Playwright, moto, ruff, mypy, ...).
# Each stamp is named after its lock's hash, so a changed lock reinstalls.
STAMP := $(VENV)/.installed-runtime-$(shell sha256sum requirements.txt | cut -c1-16)
DEV_STAMP := $(VENV)/.installed-dev-$(shell sha256sum requirements-dev.txt | cut -c1-16)

.PHONY: install install-dev lock demo test lint docs docs-check typecheck typecheck-to-log pytest browser oidc-provider fmt bench-diloco clean focus-validator

install: $(STAMP)

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@rm -f $(VENV)/.installed-runtime-*
	@touch $@

install-dev: $(DEV_STAMP)

$(DEV_STAMP): requirements-dev.txt $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@rm -f $(VENV)/.installed-dev-*
	@touch $@

# Recompiles both locks from requirements.in and requirements-dev.in, keeping every existing pin
# (LOCK_ARGS="--upgrade-package NAME" moves one). pip-compile comes from pip-tools,
# best in a venv of its own: python3.11 -m venv /tmp/piptools && /tmp/piptools/bin/pip install pip-tools
# then make lock LOCK_COMPILER=/tmp/piptools/bin/pip-compile. It writes the CPU wheel's local
# label (torch==2.13.0+cpu); the locks drop it so that a CUDA build of the same release fits too.
LOCK_COMPILER ?= pip-compile
LOCK_FLAGS := --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links --no-emit-trusted-host --annotation-style=line
lock:
	$(LOCK_COMPILER) $(LOCK_FLAGS) $(LOCK_ARGS) --output-file=requirements.txt requirements.in
	$(LOCK_COMPILER) $(LOCK_FLAGS) $(LOCK_ARGS) --output-file=requirements-dev.txt requirements-dev.in
	sed -i -E 's/^(torch==[0-9.]+)\+cpu/\1    /' requirements.txt requirements-dev.txt

# The FinOps focus-validator needs Python >= 3.12 and numpy < 2: its own venv, from its own lock.
FOCUS_VENV := .venv-focus
FOCUS_STAMP := $(FOCUS_VENV)/.installed-$(shell sha256sum requirements-focus.txt | cut -c1-16)
FOCUS_PYTHON ?= $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	if $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then echo $$p; break; fi; done)

focus-validator: $(FOCUS_STAMP)

$(FOCUS_STAMP): requirements-focus.txt
	@if [ -z "$(FOCUS_PYTHON)" ]; then echo "focus-validator needs Python 3.12: install it or set FOCUS_PYTHON" >&2; exit 1; fi
	@test -x $(FOCUS_VENV)/bin/python || $(FOCUS_PYTHON) -m venv $(FOCUS_VENV)
	$(FOCUS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-focus.txt
	@rm -f $(FOCUS_VENV)/.installed-*
	@touch $@

demo: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py demo

MYPY = $(PY) -m mypy stack bench registry billing training inference decisions storage

# The installs run side by side: pip waits on the package index as much as it computes. pip
# byte-compiles what it installs: with PYTHONDONTWRITEBYTECODE set (as on this machine) nothing
# is compiled later, and every worker, helper and command the tests start would compile each
# module it imports anew (tried: 2,277 CPU-s for the suite against 1,248).
# mypy (single-threaded, about a minute) runs beside pytest instead of before it, when it would
# leave one of the 2 cores idle; its report (var/mypy.log) is printed after pytest's.
test:
	@$(MAKE) --no-print-directory -j4 install-dev browser focus-validator oidc-provider
	@$(MAKE) --no-print-directory lint docs-check
	@$(MAKE) --no-print-directory -j2 typecheck-to-log pytest; rc=$$?; \
	  echo "--- mypy"; cat var/mypy.log; exit $$rc

typecheck-to-log: install-dev
	@mkdir -p var
	@$(MYPY) > var/mypy.log 2>&1

lint: install-dev
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache

# The docs site (mkdocs.yml, docs/): `make docs` serves it on http://127.0.0.1:8001 and rebuilds
# it on every save; `make docs-check` builds it with --strict, so a broken link or anchor fails.
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

docs-check: install-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir var/site

typecheck: install-dev
	$(MYPY)

# The browser tests drive Debian's chromium through Playwright (never a downloaded browser).
# As root on Debian it is installed here; elsewhere this says what to run and stops.
browser:
	@if [ -n "$$CHROMIUM_PATH" ] && [ -x "$$CHROMIUM_PATH" ]; then exit 0; fi; \
	if command -v chromium >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
	  echo "The browser tests need Debian's chromium: run 'sudo apt-get install chromium'" \
	       "(or set CHROMIUM_PATH to a Chromium binary), then make test again." >&2; \
	  exit 1; \
	fi

# The SSO test's OpenID provider (tests/oidc_provider, run by node): its npm packages, as locked.
OIDC_PROVIDER_STAMP := tests/oidc_provider/node_modules/.package-lock.json

oidc-provider: $(OIDC_PROVIDER_STAMP)

$(OIDC_PROVIDER_STAMP): tests/oidc_provider/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "The SSO test needs node and npm (Debian: 'sudo apt-get install nodejs npm')" >&2; exit 1; }
	npm ci --prefix tests/oidc_provider --no-audit --no-fund --loglevel=error
	@touch $@

# The suite runs in parallel (pytest-xdist: each worker gets its own test database and Redis
# database); DATABASE_URL / REDIS_URL are used when set, else scripts/with_test_services.sh starts
# a throwaway PostgreSQL and Redis for the run. The 20 slowest tests are listed at the end.
PYTEST_WORKERS ?= 3
# The suite starts a few hundred Python processes (workers, rank helpers, servers, commands), and
# three pytest workers each rewrite every test module's asserts. With PYTHONDONTWRITEBYTECODE set
# (as on this machine and in the Docker image) each of them compiled the project's modules from
# source again, about 1 s of CPU a process: the test run writes __pycache__ (git ignores it).
pytest: export PYTHONDONTWRITEBYTECODE :=
pytest: install-dev focus-validator oidc-provider
	scripts/with_test_services.sh $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=20

fmt: install-dev
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench-diloco: install
	$(PY) manage.py bench diloco --quick --json var/bench-diloco.json

clean:
	rm -rf $(VENV) $(FOCUS_VENV) var

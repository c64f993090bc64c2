# Switchyard: `make demo` runs the stack on embedded defaults, `make test` runs every check.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# The stamp is named after the lock file's hash, so a changed lock reinstalls.
STAMP := $(VENV)/.installed-$(shell sha256sum requirements.txt | cut -c1-16)

.PHONY: install demo test lint typecheck pytest fmt bench-diloco clean

install: $(STAMP)

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py demo

test: install lint typecheck pytest

lint: install
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: install
	$(PY) -m mypy stack billing training inference storage

pytest: install
	$(PY) -m pytest

fmt: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench-diloco: install
	$(PY) manage.py bench diloco --quick --json var/bench-diloco.json

clean:
	rm -rf $(VENV) var

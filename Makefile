# make demo: run the example app.  make test: run the whole test suite.  make faults: the fault suite.
# Both build .venv, install taskq into it and make sure the services they need answer.

PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv services test faults demo lint

venv: $(STAMP)

# Re-installs only when the package metadata changed (or the venv is new).
$(STAMP): setup.cfg setup.py
	@if [ ! -x $(VENV)/bin/pip ] && ! $(PYTHON) -m venv $(VENV); then \
		rm -rf $(VENV); \
		if [ "$$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then \
			echo "venv: $(PYTHON) cannot create virtualenvs; install it with: sudo apt-get install python3-venv" >&2; \
			exit 1; \
		fi; \
		echo "venv: installing python3-venv with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; \
		$(PYTHON) -m venv $(VENV); \
	fi
	$(VENV_PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev,postgres,flask,django]'
	@touch $@

services:
	bash scripts/ensure-services.sh rabbitmq postgres

test: venv services
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# The fault suite alone (tests/faults, docs/reliability.md): a private RabbitMQ node and
# PostgreSQL cluster of its own. TASKQ_FAULT_SEED replays a run, TASKQ_FAULT_SCALE resizes it.
faults: venv services
	TASKQ_FAULTS=1 $(VENV)/bin/pytest -q tests/faults $(PYTEST_ARGS)

demo: venv
	bash scripts/ensure-services.sh rabbitmq
	$(VENV_PYTHON) -m examples.demo

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy taskq

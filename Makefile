# make demo: run the example app (in .venv-demo: taskq alone).  make test: run the whole test
# suite on RabbitMQ 3.10 and 4.3.  make faults: the fault suite. They build .venv, install
# taskq into it and make sure the services they need answer.
#
# Two environments: .venv on the default python3 (the whole suite, with Django 4.2 LTS and
# the django-tasks backport), and .venv-django6 on Python 3.12 or newer (Django 6.1, which
# needs it; only the Django tests run there). make test builds both and says which
# interpreter it could not find.

PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Django 6 environment; DJANGO6_PYTHON=/path/to/python3.12 picks its interpreter.
DJANGO6_VENV := .venv-django6
DJANGO6_STAMP := $(DJANGO6_VENV)/.installed
DJANGO_TESTS := tests/contrib/test_django.py tests/contrib/test_django_tasks.py
PIP_QUIET := --quiet --disable-pip-version-check
# Editable installs as a path in a .pth file, not setuptools' default import hook: type
# checkers (mypy, pyright) do not run import hooks, so with the hook they cannot see taskq
# (and its py.typed) when checking code that uses it.
EDITABLE := --config-settings editable_mode=compat -e
# The brokers make test runs the suite on (scripts/on-brokers.sh): the machine's 3.10 and a
# private 4.3 node (make rabbitmq4). BROKERS=3.10 make test skips the 4.3 node altogether.
BROKERS ?= 3.10 4.3
export BROKERS
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

.PHONY: venv venv-django6 services rabbitmq4 browser slow screenshots test faults cluster demo lint

venv: $(STAMP)

# Re-installs only when the package metadata or this file changed (or the venv is new).
$(STAMP): setup.cfg setup.py Makefile
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
	$(VENV_PYTHON) -m pip install $(PIP_QUIET) $(EDITABLE) '.[dev,postgres,flask,dashboard,django,django-tasks]' \
		'Django>=4.2,<5'
	@touch $@

venv-django6: $(DJANGO6_STAMP)

$(DJANGO6_STAMP): setup.cfg setup.py scripts/find-python.sh Makefile
	@if [ ! -x $(DJANGO6_VENV)/bin/pip ]; then \
		python=$$(bash scripts/find-python.sh 3.12) || exit 1; \
		echo "venv-django6: $$python"; \
		rm -rf $(DJANGO6_VENV); \
		if ! $$python -m venv $(DJANGO6_VENV); then \
			rm -rf $(DJANGO6_VENV); \
			echo "venv-django6: $$python cannot create virtualenvs; install its venv" \
				"module (Debian/Ubuntu: apt-get install python3.12-venv)" >&2; \
			exit 1; \
		fi; \
	fi
	$(DJANGO6_VENV)/bin/python -m pip install $(PIP_QUIET) $(EDITABLE) '.[dev,postgres,django]' \
		'Django>=6.1,<6.2'
	@touch $@

services:
	bash scripts/ensure-services.sh rabbitmq postgres

# The private RabbitMQ 4.3 node (r43@localhost on 127.0.0.1:5673, root /opt/rmq43): built from
# Debian's packages the first time (about a minute), started when it is down; one line and a
# non-zero exit when it cannot be had.
rabbitmq4:
	bash scripts/ensure-rabbitmq4.sh

# Chromium for the dashboard's browser tests (Playwright comes with the dev extra).
browser:
	bash scripts/ensure-browser.sh

# The suite once per broker of BROKERS, each pass headed by the broker's version and the layers
# it runs, then the Django tests again on Django 6.1; every pass runs, and any failure fails
# make test (scripts/on-brokers.sh; which layers run where: docs/rabbitmq.md).
test: venv venv-django6 services $(if $(filter 4.3,$(BROKERS)),rabbitmq4) browser
	PYTEST_ARGS='$(PYTEST_ARGS)' DJANGO_TESTS='$(DJANGO_TESTS)' bash scripts/on-brokers.sh

# The slow tests alone (marker slow: kill tests, several real workers, the browser); make
# test skips them unless TASKQ_SLOW=1, as CI (.ci/run) sets.
slow: venv services browser
	TASKQ_SLOW=1 $(VENV)/bin/pytest -q -m slow $(PYTEST_ARGS)

# Retake the dashboard screenshots of docs/dashboard.md (docs/images/), then commit them.
screenshots: venv services browser
	TASKQ_SLOW=1 TASKQ_SCREENSHOTS=1 $(VENV)/bin/pytest -q tests/browser $(PYTEST_ARGS)

# The fault suite alone (tests/faults, docs/reliability.md): a private RabbitMQ node and
# PostgreSQL cluster of its own. TASKQ_FAULT_SEED replays a run, TASKQ_FAULT_SCALE resizes it.
# Every scenario: 8 of the 14 are also marked slow. Private nodes are the machine's RabbitMQ;
# TASKQ_TEST_RABBITMQ_ROOT=/opt/rmq43 (after make rabbitmq4) takes them from the 4.3 root.
faults: venv services
	TASKQ_SLOW=1 TASKQ_FAULTS=1 $(VENV)/bin/pytest -q tests/faults $(PYTEST_ARGS)

# The cluster tests alone (tests/cluster, docs/cluster.md): a private 3-node RabbitMQ cluster.
cluster: venv services
	TASKQ_SLOW=1 TASKQ_CLUSTER=1 $(VENV)/bin/pytest -q tests/cluster $(PYTEST_ARGS)

# The demo's own environment: taskq alone, no extras or test tools (SQLite and RabbitMQ).
$(DEMO_STAMP): setup.cfg setup.py
	@[ -x $(DEMO_VENV)/bin/pip ] || $(PYTHON) -m venv $(DEMO_VENV) || { rm -rf $(DEMO_VENV); \
		echo "demo: $(PYTHON) cannot create virtualenvs; install its venv module" \
			"(Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
	$(DEMO_VENV)/bin/python -m pip install $(PIP_QUIET) -e .
	@touch $@

demo: $(DEMO_STAMP)
	bash scripts/ensure-services.sh rabbitmq
	$(DEMO_VENV)/bin/python -m examples.demo

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy taskq

# django-idempotency: make run (the example API on SQLite), make test (the whole suite),
# make matrix (a smoke subset on the other supported Python, Django and DRF versions),
# make bench (every benchmark, short).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

# Python writes its bytecode (and pytest its rewritten test modules) to __pycache__ even where
# the environment says not to: the suite starts dozens of Python processes (xdist workers,
# app servers, Celery workers, manage.py and pytest subprocesses), and each one compiled the
# package, the tests and pytest's plugins anew (collecting the suite without coverage: 12 s
# of CPU uncached, 4 s cached)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test stress-test matrix lint typecheck docs bench clean services browser pgbouncer faketime valgrind gettext messages mariadb-dev model

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.example: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[example]"
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python mariadb-dev
	$(BIN)/pip install -q -e ".[test,lint,docs,dev]"
	touch $@

## Serve the example payments API on SQLite at http://$(HOST):$(PORT)/api/charges/
run: $(VENV)/.example
	$(BIN)/python manage.py migrate --noinput -v 0
	$(BIN)/python manage.py seed_demo
	$(BIN)/gunicorn example_project.wsgi --bind $(HOST):$(PORT) --workers 2 --worker-class gthread --threads 4 --access-logfile -

## Install the test dependencies and run every test (PostgreSQL, MariaDB, Redis, Celery and browser tests
## included), with the package's branch coverage (the floor is in pyproject.toml; for a few
## tests alone, drop it: make test COVERAGE= PYTEST_ARGS=tests/test_conf.py)
## The suite runs in $(WORKERS) worker processes (pytest-xdist), a test module to a worker, two
## per core here: most tests wait on servers, threads and sleeps rather than the CPU (in a quiet
## run on 2 cores the workers and their children used 692 s of CPU in 1,583 s of tests);
## WORKERS=0 runs in this process.
COVERAGE ?= --cov=django_idempotency --cov-branch --cov-report=term-missing:skip-covered
WORKERS ?= 4
test: $(VENV)/.test browser pgbouncer faketime valgrind gettext
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope --durations=15 $(COVERAGE) $(PYTEST_ARGS)

## The whole suite $(STRESS_RUNS) times in a row, each in a random order, beside two CPU-bound
## processes per core: the proof that no test depends on the machine's speed or on the tests'
## order. pytest-randomly prints each run's seed first; replay that order with
## make stress-test STRESS_RUNS=1 PYTEST_ARGS=--randomly-seed=N
STRESS_RUNS ?= 3
stress-test: $(VENV)/.test browser pgbouncer faketime valgrind gettext
	@hogs=""; for i in $$(seq $$(( $$(nproc) * 2 ))); do \
		( trap 'exit 0' TERM; while :; do :; done ) & hogs="$$hogs $$!"; done; \
	trap 'kill $$hogs 2>/dev/null' EXIT INT TERM; \
	for run in $$(seq $(STRESS_RUNS)); do \
		echo "stress-test: run $$run of $(STRESS_RUNS), load $$(cut -d' ' -f1 /proc/loadavg)"; \
		started=$$(date +%s); \
		$(BIN)/python -m pytest -n $(WORKERS) --dist loadscope -p randomly --randomly-dont-reset-seed $(PYTEST_ARGS) || exit 1; \
		echo "stress-test: run $$run passed in $$(( $$(date +%s) - started )) s"; \
	done

## The version matrix (noxfile.py): the smoke subset on every supported combination of Python
## 3.11-3.13, Django 5.2 and 6.0, and DRF 3.15 and the newest, but the main one that `make test`
## runs; one reused venv each under .nox/, packages from PyPI. The interpreters are pyenv's
## when pyenv is there (else python3.11, python3.12, python3.13 on PATH). One combination:
## make matrix NOX_ARGS="-s \"smoke(python='3.12', django='6.0', drf='latest')\""
PYENV_BINS := $(shell r=$$(pyenv root 2>/dev/null) && for v in 3.11 3.12 3.13; do \
	ls -d $$r/versions/$$v.*/bin 2>/dev/null | sort -V | tail -n 1; done | tr '\n' ':')
matrix: $(VENV)/.test
	PATH="$(PYENV_BINS)$$PATH" $(BIN)/nox -r $(NOX_ARGS)

## The Promela model of the claim protocol (model/protocol.pml), checked by Debian's Spin in
## every configuration of model/configurations: an exhaustive search each, built in a temporary
## directory; fails on any counterexample or a search cut short (docs/how-it-works.md, "What the
## model proves"). One configuration: make model MODEL_ARGS=hybrid
model:
	@command -v spin >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq spin) >/dev/null 2>&1 || echo "could not install spin"; }
	model/check.sh $(MODEL_ARGS)

## Debian's Chromium for the Playwright tests (the Playwright browser download is not used)
browser:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "could not install chromium"; }

## Debian's PgBouncer for the tests behind a transaction pooler (each test runs its own
## pgbouncer process on a free port; the package's service is not used)
pgbouncer:
	@command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq pgbouncer) >/dev/null 2>&1 || echo "could not install pgbouncer"; }

## Debian's libfaketime for the tests of an app server whose clock is off (a subprocess
## run with LD_PRELOAD of libfaketime.so.1 and FAKETIME="-90s"; the database's clock is real)
faketime:
	@ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq faketime) >/dev/null 2>&1 || echo "could not install faketime"; }

## Debian's valgrind (with callgrind.h) for the instruction counts of the benchmarks
## (python -m benchmarks budget, cpu --instructions) and the test that runs the budget
valgrind:
	@[ -f /usr/include/valgrind/callgrind.h ] || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq valgrind) >/dev/null 2>&1 || echo "could not install valgrind"; }

## Debian's GNU gettext (msgfmt, xgettext, msgmerge): Django's makemessages and
## compilemessages run it, and tests/test_locale.py checks the catalogs with it
gettext:
	@command -v msgfmt >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq gettext) >/dev/null 2>&1 || echo "could not install gettext"; }

## The translation catalogs after a change of a marked string: every locale's django.po
## updated from the package's strings (new ones empty, removed ones dropped), then compiled
## to django.mo. Translate the new entries, run it again, and commit both files.
messages: $(VENV)/.test gettext
	cd django_idempotency && $(abspath $(BIN))/django-admin makemessages --all --add-location=file --no-obsolete
	cd django_idempotency && $(abspath $(BIN))/django-admin compilemessages

## Debian's pkg-config and MariaDB client headers, which pip needs to build mysqlclient (the
## test extra's driver for the MariaDB tests) from source
mariadb-dev:
	@pkg-config --exists libmariadb 2>/dev/null || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq pkg-config libmariadb-dev) >/dev/null 2>&1 || echo "could not install libmariadb-dev"; }

## The pre-commit hooks on every file (.pre-commit-config.yaml): whitespace, YAML and TOML,
## django-upgrade, ruff check and format, mypy over the package, the tests and the benchmarks.
## They call the tools in $(VENV), so it goes first on PATH.
lint: $(VENV)/.test
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pre-commit run --all-files --show-diff-on-failure

$(VENV)/.docs: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[docs]"
	touch $@

## The documentation site, checked against the code (mkdocs build --strict); installs only
## the docs extra, as Read the Docs does
docs: $(VENV)/.docs
	$(BIN)/mkdocs build --strict

## Every measure of benchmarks/ in its short mode (python -m benchmarks all --quick: a few
## minutes), each against a baseline of the same run. PostgreSQL on 127.0.0.1:5432; Redis is a
## private redis-server per run. One measure in full: $(BIN)/python -m benchmarks cpu
## (the measures, their full modes and the conditions: docs/benchmarks.md)
bench: $(VENV)/.test valgrind
	@command -v wrk >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ (apt-get update -qq && apt-get install -y -qq wrk) >/dev/null 2>&1 || echo "could not install wrk"; }
	$(BIN)/python -m benchmarks all --quick

clean:
	rm -rf $(VENV) .nox dist site build *.egg-info example_project/db.sqlite3*

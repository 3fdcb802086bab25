# Trainyard: `make run` serves the dashboard, `make test` runs every test. Both set up what they need.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
export PYTORCH_NVML_BASED_CUDA_CHECK := 1

.PHONY: setup run test test-fast lint docs screenshots worker clean

# The local dashboard: DEBUG (its pages and tracebacks), a development key, local host names,
# plain HTTP. Off unless asked for (dashboard/settings.py): a production install sets SECRET_KEY
# and ALLOWED_HOSTS instead, and runs its commands itself (docs/guides/production.md). The tests ask
# for it by themselves (tests/settings.py).
setup run worker: export TRAINYARD_DEBUG ?= 1

$(VENV)/.installed: pyproject.toml .ci/pip_parallel.py
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: Trainyard needs Python 3.11"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# --no-compile, then compileall on every core: pip byte-compiles what it installs one file at
	@# a time (30 of its 120 s here), compileall -j 0 in 21 s on 2 cores. Compiled they must be:
	@# where PYTHONDONTWRITEBYTECODE is set (this machine, Docker images) no process writes them,
	@# and each would compile torch afresh. compileall's one failure is a file of Python 3.12
	@# syntax among torch's test helpers, which pip skips alike.
	@# The wheels are unpacked by a pip process per core (.ci/pip_parallel.py: 64 s, not 85 s).
	$(PY) .ci/pip_parallel.py -e '.[dev]'
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --no-compile --no-build-isolation 'deepspeed==0.19.8'
	@# DeepSpeed pulls in `ninja` (the build tool), whose Python package has the import name of
	@# django-ninja's and overwrites its __init__.py: put django-ninja's files back (the build
	@# tool's binary in .venv/bin/ninja is untouched, and nothing imports its module).
	$(PY) -m pip install --quiet --no-compile --no-deps --force-reinstall "$$(grep -o 'django-ninja==[0-9.]*' pyproject.toml)"
	$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	touch $@

setup: $(VENV)/.installed
	$(PY) manage.py migrate --noinput -v 0

# `make run` keeps its terminal for what a person acts on: the address, the admin's first login,
# warnings and errors. `make run VERBOSE=1` (or VERBOSE=1 in the environment) shows as well the
# services' banners, every task (the lost-run sweep's, every 10 s) and every request. The
# Procfile's own defaults are the verbose ones (a `honcho start` of its own shows everything).
VERBOSE ?=
RUN_LOGS = $(if $(VERBOSE),SERVICES_VERBOSITY=1 CELERY_QUIET= CELERY_LOG_LEVEL=INFO LOG_LEVEL=INFO,\
  SERVICES_VERBOSITY=0 CELERY_QUIET=--quiet CELERY_LOG_LEVEL=WARNING LOG_LEVEL=WARNING)

run:
	@.ci/system-packages run
	@$(MAKE) --no-print-directory setup
	@$(PY) manage.py ensure_admin
	@echo "Trainyard: http://127.0.0.1:$(PORT)/  (Ctrl-C stops everything; make run VERBOSE=1 says more)"
	@$(RUN_LOGS) WEB_PORT=$(PORT) $(VENV)/bin/honcho -f Procfile start

worker: setup
	$(VENV)/bin/celery -A dashboard worker --loglevel INFO

# Tests that need a missing tool fail instead of skipping (tests/conftest.py's need()). Two passes:
# every test on SQLite (the embedded default) but those marked postgres_only, then every test that
# opens the database, but those marked sqlite_only, on a PostgreSQL server the tests start
# themselves (tests/conftest.py's --database); docs/development.md's table says which and why. One alone:
# `.venv/bin/pytest -m "not postgres_only"` or `.venv/bin/pytest --database=postgres`.
# Each pass prints its 25 slowest tests, its 25 that took the most CPU (their processes' and
# children's: tests/cpu_times.py), how busy the cores were, and its wall time (a test over 2
# minutes says why in its docstring). Each runs in two pytest-xdist workers, a test file to a
# worker (its module's stack and machines stay together): most of the stack's tests wait on
# heartbeats, rendezvous and process start-up, so a pass takes about half its one-process time on
# 2 cores. Four workers were tried (2026-12-04): the 2 cores sat at 100% from the pass's first
# minute and it went no faster, so the pass is bound by the CPU its trainings take, not by
# waiting. Every worker has its own home,
# test database, ports and namespace names (tests/conftest.py, tests/netns.py).
TEST_WORKERS ?= 2
# The files go longest first (tests/file_order.py, from tests/durations.json), not xdist's
# most-tests-first, so that both workers end together.
XDIST = --dist loadfile --no-loadscope-reorder
# pytest rewrites the asserts of the test files and of its plugins' packages (schemathesis,
# hypothesis, anyio: 376 modules) in every process it starts, and caches the result only where
# bytecode may be written: where PYTHONDONTWRITEBYTECODE is set (this machine, Docker images)
# that was 4 CPU-s of each worker's collection, every run. An empty value unsets it for pytest
# and what the tests start (runs, the stack's servers): they write __pycache__ folders, which
# git ignores.
PYTEST = PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest
# make test's passes: every fuzzer draws all its examples here (tests/test_fuzz.py).
PYTEST_TIMED = TRAINYARD_TESTS_NEED_ALL=1 TRAINYARD_FUZZ_SHARE=1 $(PYTEST) -n $(TEST_WORKERS) \
  $(XDIST) --durations=25 --durations-min=1

test:
	@start=$$(date +%s); .ci/system-packages test && $(MAKE) --no-print-directory setup; rc=$$?; \
	  echo "make test: set-up took $$(( $$(date +%s) - start )) s"; exit $$rc
	@start=$$(date +%s); $(PYTEST_TIMED) -m "not postgres_only"; rc=$$?; \
	  echo "make test: the SQLite pass took $$(( $$(date +%s) - start )) s"; exit $$rc
	@start=$$(date +%s); $(PYTEST_TIMED) --database=postgres; rc=$$?; \
	  echo "make test: the PostgreSQL pass took $$(( $$(date +%s) - start )) s"; exit $$rc
	@start=$$(date +%s); $(MAKE) --no-print-directory lint; rc=$$?; \
	  echo "make test: lint took $$(( $$(date +%s) - start )) s"; exit $$rc

# The inner loop, before every commit (meant for at most 3 minutes on an idle 2-core machine):
# every test but the stack's, the browser's and the machines' (tests/kinds.py marks them by the
# fixtures they use, `integration` ones by hand), on SQLite, two pytest workers at once
# (pytest-xdist), each with its own home and test database (tests/conftest.py). The fuzzers
# draw a fifth of their examples here (tests/test_fuzz.py), all of them in make test.
FAST_TESTS = not integration and not stack and not browser and not machines and not slow

test-fast: $(VENV)/.installed
	@start=$$(date +%s); TRAINYARD_FUZZ_SHARE=0.2 $(PYTEST) -n 2 $(XDIST) -m "$(FAST_TESTS)" \
	  --durations=10 --durations-min=5; rc=$$?; \
	  echo "make test-fast took $$(( $$(date +%s) - start )) s"; exit $$rc

lint: docs
	$(VENV)/bin/ruff check . .ci/gpu-check
	$(VENV)/bin/ruff format --check . .ci/gpu-check
	$(VENV)/bin/mypy training dashboard trainyard .ci/gpu-check
	$(VENV)/bin/lint-imports --no-cache

# The documentation site (mkdocs.yml, docs/) into site/. --strict: a broken link, a missing page
# or anchor fails it, so make lint runs it.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The docs' pictures (docs/images/), taken again by the browser tests that show those pages
# (tests/docs_screenshots.py; the tests marked docs_screenshots), to commit with the change that
# moved the pages.
screenshots: $(VENV)/.installed
	TRAINYARD_DOCS_SCREENSHOTS=1 $(PYTEST) -p no:xdist -m docs_screenshots

clean:
	rm -rf $(VENV) var staticfiles site

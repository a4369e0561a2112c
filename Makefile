# slurmhealth: `make demo` and `make test` work on a fresh Debian 12 machine as root.
SHELL := /bin/bash
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $(HOME)/.pyenv)
PY311 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.11*/bin/python3) $(shell command -v python3.11 python3 2>/dev/null))
PY39 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.9*/bin/python3) $(shell command -v python3.9 2>/dev/null))
VENV := .venv
VENV39 := .venv39
VENVB := .venv-bench
SOURCES := $(shell find slurmhealth -name '*.py' -o -name '*.html' -o -name '*.md')

.PHONY: demo test test-fast test-py39 lint bench deps clean package

deps:
	@bash scripts/install-deps

$(VENV)/.installed: setup.cfg pyproject.toml
	@bash scripts/install-deps
	$(PY311) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

$(VENV39)/.installed: setup.cfg pyproject.toml
	@if [ -z "$(PY39)" ]; then echo "Python 3.9 not found (pyenv install 3.9 or set PY39=...)"; exit 1; fi
	$(PY39) -m venv $(VENV39)
	$(VENV39)/bin/pip install -q --upgrade pip
	$(VENV39)/bin/pip install -q -e '.[test]'
	touch $@

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check slurmhealth tests bench

test: $(VENV)/.installed lint
	$(VENV)/bin/python -m pytest
	@$(MAKE) --no-print-directory test-py39

# The edit-test loop: everything but the tests marked `real` (a real Slurm, MariaDB, Chromium,
# tmpfs, package builds) or `slow`; under 2 minutes on 2 cores. `make test` and CI run them all.
test-fast: $(VENV)/.installed lint
	$(VENV)/bin/python -m pytest -q -m "not real and not slow" -p no:cacheprovider

test-py39:
	@if [ -z "$(PY39)" ] && [ -z "$$CI" ]; then echo "SKIP Python 3.9: not installed"; exit 0; fi; \
	$(MAKE) --no-print-directory $(VENV39)/.installed && $(VENV39)/bin/python -m pytest -q -p no:cacheprovider

demo: $(VENV)/.installed
	@bash scripts/demo
	@$(VENV)/bin/python scripts/demo-fleet
	@$(VENV)/bin/python scripts/demo-slurm
	@$(VENV)/bin/python scripts/demo-report

# A regular (non-editable) install, as on a cluster node: the editable finder alone costs ~12 ms
# of interpreter start-up and would blur every figure.
$(VENVB)/.installed: setup.cfg pyproject.toml $(SOURCES)
	@bash scripts/install-deps
	rm -rf $(VENVB)
	$(PY311) -m venv $(VENVB)
	$(VENVB)/bin/pip install -q .
	touch $@

bench: $(VENVB)/.installed
	$(VENVB)/bin/python bench/bench_check.py
	$(VENVB)/bin/python bench/bench_hook.py
	$(VENVB)/bin/python bench/bench_faults.py
	$(VENVB)/bin/python bench/bench_fleet.py
	$(VENVB)/bin/python bench/bench_report.py
	$(VENVB)/bin/python bench/validate_lemons.py
	$(VENVB)/bin/python bench/validate_slow.py

# The .deb and the .rpm, built offline from a copy of the tree (docs/packaging.md).
package:
	@bash scripts/install-deps
	bash packaging/build-packages dist

clean:
	rm -rf $(VENV) $(VENV39) $(VENVB) build dist *.egg-info demo-out

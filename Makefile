# slurmhealth: `make demo` and `make test` work on a fresh Debian 12 machine as root.
SHELL := /bin/bash
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $(HOME)/.pyenv)
PY311 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.11*/bin/python3) $(shell command -v python3.11 python3 2>/dev/null))
PY39 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.9*/bin/python3) $(shell command -v python3.9 2>/dev/null))
PY312 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.12*/bin/python3) $(shell command -v python3.12 2>/dev/null))
PY313 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.13*/bin/python3) $(shell command -v python3.13 2>/dev/null))
VENV := .venv
VENV39 := .venv39
VENVB := .venv-bench
SOURCES := $(shell find slurmhealth -name '*.py' -o -name '*.html' -o -name '*.md')

.PHONY: demo test test-fast test-py311 test-py39 test-py312 test-py313 sdist lint bench deps clean package man completion

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

# ruff, then mypy on the package as setup.cfg's [mypy] sets it (core/ and node/ strict).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check slurmhealth sim tests bench
	$(VENV)/bin/mypy

# Everything on 3.11 and 3.9, the fast subset on 3.12 and 3.13, the four at once. On 3.9 two
# kinds are left out: the fleet tests' PostgreSQL twins (the backend's own tests,
# tests/fleet/test_pgstore.py, run there) and the package builds, whose subject does not depend
# on the suite's Python (the sdist is still built and installed there). Every lab, store and
# browser profile lives in a temporary directory of its own, on ports picked free. The two whole
# suites run their files on two workers each (pytest-xdist, a file's tests on one worker, in
# order): alone, a suite's real tests waited on Slurm, MariaDB and Chromium for 10 of its 14
# minutes at half a core, one test file after another. Each suite's output comes whole when it
# ends (--output-sync).
test: $(VENV)/.installed lint
	@$(MAKE) --no-print-directory -j4 --output-sync=target test-py311 test-py39 test-py312 test-py313

# The longest suite names its 25 slowest tests: CI's log shows where the time goes.
test-py311: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --durations=25

# The edit-test loop: everything but the tests marked `real` (a real Slurm, MariaDB, Chromium,
# tmpfs, package builds) or `slow`, on two workers; about 2 minutes on 2 cores. `make test` and
# CI run them all.
test-fast: $(VENV)/.installed lint
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile -m "not real and not slow" -p no:cacheprovider

test-py39:
	@if [ -z "$(PY39)" ] && [ -z "$$CI" ]; then echo "SKIP Python 3.9: not installed"; exit 0; fi; \
	$(MAKE) --no-print-directory $(VENV39)/.installed && $(VENV39)/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not twin and not once"

# The fast subset on the newer Pythons setup.cfg names (3.11 and 3.9 run everything above): a venv
# each, .venv312 and .venv313. A Python that is not installed is skipped, except under CI.
.venv3%/.installed: setup.cfg pyproject.toml
	@if [ -z "$(PY3$*)" ]; then echo "Python 3.$* not found (pyenv install 3.$* or set PY3$*=...)"; exit 1; fi
	$(PY3$*) -m venv .venv3$*
	.venv3$*/bin/pip install -q --upgrade pip
	.venv3$*/bin/pip install -q -e '.[test]'
	touch $@

test-py312 test-py313: test-py3%:
	@if [ -z "$(PY3$*)" ] && [ -z "$$CI" ]; then echo "SKIP Python 3.$*: not installed"; exit 0; fi; \
	$(MAKE) --no-print-directory .venv3$*/.installed && \
	.venv3$*/bin/python -m pytest -q -m "not real and not slow" -p no:cacheprovider

# The demo's own needs only: Python's venv, and Slurm + munge for its local Slurm
# (scripts/install-deps --demo names them before installing); no test tools.
$(VENV)/.demo: setup.cfg pyproject.toml
	@bash scripts/install-deps --demo
	@test -x $(VENV)/bin/python || $(PY311) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e .
	touch $@

demo: $(VENV)/.demo
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
	$(VENVB)/bin/python bench/bench_scale.py
	$(VENVB)/bin/python bench/bench_report.py
	$(VENVB)/bin/python bench/bench_publish.py
	$(VENVB)/bin/python bench/validate_lemons.py
	$(VENVB)/bin/python bench/validate_slow.py
	$(VENVB)/bin/python bench/validate_trends.py --seeds 2
	$(VENVB)/bin/python bench/validate_drift.py --seeds 20
	$(VENVB)/bin/python bench/validate_heldback.py --seeds 8

# Man pages (slurmhealth.1 and one per command) from the commands' own help, into build/man; the
# packages install them from there. Completion files are kept in packaging/completion/ and a test
# fails when they no longer match the commands: `make completion` writes them again.
man: $(VENV)/.installed
	$(VENV)/bin/python scripts/cli-docs man build/man

completion: $(VENV)/.installed
	$(VENV)/bin/python scripts/cli-docs completion packaging/completion

# The source release the README's pip install names: dist/slurmhealth-X.Y.Z.tar.gz (MANIFEST.in
# says what it holds; it is also the RPM spec's Source0).
sdist: $(VENV)/.installed
	$(VENV)/bin/python -m build --sdist --outdir dist .

# The .deb and the .rpm, built offline from a copy of the tree (docs/packaging.md).
package:
	@bash scripts/install-deps
	bash packaging/build-packages dist

clean:
	rm -rf $(VENV) $(VENV39) .venv312 .venv313 $(VENVB) build dist *.egg-info demo-out
